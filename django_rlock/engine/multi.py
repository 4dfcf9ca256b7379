"""MultiLock and RedLock: one lock made of ``RLock``s on several independent Redis servers.

``MultiLock`` is all-or-nothing: it holds when every member holds, as Redisson's
RedissonMultiLock. ``RedLock`` holds when a majority (N // 2 + 1) does, as the Redlock
algorithm and Redisson's RedissonRedLock. Both are built on the members' own acquire, wait,
renewal and release: no second wait loop, no second watchdog (a member in watchdog mode is
renewed by the process watchdog like any lock). The asyncio twins are in ``aiomulti``.

Only a refusal (a member held elsewhere) is waited out. A member's error (its server down, a
wrong password, WRONGTYPE at the key) is no refusal: once errors leave too few members to
hold (MultiLock: one; RedLock: more than a minority), the acquire releases what it took and
raises the error, where Redisson counts it as "not acquired" and ``lock()`` spins on, silent.

RedLock's safety is contested: a process paused (GC, swap) past its lease, or clocks that jump,
can let two holders believe they hold it (Martin Kleppmann, "How to do distributed locking",
2016). Redisson deprecated it in favour of one lock with replica sync (``sync_replicas``) or a
fenced lock. It is offered because people ask for it; prefer ``RLock`` with replica sync.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from redis.exceptions import RedisError

from .errors import LockError, LockNotOwnedError
from .lock import RLock, check_seconds
from .scripts import RENEW_SCRIPT, call_once
from .watchdog import watchdog

#: Seconds a ``lock()`` gives each member per round before letting go of all and starting over
#: (so two MultiLocks over the same members never wait on each other forever).
ROUND_PER_MEMBER = 1.5
#: The least a RedLock member is given of the budget (Redisson: 1 ms): enough for a wake-up.
MIN_MEMBER_WAIT = 0.01
#: A member's failures (a server down, a wrong password, WRONGTYPE, a replica short), as
#: against a refusal (held elsewhere, ``False``): an acquire waits out refusals only.
MEMBER_ERRORS = (RedisError, LockError, OSError)


class MultiLockError(LockError):
    """Releasing some members failed; ``failures`` maps a member's index to its exception."""

    def __init__(self, message: str, name: str, failures: dict[int, BaseException]) -> None:
        super().__init__(message, name)
        self.failures = failures


class MultiLock:
    """All-or-nothing over ``RLock``s that may live on different servers; the ``RLock`` API.

    Members are taken in the order given, within the wait budget; if one is held elsewhere,
    those already taken are released and the attempt starts over from the first while budget
    remains. A member that fails (an error, not a refusal) ends the acquire: what was taken is
    released and its error raised, unchanged, noted with the member (``_failed``). With a
    lease, every member gets it from the moment the whole lock is held. ``is_lost()`` turns
    True (and ``on_lost(name)`` is called once) when a member's hold is lost.
    """

    _member_type: type = RLock

    def __init__(self, *locks: Any, on_lost: Callable[[str], Any] | None = None) -> None:
        kind = type(self).__name__
        if not locks:
            raise ValueError(f"{kind} needs at least one lock")
        for lock in locks:
            if not isinstance(lock, self._member_type):
                raise TypeError(f"{kind} members must be {self._member_type.__name__}s, not "
                                f"{type(lock).__name__}")
        where = [(lock.server, lock.key) for lock in locks]
        if len(set(where)) != len(where):
            raise ValueError(f"{kind} has the same lock twice (one key on one server): "
                             f"{[lock.key for lock in locks]}")
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable ({kind})")
        self.locks = tuple(locks)
        names = {lock.name for lock in locks}
        keys = {lock.key for lock in locks}
        #: The members' name (one name on N servers, the usual case), else a composite.
        self.name = names.pop() if len(names) == 1 else (
            f"{kind}({', '.join(lock.name for lock in locks)})")
        self.key = keys.pop() if len(keys) == 1 else self.name
        self.label = locks[0].label
        self._on_lost = on_lost
        # Renewals run on one pool thread per server: two members may be found lost at once.
        self._lost_guard = threading.Lock()
        self._lost_members: set[int] = set()
        for i, lock in enumerate(locks):
            lock._on_lost = self._chain(i, lock._on_lost)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} over {len(self.locks)} servers>"

    # -- what differs between MultiLock and RedLock --------------------------------------
    @property
    def quorum(self) -> int:
        """Members that must hold for the whole lock to hold."""
        return len(self.locks)

    def _member_wait(self, remaining: float) -> float:
        return remaining

    def _still_valid(self, start: float, lease: float | None) -> bool:
        return True

    # -- acquiring ------------------------------------------------------------------------
    def lock(self, lease_time: float | None = None) -> None:
        """Block until every member is held. ``lease_time``: seconds; None: watchdog mode."""
        lease = self._lease(lease_time)
        while not self._acquire(ROUND_PER_MEMBER * len(self.locks), lease):
            pass

    def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        """Try for up to ``wait_time`` seconds (0: one attempt per member)."""
        wait = check_seconds(wait_time, "wait_time", self.name, zero_ok=True)
        return self._acquire(wait, self._lease(lease_time))

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """``threading.RLock.acquire`` semantics (watchdog mode)."""
        if not blocking:
            if timeout != -1:
                raise ValueError(f"can't specify a timeout for a non-blocking call ({self!r})")
            return self.try_lock()
        if timeout == -1:
            self.lock()
            return True
        return self.try_lock(timeout)

    def _lease(self, lease_time: float | None) -> float | None:
        if lease_time is None:
            return None
        return check_seconds(lease_time, "lease_time", self.name, zero_ok=False)

    @staticmethod
    def _member_lease(lease: float | None, wait: float) -> float | None:
        # Members taken first must not expire while later ones are awaited (Redisson: 2x wait);
        # cut to ``lease`` once all are held.
        return None if lease is None else max(lease, 2 * wait)

    def _acquire(self, wait: float, lease: float | None) -> bool:
        deadline = time.monotonic() + wait
        member_lease = self._member_lease(lease, wait)
        allowed = len(self.locks) - self.quorum
        while True:
            start = time.monotonic()
            taken: list[RLock] = []
            errors: dict[int, BaseException] = {}
            failed = 0
            try:
                for i, lock in enumerate(self.locks):
                    remaining = max(0.0, deadline - time.monotonic())
                    try:
                        ok = lock.try_lock(self._member_wait(remaining), member_lease)
                    except MEMBER_ERRORS as exc:  # a failure: a quorum tolerates a minority
                        errors[i] = exc
                        ok = False
                    if ok:
                        taken.append(lock)
                    else:
                        failed += 1
                        if failed > allowed:
                            break
                if len(errors) > allowed:
                    raise self._failed(errors)  # no wait mends it: released below
                if len(taken) >= self.quorum and self._still_valid(start, lease):
                    if lease is not None and member_lease != lease:
                        self._set_lease(taken, lease)
                    with self._lost_guard:
                        self._lost_members.clear()
                    return True
            except BaseException:
                self._release(taken)  # interrupted: nothing may stay held
                raise
            self._release(taken)
            now = time.monotonic()
            if wait == 0 or now >= deadline:
                return False
            # A member refused at once (or a minority down) must not make this a busy loop.
            time.sleep(min(deadline - now, random.uniform(0.005, 0.05)))

    @staticmethod
    def _lease_targets(taken: list[Any], lease: float) -> list[tuple[Any, tuple[str, int]]]:
        """(member, RENEW args) for the members whose TTL is cut to ``lease``: not a reentry
        into a watchdog-mode hold (its renewal keeps it; a cut would lose it)."""
        ms = max(1, math.ceil(lease * 1000))
        out = []
        for lock in taken:
            owner = lock.current_owner()
            hold = watchdog().get((lock.server, lock.key, owner))
            if hold is None or not hold.renew:
                out.append((lock, (owner, ms)))
        return out

    @classmethod
    def _set_lease(cls, taken: list[RLock], lease: float) -> None:
        for lock, args in cls._lease_targets(taken, lease):
            try:  # only if still ours (RENEW checks the owner): never another holder's TTL
                call_once(lock.client, RENEW_SCRIPT, (lock.key,), args)
            except RedisError:
                pass  # it keeps the longer acquisition lease

    def _failed(self, errors: dict[int, BaseException]) -> BaseException:
        """What an acquire raises when members' errors, not refusals, leave too few to hold:
        the first error unchanged, so a caller (and the Django glue's 503) tells "unreachable"
        from "busy" as for one RLock, with a note naming every failed member."""
        i, first = next(iter(errors.items()))
        others = {j: e for j, e in errors.items() if j != i}
        first.add_note(f"{self!r} was not acquired (what it took was released): its member {i} "
                       f"{self.locks[i].name!r} failed with this error"
                       + (f"; so did {self._describe(others)}" if others else ""))
        return first

    def _describe(self, failures: dict[int, BaseException]) -> str:
        return ", ".join(f"member {i} {self.locks[i].name!r} ({type(e).__name__}: {e})"
                         for i, e in failures.items())

    @staticmethod
    def _release(taken: list[RLock]) -> None:
        for lock in reversed(taken):
            try:
                lock.unlock()
            except MEMBER_ERRORS:
                pass  # it expires by its lease

    # -- releasing ------------------------------------------------------------------------
    def unlock(self) -> None:
        """Release every member (each is tried); then raise if any failed.

        ``LockNotOwnedError`` if the caller held none; ``MultiLockError`` (with ``failures``,
        naming the members) if some could not be released.
        """
        self._raise_for(self._unlock_all())

    release = unlock

    def _unlock_all(self) -> dict[int, BaseException]:
        """Unlock every member; the failures by member index."""
        failures: dict[int, BaseException] = {}
        for i, lock in enumerate(self.locks):
            try:
                lock.unlock()
            except MEMBER_ERRORS as exc:
                failures[i] = exc
        return failures

    def _raise_for(self, failures: dict[int, BaseException]) -> None:
        """Raise for the failures of an unlock beyond what the lock can do without."""
        if len(failures) <= len(self.locks) - self.quorum:
            return  # RedLock: the minority's failures are not the caller's
        if len(failures) == len(self.locks) and all(
                isinstance(e, LockNotOwnedError) for e in failures.values()):
            raise LockNotOwnedError(f"cannot unlock {self!r}: not held by this owner", self.name)
        raise MultiLockError(f"releasing {self!r} failed for {self._describe(failures)}",
                             self.name, failures)

    # -- inspecting -----------------------------------------------------------------------
    def _held(self) -> int:
        n = 0
        for lock in self.locks:
            try:
                n += lock.is_held_by_current_thread()
            except RedisError:
                pass
        return n

    def is_held_by_current_thread(self) -> bool:
        """Whether this thread holds enough members (all; RedLock: a majority)."""
        return self._held() >= self.quorum

    def remaining_ttl(self) -> float | None:
        """The longest lease left among the members (how long until all could be free)."""
        ttls = []
        for lock in self.locks:
            try:
                ttl = lock.remaining_ttl()
            except RedisError:
                continue
            if ttl is not None:
                ttls.append(ttl)
        return max(ttls) if ttls else None

    def is_lost(self) -> bool:
        """True once more members were lost than the lock can do without (MultiLock: any)."""
        return sum(lock.is_lost() for lock in self.locks) > len(self.locks) - self.quorum

    def _chain(self, i: int, member_on_lost: Callable[[str], Any] | None) -> Callable[[str], Any]:
        # Runs on a watchdog thread: count the members lost here (is_lost() is per owner).
        def on_lost(name: str) -> None:
            if member_on_lost is not None:
                member_on_lost(name)
            tolerated = len(self.locks) - self.quorum
            with self._lost_guard:
                told = len(self._lost_members) > tolerated
                self._lost_members.add(i)
                now = len(self._lost_members) > tolerated
            if self._on_lost is not None and now and not told:
                self._on_lost(self.name)
        return on_lost

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> MultiLock:
        self.lock()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.unlock()


class RedLock(MultiLock):
    """The quorum variant: held when N // 2 + 1 members hold, within the budget.

    Each member is given an equal share of the remaining wait (at least ``MIN_MEMBER_WAIT``).
    With a lease, what is left of it after the acquisition (lease - elapsed - clock drift,
    drift = 1% of the lease + 2 ms) must be positive, or the acquisition is undone. Unlock
    releases every member and ignores the minority's failures.

    Its safety is contested (Kleppmann: a GC pause or a clock jump past the lease lets two
    holders in) and Redisson deprecated it for ``RLock`` with replica sync or a fenced lock.
    It is offered because people ask for it.
    """

    @property
    def quorum(self) -> int:
        return len(self.locks) // 2 + 1

    def _member_wait(self, remaining: float) -> float:
        if remaining <= 0:
            return 0.0
        return min(remaining, max(remaining / len(self.locks), MIN_MEMBER_WAIT))

    def _still_valid(self, start: float, lease: float | None) -> bool:
        if lease is None:
            return True
        drift = lease * 0.01 + 0.002
        return lease - (time.monotonic() - start) - drift > 0
