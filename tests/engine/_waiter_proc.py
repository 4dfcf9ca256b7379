"""A waiter in a process of its own, run by tests/engine/test_waiters.py:
`python -m tests.engine._waiter_proc KIND SOCKET NAME sync|async`.

Reads commands from stdin, one a line, and answers on stdout (flushed):

- ``wait SECONDS`` (``inf``: no limit): prints ``waiting``, then waits for KIND's NAME as a
  waiter does (a lock, a permit, the latch to open, permits of a rate limiter, the leadership),
  in a thread named ``waiter-<KIND>`` (async: a task named ``task-<KIND>``); prints
  ``acquired`` (and gives back what it took: a lock, a permit; a leader stands down) or
  ``timeout``.
- ``ping``: prints ``pong`` (the process is ready);
- ``quit``: exits.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import redis
import redis.asyncio

from django_rlock.engine.aio import AsyncRLock
from django_rlock.engine.fair import FairLock
from django_rlock.engine.fenced import FencedLock
from django_rlock.engine.latch import CountDownLatch
from django_rlock.engine.leader import Leader
from django_rlock.engine.lock import RLock
from django_rlock.engine.permits import PermitExpirableSemaphore
from django_rlock.engine.ratelimit import RateLimiter
from django_rlock.engine.rwlock import ReadWriteLock
from django_rlock.engine.semaphore import AsyncSemaphore, Semaphore

PREFIX = "w:"


def wait_sync(kind: str, client: Any, name: str, budget: float | None) -> bool:
    w = 3600.0 if budget is None else budget
    if kind in ("lock", "fair", "fenced", "read"):
        lock: Any = {"lock": RLock, "fair": FairLock, "fenced": FencedLock}.get(kind)
        lk = (ReadWriteLock(client, name, PREFIX).read_lock() if lock is None
              else lock(client, name, PREFIX))
        if lk.try_lock(w):
            lk.unlock()
            return True
        return False
    if kind == "semaphore":
        sem = Semaphore(client, name, PREFIX)
        if sem.try_acquire(1, w):
            sem.release(1)
            return True
        return False
    if kind == "permits":
        pes = PermitExpirableSemaphore(client, name, PREFIX)
        pid = pes.try_acquire(w)
        if pid is not None:
            pes.release(pid)
            return True
        return False
    if kind == "latch":
        return CountDownLatch(client, name, PREFIX).wait(w)
    if kind == "rate":
        return RateLimiter(client, name, PREFIX).try_acquire(1, w)
    if kind == "leader":
        leader = Leader(client, name, PREFIX).start()
        try:
            return leader.wait_elected(w)
        finally:
            leader.stop()
    raise ValueError(kind)


async def wait_async(kind: str, sock: str, name: str, budget: float | None) -> bool:
    client = redis.asyncio.Redis(unix_socket_path=sock)
    w = 3600.0 if budget is None else budget
    try:
        if kind == "lock":
            lk = AsyncRLock(client, name, PREFIX)
            if await lk.try_lock(w):
                await lk.unlock()
                return True
            return False
        if kind == "semaphore":
            sem = AsyncSemaphore(client, name, PREFIX)
            if await sem.try_acquire(1, w):
                await sem.release(1)
                return True
            return False
        raise ValueError(kind)
    finally:
        await client.aclose()


def main() -> None:
    kind, sock, name, mode = sys.argv[1:5]
    client = redis.Redis(unix_socket_path=sock)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            return
        if cmd == "ping":  # started (its imports done)
            print("pong", flush=True)
            continue
        budget = None if arg == "inf" else float(arg)
        out: list[bool] = []
        if mode == "async":
            def run() -> None:
                async def named() -> bool:
                    task = asyncio.create_task(wait_async(kind, sock, name, budget),
                                               name=f"task-{kind}")
                    return await task

                out.append(asyncio.run(named()))
        else:
            def run() -> None:
                out.append(wait_sync(kind, client, name, budget))

        t = threading.Thread(target=run, name=f"waiter-{kind}")
        print("waiting", flush=True)
        t.start()
        t.join()
        print("acquired" if out and out[0] else "timeout", flush=True)


if __name__ == "__main__":
    main()
