"""The asyncio side of a fault worker: ``--loops`` threads, each running an event loop of its
own with ``--tasks`` tasks that loop over sections as the worker's threads do.

A task takes an ``AsyncRLock`` (kind ``aio``) or an ``AsyncFairLock`` (kind ``afair``) on a
``redis.asyncio`` client named ``rlock-fault:<wid>`` (so ``kill_conns`` hits it, and the sync
twin the engine derives from it for renewal and waiting carries the name too), and does what
a careful asyncio user does: the same read-modify-write of the lock's counter in the store
(on a ``redis.asyncio`` client of the store), skipped if ``is_lost()`` is true just before,
and the same history records. The owner of a hold is the task, so each task is a "thread"
for the checker: its number is ``100 + 10 * loop + task``, apart from the threads' ``0..``.

``aio``'s last lock is ``rlock:0``, which the ``rlock`` threads take too, and ``afair`` takes
``fair``'s locks: tasks and threads of several processes wait in one line (wake lines and
process grant channels, hand-offs between them; the fair queue).

SIGSTOP and SIGKILL stop or end the whole process, event loops included: a task is told
(``is_lost()`` before its write or at its exit) exactly as a thread is.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio

from django_rlock.engine import AsyncFairLock, AsyncRLock
from tests.faults.worker import BREAK, FENCE_LUA, lock_name, pick, where

if TYPE_CHECKING:
    from tests.faults.worker import Worker


class NaiveAsyncLock:
    """``NaiveLock`` for asyncio (``RLOCK_FAULTS_BREAK=naive``): SET NX PX with a fixed lease,
    unlock a plain DEL, no watchdog, never told it lost anything."""

    def __init__(self, client: Any, name: str, lease: float) -> None:
        self.client, self.key, self.lease_ms = client, "naive:" + name, int(lease * 1000)
        self.mine = ""

    async def try_lock(self, wait_time: float = 0.0) -> bool:
        deadline = time.monotonic() + wait_time
        self.mine = f"{os.getpid()}:{id(asyncio.current_task())}:{time.monotonic()}"
        while True:
            if await self.client.set(self.key, self.mine, nx=True, px=self.lease_ms):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.002)

    async def unlock(self) -> None:
        await self.client.delete(self.key)

    def is_lost(self) -> bool:
        return False

    async def is_held_by_current_task(self) -> bool:
        return await self.client.get(self.key) == self.mine.encode()


class Tasks:
    """One event loop's tasks (run by ``loop_thread``)."""

    def __init__(self, worker: Worker, li: int) -> None:
        self.w, self.li = worker, li
        args = worker.args
        self.client = redis.asyncio.Redis(unix_socket_path=args.lock,
                                          client_name=f"rlock-fault:{worker.wid}")
        self.store = redis.asyncio.Redis(unix_socket_path=args.store)
        self.fence = self.store.register_script(FENCE_LUA)
        self.locks: dict[tuple[int, str, int], Any] = {}

    def lock_for(self, ti: int, kind: str, i: int) -> Any:
        k = (ti, kind, i)
        if k not in self.locks:
            name, wt = lock_name(kind, i), self.w.args.lease
            if BREAK == "naive":
                self.locks[k] = NaiveAsyncLock(self.client, name, wt)
            elif kind == "aio":
                self.locks[k] = AsyncRLock(self.client, name, watchdog_timeout=wt)
            else:
                self.locks[k] = AsyncFairLock(self.client, name, watchdog_timeout=wt)
        return self.locks[k]

    @staticmethod
    def lost(lock: Any) -> bool:
        return False if BREAK == "ignore-lost" else bool(lock.is_lost())

    @staticmethod
    async def held(lock: Any) -> bool | None:
        try:
            return bool(await lock.is_held_by_current_task())
        except Exception:
            return None

    async def section(self, ti: int, seq: int, rng: random.Random) -> None:
        w = self.w
        kind, i, budget = pick(rng, w.async_kinds)
        name = lock_name(kind, i)
        lock = self.lock_for(ti, kind, i)
        sid = f"{w.wid}.{ti}.{seq}"
        t_try = time.monotonic()
        try:
            got = await lock.try_lock(wait_time=budget)
        except Exception as exc:
            w.write({"t": "A", "sid": sid, "kind": kind, "lock": name, "t_try": t_try,
                     "budget": budget, "at": time.monotonic(), "err": type(exc).__name__,
                     "where": where(exc)})
            await asyncio.sleep(0.02)
            return
        if not got:
            rec: dict[str, Any] = {"t": "F", "sid": sid, "kind": kind, "lock": name,
                                   "t_try": t_try, "budget": budget, "at": time.monotonic()}
            rec["held"] = await self.held(lock)
            if rec["held"]:
                try:
                    await lock.unlock()
                    rec["cleanup"] = True
                except Exception as exc:
                    rec["cleanup"] = type(exc).__name__
            w.write(rec)
            return
        enter = time.monotonic()
        w.write({"t": "E", "sid": sid, "pid": os.getpid(), "wid": w.wid, "thread": ti,
                 "kind": kind, "lock": name, "t_try": t_try, "budget": budget, "enter": enter,
                 "token": None})
        rec = {"t": "X", "sid": sid}
        try:
            key = "c:" + name
            value = int(await self.store.get(key) or 0)
            await asyncio.sleep(rng.uniform(0.001, 0.01))
            rec["lost_before"] = lost = self.lost(lock)
            if not lost:
                async with self.store.pipeline(transaction=True) as p:
                    p.set(key, value + 1)
                    p.rpush("log:" + name, f"{sid} {value}")
                    await p.execute()
                rec["wrote"] = value
                rec["t_write"] = time.monotonic()
            if rng.random() < 0.1:
                await asyncio.sleep(rng.uniform(0.05, 0.3))  # now and then a longer hold
        except Exception as exc:
            rec["err"] = type(exc).__name__
        rec["held"] = await self.held(lock)
        rec["lost_at_exit"] = self.lost(lock)
        rec["exit"] = time.monotonic()
        w.write(rec)
        done: dict[str, Any] = {"t": "R", "sid": sid}
        try:
            await lock.unlock()
            done["released"] = True
        except Exception as exc:
            done["released"], done["where"] = type(exc).__name__, where(exc)
        w.write(done)

    async def loop(self, ti: int) -> None:
        rng = random.Random(f"{self.w.args.seed}:{self.w.wid}:{ti}")
        seq = 0
        while not self.w.stop.is_set():
            seq += 1
            try:
                await self.section(ti, seq, rng)
            except Exception as exc:  # never let a task die: the run would quietly shrink
                self.w.write({"t": "B", "sid": f"{self.w.wid}.{ti}.{seq}", "err": repr(exc)})
                await asyncio.sleep(0.05)
            await asyncio.sleep(rng.uniform(0, 0.005))

    async def main(self) -> None:
        try:
            await asyncio.gather(*(self.loop(100 + 10 * self.li + k)
                                   for k in range(self.w.args.tasks)))
        finally:
            await self.client.aclose()
            await self.store.aclose()


def loop_thread(worker: Worker, li: int) -> None:
    """A thread's event loop with its tasks, until the worker is told to stop."""
    asyncio.run(Tasks(worker, li).main())
