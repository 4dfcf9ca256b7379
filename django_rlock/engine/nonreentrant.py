"""NonReentrantLock: Redisson 4.4's ``getNonReentrantLock``, an RLock that counts no reentry.

Same hash, field, lease, renewal, release and channel as ``RLock`` (a Redisson client's
non-reentrant lock and ours contend for the same key). A holder that asks again is refused
before any command: ``lock()`` raises ``LockReentryError`` naming the lock (a wait would be for
itself, forever), ``try_lock()`` returns False. The script refuses it too
(``NON_REENTRANT_REACQUIRE``, Redisson's reply) for an owner this process does not know holds
it; a field of an owner that holds nothing here is a hold whose reply was lost, taken as a
fresh hold (invariant 32).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from . import identity
from .aio import AsyncRLock
from .errors import LockReentryError
from .kinds import Kind, declare
from .lock import HoldKey, RLock
from .lua import Script, source
from .watchdog import watchdog

NON_REENTRANT_ACQUIRE = source("non_reentrant_acquire")
NON_REENTRANT_ACQUIRE_SCRIPT = Script(NON_REENTRANT_ACQUIRE)

#: The error reply of a reacquire (Redisson's).
REACQUIRE = "NON_REENTRANT_REACQUIRE"


class _NonReentrant:
    """What the sync and asyncio kinds share: the script, no hand-off, the refusal."""

    _ACQUIRE = NON_REENTRANT_ACQUIRE_SCRIPT
    # Only RLock's release script grants, and its grant counts as a hold like any other:
    # with no reentry there is nothing for it to get wrong, but one rule for the family is
    # simpler (invariant 17).
    _HANDOFF = False

    name: str
    _server: Any
    key: str
    _field: Callable[[], str]  # LockBase's

    def _acquire_args(self, k: HoldKey, lease_ms: int | None, claim: bool = False) -> tuple[Any, ...]:
        ms, field, info, mode = super()._acquire_args(k, lease_ms)  # type: ignore[misc]
        return (ms, field, identity.with_kind(info, "non_reentrant"), mode)

    def _holds(self) -> bool:
        return watchdog().get((self._server, self.key, self._field())) is not None

    def refuse_reentry(self) -> None:
        """``LockReentryError`` if the caller holds this lock already (no command): for a
        caller that only tries (``@locked``), to which ``try_lock()``'s False would read as
        "held by someone else"."""
        if self._holds():
            self._refused(None)

    def _refused(self, wait: float | None) -> bool:
        """A reentry: False for a try (``wait`` given), else ``LockReentryError``."""
        if wait is not None:
            return False
        raise LockReentryError(
            f"lock {self.name!r} is not reentrant and {self._field()} holds it already: "
            f"lock() would wait for itself forever (try_lock() returns False)", self.name)


def _reacquired(exc: ResponseError) -> bool:
    return REACQUIRE in str(exc)


class NonReentrantLock(_NonReentrant, RLock):
    """A lock that its holder cannot take twice (Redisson's ``RLock`` from
    ``getNonReentrantLock``): the ``RLock`` API, with a second ``lock()`` by the holder raising
    ``LockReentryError`` and a second ``try_lock()`` returning False, at once."""

    def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        if self._holds():
            return self._refused(wait)
        try:
            return super()._acquire(wait, lease_ms)
        except ResponseError as exc:
            if not _reacquired(exc):
                raise
            return self._refused(wait)


class AsyncNonReentrantLock(_NonReentrant, AsyncRLock):
    """``NonReentrantLock`` for asyncio (task-scoped owners)."""

    async def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        if self._holds():
            return self._refused(wait)
        try:
            return await super()._acquire(wait, lease_ms)
        except ResponseError as exc:
            if not _reacquired(exc):
                raise
            return self._refused(wait)


KIND = declare(Kind(
    "non_reentrant", "hash",
    note="Its waiters are woken and one of them takes the lock.",
    open=NonReentrantLock, locks={"non_reentrant": NonReentrantLock},
    async_locks={"non_reentrant": AsyncNonReentrantLock},
    detect=lambda probe: False))  # by layout it is an RLock: only its index entry tells

__all__ = ["AsyncNonReentrantLock", "NonReentrantLock"]
