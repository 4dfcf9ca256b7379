"""Threads and asyncio tasks contending with random budgets and cancellations.

The races this engine had (a hand-off racing the heir's own acquire, a grant racing a leaving
waiter, a release sent on an owner's behalf undoing its next acquire) showed up here as
overlapping critical sections, a false "not owner", or a lock left held.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time

import redis.asyncio

from django_rlock import AsyncRLock, LockNotOwnedError, RLock
from django_rlock.engine import pubsub
from django_rlock.engine.watchdog import watchdog


def test_threads_and_cancelled_tasks_never_overlap(r, redis_server):
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: make the interleavings happen
    stop = time.monotonic() + 5
    guard = threading.Lock()
    inside = [0]
    problems: list[str] = []
    counts = {"sync": 0, "async": 0, "cancelled": 0}

    def enter() -> None:
        with guard:
            inside[0] += 1
            if inside[0] > 1:
                problems.append("overlap")

    def leave() -> None:
        with guard:
            inside[0] -= 1

    def thread_worker() -> None:
        lock = RLock(r, "stress", watchdog_timeout=4)
        while time.monotonic() < stop:
            if lock.try_lock(wait_time=random.choice([0, 0.001, 0.003, 0.01])):
                enter()
                leave()
                try:
                    lock.unlock()
                except LockNotOwnedError:
                    problems.append("thread lost its lock")
                counts["sync"] += 1

    async def task_worker(client: redis.asyncio.Redis) -> None:
        lock = AsyncRLock(client, "stress", watchdog_timeout=4)
        while time.monotonic() < stop:
            try:
                async with asyncio.timeout(random.choice([0.0005, 0.002, 0.01])):
                    ok = await lock.try_lock(wait_time=random.choice([0, 0.005, 1]))
            except TimeoutError:
                counts["cancelled"] += 1
                continue
            if ok:
                enter()
                await asyncio.sleep(0)
                leave()
                try:
                    await lock.unlock()
                except LockNotOwnedError:
                    problems.append("task lost its lock")
                counts["async"] += 1

    async def tasks() -> None:
        client = redis.asyncio.Redis(unix_socket_path=redis_server.socket, max_connections=32)
        await asyncio.gather(*(task_worker(client) for _ in range(6)))
        await client.aclose()

    workers = [threading.Thread(target=thread_worker) for _ in range(4)]
    workers.append(threading.Thread(target=lambda: asyncio.run(tasks())))
    try:
        for t in workers:
            t.start()
        for t in workers:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
    assert problems == []
    assert counts["sync"] > 50 and counts["async"] > 50, counts
    # A last release may grant the lock to a task whose wait was cancelled as the loop shut
    # down (its withdrawal never ran): that grant costs at most its short lease (invariant 23).
    end = time.monotonic() + pubsub.GRANT_LEASE + 2.0
    while (r.exists("stress") or watchdog().renewing()) and time.monotonic() < end:
        time.sleep(0.05)
    assert not r.exists("stress") and watchdog().renewing() == 0
