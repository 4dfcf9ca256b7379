"""FencedLock: Redisson's ``RFencedLock``, an RLock whose every acquire yields a fencing token.

The lock is RLock's hash (same field, lease, renewal, release); next to it lives the counter
``redisson_lock_token:{<key>}`` (an integer string, no TTL), raised by the acquire script on
*every* acquire by anyone, reentrant ones included. A token is therefore unique and larger than
any token handed out before it, so storage that remembers the largest token it has seen can
refuse a holder that paused past its lease (Kleppmann's GC-pause case): see
``django_rlock.fencing``.

Unlike Redisson's plain INCR, the script raises the counter to at least the server's clock in
microseconds (``max(counter + 1, TIME in µs)``): a counter lost in a restart without
persistence, or behind on a promoted replica that missed the last INCRs, does not start
again at 1 below the tokens already out. This assumes the server clock (and, across a
failover, the new master's against the old one's) never goes back by more than the time
between the last token and the loss, and fewer than a million acquires per second on one lock.
A Java Redisson client sharing the counter INCRs it: its tokens keep growing too (but one
that acquires first after a loss starts from 1).

Where Redisson is odd, this port decides (and says so in the docstrings):
``lock_and_get_token(lease_time)`` honours the lease (Redisson ignores it);
``try_lock_and_get_token(0)`` is one attempt and returns None when not acquired (Redisson's
no-argument form waits forever); a holder whose key has no TTL (PTTL -1) is a holder, not a
grant (Redisson reads that -1 as "acquired").
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from . import identity
from .aio import AsyncRLock
from .kinds import Kind, declare
from .lock import RLock
from .lua import Script, source
from .naming import TOKEN_PREFIX, prefix_name

logger = logging.getLogger("django_rlock")

# KEYS, ARGV, the reply and how the token is made: ``lua/fenced_acquire.lua``.
FENCED_ACQUIRE = source("fenced_acquire")

FENCED_ACQUIRE_SCRIPT = Script(FENCED_ACQUIRE)

#: Where the winning attempt of the current call leaves its token. A box (list) set by the
#: caller for one acquire call: threads each have their own context, and asyncio copies the
#: context (and so the same box) into the task that sends the round trip, so one lock object
#: shared by many threads or tasks never hands one caller another's token.
_token_box: ContextVar[list[int] | None] = ContextVar("django_rlock_fenced_token", default=None)


class _Fenced:
    """What FencedLock and AsyncFencedLock share: the script, its keys and its reply."""

    _ACQUIRE = FENCED_ACQUIRE_SCRIPT
    # Only RLock's release script can grant a lock to a waiter, and a grant would skip the
    # token: every acquisition goes through FENCED_ACQUIRE.
    _HANDOFF = False

    key: str
    _index: str
    _acquire_keys: tuple[Any, ...]

    #: The acquire replies {pttl, -1} while another holds the lock (``waiters.noting``).
    _WAITING = ("type(reply) == 'table' and tonumber(reply[2]) == -1", "tonumber(reply[1])")

    def _fence(self) -> None:
        #: The token counter (Redisson's name; the brace rule keeps it in the lock's slot).
        self.token_key = prefix_name(TOKEN_PREFIX, self.key)
        self._acquire_keys = (self.key, self._index, self.token_key)

    def _discarded(self) -> None:
        # The acquire whose token went into the box did not hold after all (invariant 31).
        box = _token_box.get()
        if box:
            box.pop()

    def _ttl_of(self, reply: Any) -> int | None:
        ttl, token = int(reply[0]), int(reply[1])
        if token == -1:  # not acquired; ttl -1 is a holder without expiry, not a grant
            self.busy_ttl_ms = ttl
            return ttl
        box = _token_box.get()
        if box is not None:
            box.append(token)
        return None


class FencedLock(_Fenced, RLock):
    """A reentrant lock (the ``RLock`` API) whose acquires hand out fencing tokens.

    Every acquire, reentrant or not, plain ``lock()``/``try_lock()`` included, raises the
    counter: tokens grow strictly in acquisition order across threads, processes and hosts,
    and across a restart or failover that lost the counter (tokens start from the server's
    clock in microseconds, so they are about 1.7e15 and need a 64-bit column).
    Pass the token to the storage you write (``django_rlock.fencing.fenced_update``), which
    refuses writes older than the newest it has seen.
    """

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 **kwargs: Any) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, **kwargs)
        self._fence()

    def _info(self, owner: str) -> str:
        return identity.with_kind(identity.thread_info(owner), "fenced")

    def lock_and_get_token(self, lease_time: float | None = None) -> int:
        """Block until acquired; return this acquire's token.

        ``lease_time`` in seconds is honoured (Redisson's ``lockAndGetToken(lease)`` drops
        it); ``None``: watchdog mode. A reentrant call also gets a new, larger token.
        """
        return self._take(None, self._lease_ms(lease_time))  # type: ignore[return-value]

    def try_lock_and_get_token(self, wait_time: float = 0.0,
                               lease_time: float | None = None) -> int | None:
        """Try for up to ``wait_time`` seconds; the token, or None if not acquired.

        ``wait_time=0`` (the default) is exactly one attempt: Redisson's no-argument form
        waits forever instead, although its docs promise null when the lock is taken.
        """
        wait = self._wait_budget(wait_time)
        return self._take(wait, self._lease_ms(lease_time))

    def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        return self._take(wait, lease_ms) is not None

    def _take(self, wait: float | None, lease_ms: int | None) -> int | None:
        """Every acquisition path (lock, try_lock, acquire, with): the token, or None. A
        fenced lock is only ever acquired by its own script (no hand-off reaches a waiter
        without a ``HandOff``), so an acquire always leaves its token in the box."""
        box: list[int] = []
        reset = _token_box.set(box)
        try:
            got = super()._acquire(wait, lease_ms)
        finally:
            _token_box.reset(reset)
        return box[-1] if got else None

    def get_token(self) -> int | None:
        """The last token handed out for this lock, by anyone (None: never acquired).

        Not necessarily the caller's: use the token ``*_and_get_token`` returned for fencing.
        """
        value = self._reader.get(self.token_key)
        return None if value is None else int(value)

    def __enter__(self) -> FencedLock:
        self.lock()
        return self


class AsyncFencedLock(_Fenced, AsyncRLock):
    """``FencedLock`` for asyncio: the ``AsyncRLock`` API (task-owned) plus the tokens."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 **kwargs: Any) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, **kwargs)
        self._fence()

    def _info(self, owner: str) -> str:
        return identity.with_kind(identity.task_info(owner), "fenced")

    async def lock_and_get_token(self, lease_time: float | None = None) -> int:
        """Wait until acquired; return this acquire's token (see ``FencedLock``)."""
        return await self._take(None, self._lease_ms(lease_time))  # type: ignore[return-value]

    async def try_lock_and_get_token(self, wait_time: float = 0.0,
                                     lease_time: float | None = None) -> int | None:
        """Try for up to ``wait_time`` seconds (0: one attempt); the token or None."""
        wait = self._wait_budget(wait_time)
        return await self._take(wait, self._lease_ms(lease_time))

    async def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        return await self._take(wait, lease_ms) is not None

    async def _take(self, wait: float | None, lease_ms: int | None) -> int | None:
        box: list[int] = []
        reset = _token_box.set(box)
        try:
            got = await super()._acquire(wait, lease_ms)
        finally:
            _token_box.reset(reset)
        return box[-1] if got else None

    async def get_token(self) -> int | None:
        """The last token handed out for this lock, by anyone (None: never acquired)."""
        value = await self._reader.get(self.token_key)
        return None if value is None else int(value)

    async def __aenter__(self) -> AsyncFencedLock:
        await self.lock()
        return self


KIND = declare(Kind(
    "fenced", "hash",
    note="Its waiters are woken and one of them takes the lock; the token counter is kept, so "
         "tokens keep growing.",
    open=FencedLock, locks={"fenced": FencedLock}, async_locks={"fenced": AsyncFencedLock},
    detect=lambda probe: probe["token"] is not None,
    details=lambda probe, detail: {"token": probe["token"]},
    summary=lambda d: f"token {'-' if d['token'] is None else d['token']}",
    lines=lambda d: [f"token: {'-' if d['token'] is None else d['token']}"]))
