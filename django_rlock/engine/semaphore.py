"""Semaphore and PermitExpirableSemaphore: Redisson's ``RSemaphore`` / ``RPermitExpirableSemaphore``.

Redisson's layout, so Java and Node clients share the very same permits:

- ``Semaphore``: the string ``<key>`` holds the permits available; every change that frees
  permits publishes the new count on ``redisson_sc:{<key>}``. Permits have no owner and no
  lease: a holder that crashes keeps its permits for good (as in Redisson).
- ``PermitExpirableSemaphore``: the string ``<key>`` holds the permits available, the zset
  ``{<key>}:timeout`` the permits taken (member: the permit id's 16 raw bytes, shown to
  callers as 32 hex chars; score: expiry in ms, server time), same channel. Every script that
  changes it first reclaims expired ids (drops them, counts them back, publishes). A permit
  taken without a lease is renewed by the process's watchdog until released, so a crashed
  holder's permit comes back within ``watchdog_timeout`` (unlike Redisson's plain semaphore).

Neither is a lock: there is no owner field and no hand-off. Both wait with the engine's one
wait loop (``waiting``) on the process's one subscription, and a message (the permits now
free) wakes that many waiters (``wait.channel.wake_count``). Permits can change with no message (a
permit expiring, a count set by hand, a message lost over a reconnect), so every park is
bounded: by the nearest permit expiry where there is one, and by ``RECHECK`` seconds always.

The base they share with ``latch.CountDownLatch`` is ``named.Named``;
``PermitExpirableSemaphore`` lives in ``permits`` (re-exported here).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from . import waiters
from .kinds import Kind, declare
from .lua import Script, source
from .named import (
    DELETE,
    DELETE_SCRIPT,
    RECHECK,
    SEMAPHORE_FORCE,
    SEMAPHORE_FORCE_SCRIPT,
    Named,
    uncancellable,
)
from .scripts import acall_once, call, call_once

# -- Lua: ``lua/sem_*.lua`` (KEYS, ARGV and the reply in each file's header) ------------------
SEM_ACQUIRE = source("sem_acquire")
SEM_RELEASE = source("sem_release")
SEM_TRY_SET = source("sem_try_set")
SEM_ADD = source("sem_add")
SEM_DRAIN = source("sem_drain")

SEM_ACQUIRE_SCRIPT = Script(SEM_ACQUIRE)
SEM_RELEASE_SCRIPT = Script(SEM_RELEASE)
SEM_TRY_SET_SCRIPT = Script(SEM_TRY_SET)
SEM_ADD_SCRIPT = Script(SEM_ADD)
SEM_DRAIN_SCRIPT = Script(SEM_DRAIN)


# -- Semaphore ---------------------------------------------------------------------------------
#: A waiter's record (``waiters.noting``): the acquire replies 0 while too few are free.
_WAITING = "reply == 0"


class _SemaphoreBase(Named):
    def __init__(self, client: Any, name: str, prefix: str = "", *, aio: bool = False,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=aio, sync_client=sync_client)
        self._keys = (self.key, self._channel, self._index)

    def _ttl_of(self, reply: Any) -> int | None:
        return None if int(reply) == 1 else -1


class Semaphore(_SemaphoreBase):
    """Redisson's ``RSemaphore``: a count of permits shared by every client of the key.

    Permits have no owner: any caller may release any number (a release beyond the count set
    raises it), and a holder that dies keeps its permits (use ``PermitExpirableSemaphore``
    where that matters). May be used without ``try_set_permits``: it starts at 0.
    ``with sem:`` takes one permit and gives it back.
    """

    def try_set_permits(self, permits: int) -> bool:
        """Set the count if the semaphore has none yet; True if it was set."""
        n = self._count(permits)
        return bool(call_once(self._client, SEM_TRY_SET_SCRIPT, self._keys, (n,)))

    def add_permits(self, permits: int) -> None:
        """Add to the count (negative: take away; the count may go below zero)."""
        n = self._count(permits, negative_ok=True)
        call_once(self._client, SEM_ADD_SCRIPT, self._keys, (n,))

    def acquire(self, permits: int = 1) -> None:
        """Take ``permits``, waiting as long as it takes."""
        self._take(self._count(permits), None)

    def try_acquire(self, permits: int = 1, wait_time: float = 0.0) -> bool:
        """Take ``permits`` within ``wait_time`` seconds (0: one attempt); True if taken."""
        return self._take(self._count(permits), self._budget(wait_time))

    def _take(self, n: int, budget: float | None) -> bool:
        if n == 0:
            return True

        def attempt(note: waiters.Note | None = None) -> int | None:
            return self._ttl_of(call_once(self._client, *waiters.noted(
                note, SEM_ACQUIRE_SCRIPT, (self.key,), (n,), _WAITING)))

        return self._waits(attempt, budget)

    def release(self, permits: int = 1) -> None:
        """Give ``permits`` back (publishing the count now, which wakes that many waiters)."""
        n = self._count(permits)
        if n:
            call_once(self._client, SEM_RELEASE_SCRIPT, self._keys, (n,))

    def available_permits(self) -> int:
        return int(self._reader.get(self.key) or 0)

    def drain_permits(self) -> int:
        """Take every permit available; returns how many that was."""
        return int(call_once(self._client, SEM_DRAIN_SCRIPT, (self.key,), ()))

    def force_unlock(self) -> bool:
        """Delete the semaphore (its count and the permits taken) and wake its waiters: what
        ``manage.py locks clear`` and the admin do. True if there was one."""
        before = self._forcing()
        script, keys, args = self._force_call()
        return self._forced(call_once(self._client, script, keys, args), before)

    def delete(self) -> bool:
        """Delete the semaphore (its count); True if there was one."""
        return bool(call(self._client, DELETE_SCRIPT, (self.key, self._index), ()))

    def __enter__(self) -> Semaphore:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class AsyncSemaphore(_SemaphoreBase):
    """``Semaphore`` for asyncio (``redis.asyncio`` client). A cancelled ``acquire`` never
    keeps a permit: one its round trip took as it was cancelled is given back first."""

    def __init__(self, client: Any, name: str, prefix: str = "", *,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=True, sync_client=sync_client)

    async def try_set_permits(self, permits: int) -> bool:
        n = self._count(permits)
        return bool(await acall_once(self._client, SEM_TRY_SET_SCRIPT, self._keys, (n,)))

    async def add_permits(self, permits: int) -> None:
        n = self._count(permits, negative_ok=True)
        await acall_once(self._client, SEM_ADD_SCRIPT, self._keys, (n,))

    async def acquire(self, permits: int = 1) -> None:
        await self._take(self._count(permits), None)

    async def try_acquire(self, permits: int = 1, wait_time: float = 0.0) -> bool:
        return await self._take(self._count(permits), self._budget(wait_time))

    async def _take(self, n: int, budget: float | None) -> bool:
        if n == 0:
            return True

        async def send(note: waiters.Note | None = None) -> int | None:
            return self._ttl_of(await acall_once(self._client, *waiters.noted(
                note, SEM_ACQUIRE_SCRIPT, (self.key,), (n,), _WAITING)))

        async def undo() -> None:
            await acall_once(self._client, SEM_RELEASE_SCRIPT, self._keys, (n,))

        return await self._awaits(
            lambda note=None: uncancellable(lambda: send(note), undo), budget)

    async def release(self, permits: int = 1) -> None:
        n = self._count(permits)
        if n:
            # Shielded: a cancelled caller's release still lands (or the permits would leak).
            await asyncio.shield(acall_once(self._client, SEM_RELEASE_SCRIPT, self._keys, (n,)))

    async def available_permits(self) -> int:
        return int(await self._reader.get(self.key) or 0)

    async def drain_permits(self) -> int:
        return int(await acall_once(self._client, SEM_DRAIN_SCRIPT, (self.key,), ()))

    async def force_unlock(self) -> bool:
        """``Semaphore.force_unlock`` for asyncio."""
        before = self._forcing()
        script, keys, args = self._force_call()
        return self._forced(await acall_once(self._client, script, keys, args), before)

    async def delete(self) -> bool:
        return bool(await acall_once(self._client, DELETE_SCRIPT, (self.key, self._index), ()))

    async def __aenter__(self) -> AsyncSemaphore:
        await self.acquire()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.release()


SEMAPHORE = declare(Kind(
    "semaphore", "string",
    note="Its permits are deleted (none are available until they are set again); whoever took "
         "permits keeps running, uncounted. Waiters are woken.",
    open=Semaphore, detect=lambda probe: False,
    details=lambda probe, detail: {"permits": probe["number"]},
    summary=lambda d: f"{d['permits']} available",
    lines=lambda d: [f"permits available: {d['permits']}"]))

# Where they always were: the permit semaphores (``permits``), and the shared names.
from .permits import (  # noqa: E402  (permits imports nothing of this module)
    PES_ACQUIRE_SCRIPT,
    PES_RELEASE_SCRIPT,
    PES_RENEW_SCRIPT,
    AsyncPermitExpirableSemaphore,
    PermitExpirableSemaphore,
    new_permit_id,
)

__all__ = ["DELETE", "DELETE_SCRIPT", "PES_ACQUIRE_SCRIPT", "PES_RELEASE_SCRIPT",
           "PES_RENEW_SCRIPT", "RECHECK", "SEMAPHORE_FORCE", "SEMAPHORE_FORCE_SCRIPT",
           "AsyncPermitExpirableSemaphore", "AsyncSemaphore", "PermitExpirableSemaphore",
           "Semaphore", "new_permit_id"]
