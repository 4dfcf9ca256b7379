"""What the asyncio side's pool and its idle-connection poll cost (issue #23).

    python bench/aiopool.py [--rounds 9] [--calls 3000]

On a private unix-socket redis-server, in one process and one event loop, interleaved in
rounds (so load coming and going on a shared machine lands on all alike), the median over
rounds of each round's mean:

- a checkout and release on redis-py's ``ConnectionPool`` (what the asyncio twin had: it
  raises when full), its ``BlockingConnectionPool`` (waits, through a condition taken on every
  checkout and release) and ``aiopool.TwinPool`` (waits, queueing only when full);
- ``aiopool.closed_while_idle`` on a connected, idle connection (the poll ``acall_once`` runs
  before each script);
- an uncontended ``AsyncRLock`` lock+unlock pair (two scripts) on an asyncio client whose pool
  is each of the three, and on a ``TwinPool`` with the poll switched off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import redis.asyncio

from django_rlock.engine import AsyncRLock, scripts
from django_rlock.engine.aiopool import TwinPool, closed_while_idle
from django_rlock.testing import RedisServer


async def measure(server: RedisServer, rounds: int, calls: int) -> dict[str, float]:
    sync = server.client()
    kw: dict[str, Any] = {"connection_class": redis.asyncio.UnixDomainSocketConnection,
                          "path": server.socket}
    pools = {"ConnectionPool": redis.asyncio.ConnectionPool(max_connections=100, **kw),
             "BlockingConnectionPool": redis.asyncio.BlockingConnectionPool(
                 max_connections=100, timeout=None, **kw),
             "TwinPool": TwinPool(100, **kw)}
    locks = {name: AsyncRLock(redis.asyncio.Redis(connection_pool=pool), f"bench:{name}",
                              sync_client=sync, sync_replicas=None)
             for name, pool in pools.items()}
    idle = await pools["TwinPool"].get_connection()
    poll = scripts.closed_while_idle

    def no_poll(conn: Any) -> bool:
        return False

    async def checkout(pool: Any) -> None:
        await pool.release(await pool.get_connection())

    async def pair(lock: AsyncRLock) -> None:
        await lock.lock()
        await lock.unlock()

    async def pair_without_poll() -> None:
        scripts.closed_while_idle = no_poll  # type: ignore[attr-defined]
        try:
            await pair(locks["TwinPool"])
        finally:
            scripts.closed_while_idle = poll  # type: ignore[attr-defined]

    async def polled() -> None:
        closed_while_idle(idle)

    cases: dict[str, Callable[[], Awaitable[None]]] = {}
    for name, pool in pools.items():
        cases[f"checkout+release: {name}"] = lambda pool=pool: checkout(pool)
    cases["closed_while_idle (one poll)"] = polled
    for name, lock in locks.items():
        cases[f"lock+unlock: {name}"] = lambda lock=lock: pair(lock)
    cases["lock+unlock: TwinPool, no poll"] = pair_without_poll
    means: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(rounds):
        order = list(cases.items())
        order = order[r % len(order):] + order[:r % len(order)]
        for name, case in order:
            for _ in range(calls // 10):  # warm
                await case()
            t = time.perf_counter_ns()
            for _ in range(calls):
                await case()
            means[name].append((time.perf_counter_ns() - t) / calls / 1000)
    await pools["TwinPool"].release(idle)
    sync.close()
    return {k: statistics.median(v) for k, v in means.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    with RedisServer() as server:
        out = asyncio.run(measure(server, args.rounds, args.calls))
    print("| what | us per call (median of rounds) |\n|---|---|")
    for name, us in out.items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
