"""RLock: Redisson's reentrant lock on a redis-py client.

One acquire attempt and one release are one EVALSHA each, sent once (see ``scripts``).
Waiting is pub/sub driven (``pubsub``), renewal is the process watchdog's (``watchdog``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import identity, pubsub
from .errors import LockNotOwnedError
from .naming import UNLOCK_MESSAGE, lock_channel
from .scripts import ACQUIRE_SCRIPT, FORCE_UNLOCK_SCRIPT, RELEASE_SCRIPT, call_once
from .watchdog import server_id, watchdog

logger = logging.getLogger("django_rlock")

#: Longest a waiter waits for its SUBSCRIBE to be confirmed before relying on PTTL alone.
SUBSCRIBE_TIMEOUT = 7.5
#: After a release that woke waiters in *other* processes, this process lets them have the
#: first go for this long (seconds) instead of re-grabbing at once: a loop of
#: lock/unlock in one process would otherwise starve every other process.
YIELD_WINDOW = 0.005

_yield_until: dict[tuple[Any, str], float] = {}


def check_seconds(value: Any, what: str, name: str, *, zero_ok: bool, inf_ok: bool = False) -> float:
    """Validate a time in seconds; raise before any Redis command is sent."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__} "
                        f"(lock {name!r})")
    v = float(value)
    if math.isnan(v) or v < 0 or (v == 0 and not zero_ok) or (math.isinf(v) and not inf_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{what} must be a finite number {bound} seconds, got {value!r} "
                         f"(lock {name!r})")
    return v


def check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__} ({name!r})")
    if not name:
        raise ValueError("lock name must not be empty")
    return name


class RLock:
    """A reentrant, Redisson-compatible distributed lock.

    The owner is ``<process uuid>:<thread id>``: reentrant per thread, exclusive across
    threads, processes (forked children included) and hosts. ``lease_time=None`` means
    watchdog mode: a ``watchdog_timeout`` lease kept alive by this process while held.

    ``on_lost(name)`` is called (on the watchdog thread) if a renewal finds the lock gone
    while it is held; ``is_lost()`` tells the holder the same.
    """

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[[str], Any] | None = None) -> None:
        check_name(name)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__} (lock {name!r})")
        if not hasattr(client, "connection_pool"):
            raise TypeError(f"client must be a redis-py Redis client, not {type(client).__name__} "
                            f"(lock {name!r})")
        wt = check_seconds(watchdog_timeout, "watchdog_timeout", name, zero_ok=False)
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable (lock {name!r})")
        self._client = client
        self.name = name
        self.prefix = prefix
        self.key = prefix + name
        self.watchdog_timeout = wt
        self._watchdog_ms = max(1, math.ceil(wt * 1000))
        self._channel = lock_channel(self.key).encode()
        self._server = server_id(client)
        self._on_lost = on_lost

    def __repr__(self) -> str:
        return f"<RLock {self.name!r} key={self.key!r}>"

    @property
    def client(self) -> Any:
        return self._client

    # -- acquiring ------------------------------------------------------------------------
    def lock(self, lease_time: float | None = None) -> None:
        """Block until acquired. ``lease_time`` in seconds; ``None``: watchdog mode."""
        self._acquire(None, self._lease_ms(lease_time))

    def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        """Try for up to ``wait_time`` seconds (0: exactly one attempt)."""
        wait = check_seconds(wait_time, "wait_time", self.name, zero_ok=True, inf_ok=True)
        lease = self._lease_ms(lease_time)
        return self._acquire(None if math.isinf(wait) else wait, lease)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """``threading.RLock.acquire`` semantics (watchdog mode)."""
        if not blocking:
            if timeout != -1:
                raise ValueError(f"can't specify a timeout for a non-blocking call (lock {self.name!r})")
            return self._acquire(0.0, None)
        if timeout == -1:
            return self._acquire(None, None)
        return self._acquire(check_seconds(timeout, "timeout", self.name, zero_ok=True), None)

    def _lease_ms(self, lease_time: float | None) -> int | None:
        if lease_time is None:
            return None
        lease = check_seconds(lease_time, "lease_time", self.name, zero_ok=False)
        return max(1, math.ceil(lease * 1000))

    def _attempt(self, k: tuple[Any, str, str], lease_ms: int | None) -> int | None:
        """One acquire round trip: None when acquired, else the holder's PTTL in ms."""
        renew = lease_ms is None
        ms = self._watchdog_ms if renew else lease_ms
        ttl = call_once(self._client, ACQUIRE_SCRIPT, (self.key,), (ms, k[2]))
        if ttl is None:
            # Registered before the caller hears of it, so no unlock can run ahead of it.
            watchdog().acquired(k, self._client, self.name, ms, renew, self.watchdog_timeout,
                                self._on_lost)
            return None
        return int(ttl)

    def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        k = (self._server, self.key, identity.thread_owner())
        skip_first = 0.0
        if wait != 0 and watchdog().get(k) is None:
            # Not a reentry: do not barge ahead of this process's queued waiters, nor
            # straight back in after a release that woke other processes.
            mgr = pubsub.existing_manager(self._client)
            if mgr is not None and mgr.busy(self._channel):
                skip_first = max(mgr.expires_hint(self._channel), time.monotonic() + 1e-3)
            polite = _yield_until.get((self._server, self.key))
            if polite is not None:
                if polite > time.monotonic():
                    skip_first = max(skip_first, polite)
                else:
                    _yield_until.pop((self._server, self.key), None)
        if not skip_first:
            ttl = self._attempt(k, lease_ms)
            if ttl is None:
                return True
            if wait == 0:
                return False
        return self._wait(k, lease_ms, wait, skip_first)

    def _wait(self, k: tuple[Any, str, str], lease_ms: int | None, wait: float | None,
              park_until: float) -> bool:
        start = time.monotonic()
        deadline = None if wait is None else start + wait
        sub_timeout = SUBSCRIBE_TIMEOUT if deadline is None else min(SUBSCRIBE_TIMEOUT, wait or 0.0)
        renew = lease_ms is None
        ms = self._watchdog_ms if renew else lease_ms

        def on_grant() -> None:  # runs on the releasing thread, before we are woken
            watchdog().acquired(k, self._client, self.name, ms, renew, self.watchdog_timeout,
                                self._on_lost)

        mgr = pubsub.manager(self._client)
        with mgr.waiting(self._channel, sub_timeout, k[2], ms, on_grant) as slot:
            try:
                if park_until:
                    end = park_until if deadline is None else min(park_until, deadline)
                    if slot.park(end - time.monotonic()):
                        return True
                while True:
                    ttl = self._attempt(k, lease_ms)
                    again = slot.attempted(ttl is None, ttl)
                    if ttl is None:
                        return True
                    if again:
                        continue
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        return False
                    # Redis expires a key once its deadline has *passed*: PTTL 0 is still there.
                    timeout = (ttl + 1) / 1000.0 if ttl >= 0 else None
                    if deadline is not None:
                        timeout = deadline - now if timeout is None else min(timeout, deadline - now)
                    if slot.park(timeout):
                        return True
            except BaseException:
                if slot.granted:  # handed the lock, but we are unwinding: give it back
                    try:
                        self.unlock()
                    except Exception:
                        pass
                raise

    # -- releasing ------------------------------------------------------------------------
    def unlock(self) -> None:
        """Release one hold of the calling owner; the last one deletes the key and publishes.

        Raises LockNotOwnedError if the caller holds nothing (never acquired, expired, lost,
        force-unlocked). A Redis error propagates unchanged and is not retried; renewal of
        the hold stops once its local count reaches zero, so an in-doubt lock expires by itself.
        """
        k = (self._server, self.key, identity.thread_owner())
        wd = watchdog()
        hold = wd.get(k)
        lease_ms = hold.lease_ms if hold is not None else self._watchdog_ms
        final = hold is None or hold.count <= 1
        mgr = pubsub.existing_manager(self._client) if final else None
        heir = mgr.reserve(self._channel) if mgr is not None else None
        echo = mgr.expect_echo(self._channel) if mgr is not None else False
        try:
            r = self._release(k[2], lease_ms, heir)
        except BaseException:
            wd.released(k, hold, fully=False)
            if mgr is not None:
                self._settle(mgr, heir, echo, False)
            raise
        if r is None:
            wd.forget(k)
            wd.forget_lost(k)
            if mgr is not None:
                self._settle(mgr, heir, echo, False)
            raise LockNotOwnedError(
                f"cannot unlock {self.name!r}: it is not held by this owner ({k[2]}); it was never "
                f"acquired, its lease expired, or it was lost or force-unlocked", self.name)
        wd.released(k, hold, fully=r != 0)
        if mgr is not None:
            self._settle(mgr, heir, echo, r)
        elif r > 0:
            self._after_delete(r - 1, None)

    release = unlock

    def _release(self, owner: str, lease_ms: int, heir: pubsub.Waiter | None) -> int | None:
        args: tuple[Any, ...] = (owner, lease_ms, UNLOCK_MESSAGE)
        if heir is not None:
            args += (heir.owner, heir.lease_ms, 1)
        r = call_once(self._client, RELEASE_SCRIPT, (self.key, self._channel), args)
        return None if r is None else int(r)

    def _settle(self, mgr: pubsub.PubSubManager, heir: pubsub.Waiter | None, echo: bool,
                r: int | None | bool) -> None:
        """Tell the pub/sub side what the release did: hand-off, publish, or nothing."""
        published = isinstance(r, int) and not isinstance(r, bool) and r > 0
        if echo and not published:
            mgr.cancel_echo(self._channel)
        if heir is not None:
            granted = r == -1
            if granted and heir.on_grant is not None and not heir.abandoned:
                heir.on_grant()
            if not mgr.resolve(self._channel, heir, granted):
                # The waiter left before the hand-off settled: release on its behalf.
                call_once(self._client, RELEASE_SCRIPT, (self.key, self._channel),
                          (heir.owner, heir.lease_ms, UNLOCK_MESSAGE))
        if published:
            self._after_delete(int(r) - 1, mgr)

    def _after_delete(self, receivers: int, mgr: pubsub.PubSubManager | None) -> None:
        if mgr is None:
            mgr = pubsub.existing_manager(self._client)
        if mgr is not None:
            if mgr.subscribed(self._channel):
                receivers -= 1  # our own subscription got the message too
            mgr.wake(self._channel)
        if receivers > 0:
            if len(_yield_until) > 1024:
                now = time.monotonic()
                for key in [key for key, t in _yield_until.items() if t <= now]:
                    del _yield_until[key]
            _yield_until[(self._server, self.key)] = time.monotonic() + YIELD_WINDOW

    def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters. True if a lock was deleted."""
        r = call_once(self._client, FORCE_UNLOCK_SCRIPT, (self.key, self._channel), (UNLOCK_MESSAGE,))
        watchdog().drop_key(self._server, self.key)
        if r:
            mgr = pubsub.existing_manager(self._client)
            if mgr is not None:
                mgr.wake(self._channel)
        return bool(r)

    # -- inspecting -----------------------------------------------------------------------
    def is_locked(self) -> bool:
        return bool(self._client.exists(self.key))

    def is_held_by_current_thread(self) -> bool:
        return bool(self._client.hexists(self.key, identity.thread_owner()))

    def hold_count(self) -> int:
        return int(self._client.hget(self.key, identity.thread_owner()) or 0)

    def remaining_ttl(self) -> float | None:
        """Seconds left on the lease; None when not locked, ``inf`` for a key without expiry."""
        ms = int(self._client.pttl(self.key))
        if ms == -2:
            return None
        if ms == -1:
            return float("inf")
        return ms / 1000.0

    def is_lost(self) -> bool:
        """True if the watchdog found this thread's hold gone (expired or force-unlocked)."""
        return watchdog().is_lost((self._server, self.key, identity.thread_owner()))

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> RLock:
        self.lock()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.unlock()
            return
        try:
            self.unlock()
        except Exception as err:
            # Never let a failed release mask the block's own exception (redis-py #623).
            logger.warning("django-rlock: releasing %r after %s failed: %s", self.name,
                           exc_type.__name__, err)
