"""What the non-lock kinds (semaphores, permits, the latch) share: ``Named``.

Validation before any Redis command, names, the index entry, the sync/asyncio client pair,
the wait (the engine's one wait loop on the process's one subscription), and the force-unlock
bookkeeping. Permits can change with no message (a permit expiring, a count set by hand, a
message lost over a reconnect), so every park is bounded by ``RECHECK`` seconds at most.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import events, taskholds, waiters
from .clients import SlotBound, async_twin, is_cluster_node, sync_twin
from .flavours import check_client
from .lock import check_name, check_seconds
from .lua import Script, source
from .naming import SEMAPHORE_CHANNEL_PREFIX, index_key, prefix_name, suffix_name
from .wait import loop as waiting
from .wait.channel import wake_count
from .watchdog import server_id, watchdog

logger = logging.getLogger("django_rlock")

#: Longest a waiter parks without re-checking (seconds). A lost message (a reconnect), a
#: count changed by hand or by a client that does not publish, or an expiry nobody reclaimed
#: yet would otherwise leave it waiting for a message that never comes.
RECHECK = 5.0

# KEYS, ARGV and the reply: in each file's header.
SEMAPHORE_FORCE = source("sem_force")
DELETE = source("sem_delete")
SEMAPHORE_FORCE_SCRIPT = Script(SEMAPHORE_FORCE)
DELETE_SCRIPT = Script(DELETE)


# -- what the non-lock kinds share -------------------------------------------------------------
class Named(SlotBound):
    """Validation, names and the client pair of a semaphore or latch.

    A sync object sends on ``client`` and waits on it; an asyncio one sends on its
    ``redis.asyncio`` client and waits (and renews) through a sync twin of it
    (``clients.sync_twin``, or ``sync_client``), like ``AsyncRLock``.
    """

    #: What it is called in error messages, and its kind in the index.
    _WHAT = "semaphore"
    #: How many local waiters one message on its channel wakes.
    _WAKES = staticmethod(wake_count)
    #: Longest park without a re-check (seconds).
    _RECHECK = RECHECK

    def __init__(self, client: Any, name: str, prefix: str, *, aio: bool = False,
                 sync_client: Any = None) -> None:
        check_name(name)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__} "
                            f"({self._WHAT} {name!r})")
        for c in (client, sync_client):
            if c is not None:
                check_client(c, f"{self._WHAT} {name!r}", cluster_ok=c is client,
                             aio=aio and c is client)
        if client is None:
            raise TypeError(f"client must be a redis-py client, not NoneType "
                            f"({self._WHAT} {name!r})")
        self.name = name
        self.prefix = prefix
        self.key = prefix + name
        self._aio = aio
        client = self._bind(client)  # on a cluster: its slot's master (a sync client)
        self._index = index_key(prefix, self.key if is_cluster_node(client) else None)
        if self._cluster is not None:
            sync_client = client
        elif sync_client is None:
            sync_client = sync_twin(client) if aio else client
        self._sync_client = sync_client
        self._server = server_id(sync_client)
        self._channel = prefix_name(SEMAPHORE_CHANNEL_PREFIX, self.key).encode()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} key={self.key!r}>"

    @property
    def client(self) -> Any:
        return self._client

    @property
    def _client(self) -> Any:
        # An asyncio one on a cluster: the asyncio twin (for the running loop) of the slot
        # master's client.
        node = SlotBound._client.fget(self)  # type: ignore[attr-defined]
        return async_twin(node) if self._aio and self._cluster is not None else node

    @property
    def channel(self) -> str:
        """The pub/sub channel its changes are published on."""
        return self._channel.decode()

    # -- validation (before any Redis command) ---------------------------------------------
    def _count(self, n: Any, what: str = "permits", *, negative_ok: bool = False,
               least: int = 0) -> int:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"{what} must be an int, not {type(n).__name__} "
                            f"({self._WHAT} {self.name!r})")
        if n < least and not negative_ok:
            raise ValueError(f"{what} must be >= {least}, got {n!r} ({self._WHAT} {self.name!r})")
        return n

    def _budget(self, wait_time: Any, what: str = "wait_time") -> float | None:
        """Seconds to wait (None: no limit)."""
        if wait_time is None:
            return None
        w = check_seconds(wait_time, what, self.name, zero_ok=True, inf_ok=True)
        return None if math.isinf(w) else w

    # -- force-unlock (the kind's one meaning: ``locks clear`` and the admin run it too) -------
    def _force_call(self) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
        """The script, KEYS and ARGV of this kind's force-unlock: the counter and any permits
        taken go, and the waiters are woken (they find nothing to take until it is set)."""
        return (SEMAPHORE_FORCE_SCRIPT, (self.key, suffix_name(self.key, "timeout"), self._index),
                (self._channel.decode(), "0"))

    def _forcing(self) -> list[Any]:
        return watchdog().holds_of(self._server, self.key)

    def _forced(self, r: Any, before: list[Any]) -> bool:
        # As ``LockBase._forced``: the holds that existed before the delete are lost.
        watchdog().drop_holds(before if r else [])
        if events.listeners:
            events.emit("force_unlocked", name=self.name, key=self.key, label=None,
                        deleted=bool(r))
        return bool(r)

    # -- waiting ---------------------------------------------------------------------------
    def _wait(self, since: float | None = None) -> waiting.Wait:
        """This kind's wait; ``since``: when the call began (its events report the wait from
        there; None: reported as 0)."""
        self._fresh()  # on a cluster, an attempt redirected: subscribe where the slot is now
        return waiting.Wait(self._sync_client, self._channel, self.key, wakes=self._WAKES,
                            recheck=self._RECHECK, moved=self._moved_check(), name=self.name,
                            kind=type(self).__name__, since=since)

    def _bound(self, ttl: int) -> int:
        """A wait bound in ms from Redis, capped so a lost message costs ``RECHECK`` at most."""
        cap = int(self._RECHECK * 1000)
        return -1 if ttl < 0 or ttl > cap else ttl

    def _note(self, t0: float, budget: float | None) -> waiters.Note:
        """The record the retries of a wait that began at ``t0`` carry (``waiters``)."""
        return waiters.note(self.key, None if budget is None else t0 + budget, aio=self._aio,
                            bound=self._RECHECK)

    def _waits(self, attempt: Callable[..., int | None], budget: float | None) -> bool:
        """One attempt, then the shared wait loop for what is left of ``budget``: its retries
        are ``attempt(note)``, which carry the waiter's record (``waiters.noted``)."""
        t0 = time.monotonic()
        if attempt() is None:
            return True
        if budget == 0:
            waiting.refused(self._sync_client, self.name, self.key, None, type(self).__name__,
                            "", t0)
            return False
        note = self._note(t0, budget)
        try:
            return waiting.wait(self._wait(t0), lambda claim: attempt(note), budget)
        except BaseException:
            waiters.forget(self._client, note)
            raise

    async def _awaits(self, attempt: Callable[..., Awaitable[int | None]],
                      budget: float | None) -> bool:
        t0 = time.monotonic()
        if await attempt() is None:
            return True
        if budget == 0:
            waiting.refused(self._sync_client, self.name, self.key, None, type(self).__name__,
                            "", t0)
            return False
        note = self._note(t0, budget)

        async def again(claim: bool) -> int | None:
            return await attempt(note)

        try:
            return await waiting.await_(self._wait(t0), again, budget)
        except BaseException:
            await asyncio.shield(waiters.aforget(self._client, note))
            raise


async def uncancellable(send: Callable[[], Awaitable[int | None]],
                         undo: Callable[[], Awaitable[Any]]) -> int | None:
    """One acquire round trip that a cancellation cannot split.

    ``send`` resolves to None (taken) or a wait bound. If the caller is cancelled while it is
    in flight, the round trip still lands; what it took is given back (``undo``) before the
    cancellation goes on, so a cancelled waiter never keeps a permit nobody knows about.
    """
    fut = asyncio.ensure_future(send())
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        try:
            ttl = await asyncio.shield(fut)
        except asyncio.CancelledError:  # cancelled twice: give it back when it lands
            fut.add_done_callback(lambda f: undo_later(f, undo))
            raise
        except Exception:
            raise asyncio.CancelledError from None
        if ttl is None:
            try:
                await undo()
            except Exception as exc:
                logger.warning("django-rlock: could not give back a permit taken by a cancelled "
                               "acquire (%s: %s)", type(exc).__name__, exc)
        raise


def undo_later(fut: asyncio.Future[Any], undo: Callable[[], Awaitable[Any]]) -> None:
    if fut.cancelled() or fut.exception() is not None or fut.result() is not None:
        return
    taskholds.keep(asyncio.ensure_future(undo()))  # (a permit given back: kept alive)
