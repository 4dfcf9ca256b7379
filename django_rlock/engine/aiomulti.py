"""AsyncMultiLock and AsyncRedLock: ``MultiLock`` / ``RedLock`` over ``AsyncRLock``s.

Members are taken concurrently, each in a child task acting for the caller (so the holds are
the calling task's): one round trip of wall time, not N. A round stops as soon as it cannot
succeed and gives back what it took, also on cancellation. Refusals and failures are told
apart as in ``multi``: only a refusal is waited out.
"""

from __future__ import annotations

import asyncio
import random
import time
from types import TracebackType
from typing import Any

from . import identity
from .aio import AsyncRLock
from .lock import check_seconds
from .multi import MEMBER_ERRORS, MIN_MEMBER_WAIT, ROUND_PER_MEMBER, MultiLock, RedLock
from .scripts import RENEW_SCRIPT, acall_once


class AsyncMultiLock(MultiLock):
    """``MultiLock`` over ``AsyncRLock``s: members are taken concurrently (one round trip of
    wall time, not N), each in a child task acting for the caller, so the holds are the
    calling task's. A round that can no longer succeed (a member refused or failed) stops the
    others at once and gives back what was taken; a cancelled acquire does the same before the
    cancellation goes on. Members' errors raise as in ``MultiLock``. ``await lock()``,
    ``await try_lock(...)``, ``await unlock()``, ``await is_held_by_current_task()``,
    ``async with``."""

    _member_type = AsyncRLock

    async def lock(self, lease_time: float | None = None) -> None:  # type: ignore[override]
        lease = self._lease(lease_time)
        while not await self._aacquire(ROUND_PER_MEMBER * len(self.locks), lease):
            pass

    async def try_lock(self, wait_time: float = 0.0,  # type: ignore[override]
                       lease_time: float | None = None) -> bool:
        wait = check_seconds(wait_time, "wait_time", self.name, zero_ok=True)
        return await self._aacquire(wait, self._lease(lease_time))

    async def acquire(self, blocking: bool = True,  # type: ignore[override]
                      timeout: float = -1) -> bool:
        if not blocking:
            if timeout != -1:
                raise ValueError(f"can't specify a timeout for a non-blocking call ({self!r})")
            return await self.try_lock()
        if timeout == -1:
            await self.lock()
            return True
        return await self.try_lock(timeout)

    def _spawn(self, coros: list[Any]) -> list[asyncio.Future[Any]]:
        # Created inside acting_for: the child tasks copy the context, so they act for us.
        with identity.acting_for(asyncio.current_task()):
            return [asyncio.ensure_future(c) for c in coros]

    def _grace(self, took: float) -> float:
        """How long members still out may finish once the round has enough (RedLock)."""
        return 0.0

    async def _round(self, wait: float, member_lease: float | None) -> list[Any]:
        """One concurrent round; the members it took. It stops early (the rest cancelled,
        which gives back what they took) once it cannot succeed, or has enough and the
        stragglers' grace is over; members' errors beyond what the quorum tolerates raise."""
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        tasks = self._spawn([m.try_lock(wait, member_lease) for m in self.locks])
        index = {t: i for i, t in enumerate(tasks)}
        allowed = len(tasks) - self.quorum
        settled = loop.create_future()
        counts = [0, 0]  # held; refused or failed
        errors: dict[int, BaseException] = {}  # in the order they came
        timer: list[asyncio.TimerHandle] = []

        def settle() -> None:
            if not settled.done():
                settled.set_result(None)

        def on_done(task: asyncio.Future[Any]) -> None:  # one callback, not a wait() per reply
            if not task.cancelled() and isinstance(task.exception(), MEMBER_ERRORS):
                errors[index[task]] = task.exception()  # type: ignore[assignment]
            if settled.done():
                return
            counts[0 if _took(task) else 1] += 1
            if counts[1] > allowed or sum(counts) == len(tasks):
                settle()
            elif counts[0] >= self.quorum and not timer:
                timer.append(loop.call_later(self._grace(time.monotonic() - start), settle))

        for t in tasks:
            t.add_done_callback(on_done)
        try:
            await settled
        except BaseException:
            await self._stop(tasks)
            await self._arelease([m for m, t in zip(self.locks, tasks, strict=True) if _took(t)])
            raise
        finally:
            for h in timer:
                h.cancel()
        await self._stop(tasks)
        taken = [m for m, t in zip(self.locks, tasks, strict=True) if _took(t)]
        for i, t in enumerate(tasks):
            exc = None if t.cancelled() else t.exception()
            if exc is not None and not isinstance(exc, MEMBER_ERRORS):  # a bug, not a failure
                await self._arelease(taken)
                raise exc
            if exc is not None:
                errors.setdefault(i, exc)
        if len(errors) > allowed:
            await self._arelease(taken)
            raise self._failed(errors)
        return taken

    @staticmethod
    async def _stop(tasks: list[asyncio.Future[Any]]) -> None:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()  # a member's cancelled acquire gives back what it took (engine)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _aacquire(self, wait: float, lease: float | None) -> bool:
        deadline = time.monotonic() + wait
        member_lease = self._member_lease(lease, wait)
        while True:
            start = time.monotonic()
            # Concurrent: every member may use the whole remaining budget.
            taken = await self._round(max(0.0, deadline - start), member_lease)
            if len(taken) >= self.quorum and self._still_valid(start, lease):
                if lease is not None and member_lease != lease:
                    await asyncio.gather(*(
                        acall_once(m.client, RENEW_SCRIPT, (m.key,), args)
                        for m, args in self._lease_targets(taken, lease)), return_exceptions=True)
                with self._lost_guard:
                    self._lost_members.clear()
                return True
            await self._arelease(taken)
            now = time.monotonic()
            if wait == 0 or now >= deadline:
                return False
            await asyncio.sleep(min(deadline - now, random.uniform(0.005, 0.05)))

    async def _arelease(self, taken: list[Any]) -> None:
        if taken:
            await asyncio.gather(*self._spawn([m.unlock() for m in taken]),
                                 return_exceptions=True)

    async def _aunlock_all(self) -> dict[int, BaseException]:
        results = await asyncio.gather(*self._spawn([m.unlock() for m in self.locks]),
                                       return_exceptions=True)
        return {i: r for i, r in enumerate(results) if isinstance(r, MEMBER_ERRORS)}

    async def unlock(self) -> None:  # type: ignore[override]
        """Release every member concurrently; then raise as ``MultiLock.unlock``."""
        self._raise_for(await self._aunlock_all())

    release = unlock  # type: ignore[assignment]

    async def remaining_ttl(self) -> float | None:  # type: ignore[override]
        """The longest lease left among the members."""
        ttls = await asyncio.gather(*(m.remaining_ttl() for m in self.locks),
                                    return_exceptions=True)
        known = [t for t in ttls if isinstance(t, float)]
        return max(known) if known else None

    async def is_held_by_current_task(self) -> bool:
        """Whether this task holds enough members (all; RedLock: a majority)."""
        held = await asyncio.gather(*self._spawn([m.is_held_by_current_task()
                                                  for m in self.locks]), return_exceptions=True)
        return sum(h is True for h in held) >= self.quorum

    def is_held_by_current_thread(self) -> bool:
        raise TypeError(f"{self!r} is owned by a task: await is_held_by_current_task()")

    def __enter__(self) -> MultiLock:
        raise TypeError(f"{self!r} is an asyncio lock: use 'async with'")

    async def __aenter__(self) -> AsyncMultiLock:
        await self.lock()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.unlock()


def _took(task: asyncio.Future[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None and task.result()


class AsyncRedLock(AsyncMultiLock, RedLock):
    """``RedLock`` over ``AsyncRLock``s, members taken concurrently (see ``RedLock``). Once a
    majority holds, members still out get as long again as that took (at least
    ``MIN_MEMBER_WAIT``) and are then given up: a busy member never costs the whole budget."""

    def _grace(self, took: float) -> float:
        return max(took, MIN_MEMBER_WAIT)


__all__ = ["AsyncMultiLock", "AsyncRedLock"]
