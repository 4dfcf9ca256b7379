"""AsyncRLock: the RLock on a ``redis.asyncio`` client, owned by the asyncio *task*.

Same scripts, same Redis layout, same semantics: reentrant per task, exclusive across tasks,
threads and processes. Acquire and release never block the event loop. Renewal and waiting
are the process's shared ones (one watchdog thread, one pub/sub subscription per server); they
reach the server through a sync twin of the client (``clients.sync_twin``) unless one is given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import identity, pubsub
from .clients import sync_twin
from .lock import SUBSCRIBE_TIMEOUT, HoldKey, LockBase, log_masked_release, ttl_seconds
from .naming import UNLOCK_MESSAGE
from .scripts import ACQUIRE_SCRIPT, FORCE_UNLOCK_SCRIPT, RELEASE_SCRIPT, acall_once
from .watchdog import server_id


class AsyncRLock(LockBase):
    """A reentrant, Redisson-compatible distributed lock for asyncio code.

    The owner is ``<process uuid>:<task number>``: two concurrent tasks never share a hold,
    even on one thread (which ``sync_to_async`` and every event loop give them).
    ``sync_client``: a sync redis-py client to the same server for renewal and waiting;
    made from ``client``'s settings when omitted.
    """

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[[str], Any] | None = None, sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, on_lost)
        self._sync_client = sync_client if sync_client is not None else sync_twin(client)
        self._server = server_id(self._sync_client)

    def _owner(self) -> str:
        return identity.task_owner()

    # -- acquiring ------------------------------------------------------------------------
    async def lock(self, lease_time: float | None = None) -> None:
        """Wait until acquired. ``lease_time`` in seconds; ``None``: watchdog mode."""
        await self._acquire(None, self._lease_ms(lease_time))

    async def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        """Try for up to ``wait_time`` seconds (0: exactly one attempt)."""
        wait = self._wait_budget(wait_time)
        return await self._acquire(wait, self._lease_ms(lease_time))

    async def _attempt(self, k: HoldKey, lease_ms: int | None) -> int | None:
        ttl = await acall_once(self._client, ACQUIRE_SCRIPT, (self.key,),
                               self._acquire_args(k, lease_ms))
        if ttl is None:
            self._acquired(k, lease_ms)
            return None
        return int(ttl)

    async def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        k = (self._server, self.key, identity.task_owner())
        park_until = self._park_first_until(k, wait)
        if not park_until:
            if await self._attempt(k, lease_ms) is None:
                return True
            if wait == 0:
                return False
        return await self._wait(k, lease_ms, wait, park_until)

    async def _wait(self, k: HoldKey, lease_ms: int | None, wait: float | None,
                    park_until: float) -> bool:
        deadline = None if wait is None else time.monotonic() + wait
        sub_timeout = SUBSCRIBE_TIMEOUT if wait is None else min(SUBSCRIBE_TIMEOUT, wait)
        mgr = pubsub.manager(self._sync_client)
        ms = self._watchdog_ms if lease_ms is None else lease_ms
        slot = mgr.enter(self._channel, k[2], ms, self._grant_callback(k, lease_ms),
                         asyncio.get_running_loop())
        try:
            if not slot.confirmed.is_set():
                # The confirmation arrives on the listener thread; wait for it off the loop.
                await asyncio.to_thread(slot.confirmed.wait, sub_timeout)
            if park_until:
                end = park_until if deadline is None else min(park_until, deadline)
                if await slot.apark(end - time.monotonic()):
                    return True
            while True:
                if await slot.abegin_attempt():
                    return True
                ttl = await self._attempt(k, lease_ms)
                again = slot.attempted(ttl is None, ttl)
                if ttl is None:
                    return True
                if again:
                    continue
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if await slot.apark(self._wait_timeout(ttl, deadline)):
                    return True
        except BaseException:
            if slot.granted:  # handed the lock, but we are unwinding (cancelled): give it back
                try:
                    await self.unlock()
                except Exception:
                    pass
            raise
        finally:
            slot.leave()

    # -- releasing ------------------------------------------------------------------------
    async def unlock(self) -> None:
        """Release one hold of the calling task (see ``RLock.unlock``)."""
        plan = self._release_plan((self._server, self.key, identity.task_owner()))
        try:
            r = await acall_once(self._client, RELEASE_SCRIPT, (self.key, self._channel), plan.args)
        except BaseException:
            # Cancelled or failed mid-release: in doubt, so renewal stops and the lease decides.
            self._release_failed(plan)
            raise
        orphan = self._release_done(plan, r)
        if orphan is not None:
            await acall_once(self._client, RELEASE_SCRIPT, (self.key, self._channel),
                             (orphan.owner, orphan.lease_ms, UNLOCK_MESSAGE))

    release = unlock

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters. True if a lock was deleted."""
        return self._forced(await acall_once(self._client, FORCE_UNLOCK_SCRIPT,
                                             (self.key, self._channel), (UNLOCK_MESSAGE,)))

    # -- inspecting -----------------------------------------------------------------------
    async def is_locked(self) -> bool:
        return bool(await self._client.exists(self.key))

    async def is_held_by_current_task(self) -> bool:
        return bool(await self._client.hexists(self.key, identity.task_owner()))

    async def hold_count(self) -> int:
        return int(await self._client.hget(self.key, identity.task_owner()) or 0)

    async def remaining_ttl(self) -> float | None:
        """Seconds left on the lease; None when not locked, ``inf`` for a key without expiry."""
        return ttl_seconds(await self._client.pttl(self.key))

    # -- context manager ------------------------------------------------------------------
    async def __aenter__(self) -> AsyncRLock:
        await self.lock()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None:
            await self.unlock()
            return
        try:
            await self.unlock()
        except Exception as err:
            log_masked_release(self.name, exc_type, err)
