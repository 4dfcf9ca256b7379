"""AsyncLeader: ``leader.Leader`` for asyncio (docs/engine.md, invariant 34).

The campaign is a task of the running loop instead of a thread; its lock is the asyncio
FencedLock (task-owned). Waiting and renewal are the process's shared ones (the subscription
and watchdog threads), so a standby costs no thread. ``is_leader()`` and ``term`` do no I/O and
are plain calls; ``start``, ``stop``, ``wait_elected`` and ``leader`` are awaitables.
Callbacks may be plain functions or coroutine functions; they run on the campaign's task.
Waits are bounded with ``asyncio.timeout``, never ``asyncio.wait_for``: on Python 3.11 that
returns normally when its task is cancelled just as the awaited thing finishes, and the
cancelled campaign or ``wait_elected`` would go on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import identity
from .leadership import (
    IN_DOUBT,
    LOST,
    RETRY_MAX,
    RETRY_MIN,
    STOPPED,
    AsyncLeaderLock,
    CampaignStopped,
    LeaderBase,
    LeaderInfo,
    Term,
    until,
)
from .wait import settings as wait_settings
from .wait.waiter import State

logger = logging.getLogger("django_rlock")


class AsyncLeader(LeaderBase):
    """One process's campaign for ``group``, on an asyncio task (see ``Leader``)."""

    def __init__(self, client: Any, group: str, prefix: str = "", *,
                 watchdog_timeout: float = 30.0, on_elected: Callable[[int], Any] | None = None,
                 on_revoked: Callable[[str], Any] | None = None) -> None:
        super().__init__(client, group, prefix, watchdog_timeout, on_elected, on_revoked,
                         AsyncLeaderLock)
        self._stopping = False
        self._stopped = asyncio.Event()
        self._elected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> AsyncLeader:
        """Campaign on a task of the running loop (returns at once)."""
        if self._task is not None and not self._task.done():
            raise RuntimeError(f"leader {self.group!r} is already started")
        self._stopping = False
        self._stopped.clear()
        self._lock.stopping = False
        self._emit("leader_started")
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"django-rlock leader {self.group}")
        return self

    async def stop(self, timeout: float | None = None) -> None:
        """Stand down (see ``Leader.stop``) and wait for the campaign's task to end (not when
        called from that task, from a callback)."""
        self._stopping = True
        self._stopped.set()
        self._lock.stopping = True
        task = self._task
        if task is None or task is asyncio.current_task():
            return
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not task.done():
            self._lock.nudge()
            left = 0.05 if end is None else min(0.05, end - loop.time())
            if left <= 0:
                break
            await asyncio.wait({task}, timeout=left)

    async def wait_elected(self, timeout: float | None = None) -> bool:
        """Wait until this process leads (True) or ``timeout`` s pass (False)."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while True:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return self.is_leader()
            try:
                async with asyncio.timeout(left):
                    await self._elected.wait()
            except TimeoutError:
                return self.is_leader()
            if self.is_leader():
                return True
            await asyncio.sleep(0.01)  # elected, but that term is over already: wait on

    async def leader(self) -> LeaderInfo | None:
        """Who leads the group now (any process's leadership; None: nobody)."""
        return await self._lock.read(self.group)  # type: ignore[no-any-return]

    async def __aenter__(self) -> AsyncLeader:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # -- the campaign's task -------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any] | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("django-rlock: a callback of leader %r failed", self.group)

    async def _run(self) -> None:
        lock = self._lock
        owner = lock.current_owner()
        pause = RETRY_MIN
        while not self._stopping:
            try:
                token = await lock.lock_and_get_token()
            except CampaignStopped:
                break
            except Exception as exc:
                logger.warning("django-rlock: leader %r campaign: %s: %s; trying again in "
                               "%.1f s", self.group, type(exc).__name__, exc, pause)
                try:
                    async with asyncio.timeout(pause):
                        await self._stopped.wait()
                    break
                except TimeoutError:
                    pass
                pause = min(pause * 2, RETRY_MAX)
                continue
            pause = RETRY_MIN
            term = self._elect(token, owner)
            if term is None or self._stopping:
                await self._give_back()
                continue
            try:
                self._elected.set()
                self._announce(token)
                await self._call(self.on_elected, token)
                reason = await self._lead(term)
            except Exception:  # a bug here must not leave a believing leader without a task
                logger.exception("django-rlock: leader %r: its watch failed", self.group)
                reason = self._end(term, IN_DOUBT)
            except BaseException:  # cancelled (at asyncio.run's end, too): stand down
                await self._cancelled(term)
                raise
            self._elected.clear()
            self._announce(token, reason)
            await self._call(self.on_revoked, reason)
            await self._give_back()

    async def _cancelled(self, term: Term) -> None:
        """The campaign's task was cancelled while it led: ``asyncio.run`` cancels the tasks
        still running when its coroutine returns (a normal exit without ``stop()``), and so
        does a task group that fails. Stand down as ``stop()`` does (revoked "stopped", the
        key released, a standby elected at once), on a task acting for the campaign's own (the
        key's owner: a task of its own could not release it, and the campaign's end would be
        taken for a lock left held), shielded from a second cancellation."""
        reason = self._end(term, STOPPED)
        self._elected.clear()

        async def stand_down() -> None:
            self._announce(term.token, reason)
            await self._call(self.on_revoked, reason)
            await self._give_back()

        with identity.acting_for(asyncio.current_task()):
            task = asyncio.get_running_loop().create_task(
                stand_down(), name=f"django-rlock leader {self.group} stand-down")
        await asyncio.shield(task)

    async def _give_back(self) -> None:
        try:
            await self._lock.unlock()
        except Exception:
            pass

    async def _lead(self, term: Term) -> str:
        lock = self._lock
        loop = asyncio.get_running_loop()
        slot = lock.watch(loop)
        try:
            confirmed = lock.confirmation(slot, loop)
            if confirmed is not None:
                try:
                    async with asyncio.timeout(max(0.0, min(
                            wait_settings.SUBSCRIBE_TIMEOUT, until(term.hold) - time.monotonic()))):
                        await confirmed
                except TimeoutError:
                    pass
            while True:
                if self._stopping:
                    return self._end(term, STOPPED)
                with self._mu:
                    alive = term.confirmed()
                if not alive:
                    return self._end(term)
                await slot.apark(max(0.0, until(term.hold) - time.monotonic()) + 0.001)
                if slot.waiter.state is not State.SIGNALED:
                    continue
                await slot.aleave()
                slot = lock.watch(loop)
                if self._stopping or term.over:
                    continue
                try:  # never waiting past the doubt (a frozen Redis)
                    async with asyncio.timeout(max(0.0, until(term.hold) - time.monotonic())):
                        ours = await lock.holds(term.owner)
                except Exception:
                    ours = True  # no answer in time: renewal and the clock decide
                if not ours:
                    return self._end(term, LOST)
        finally:
            await slot.aleave()


__all__ = ["AsyncLeader"]
