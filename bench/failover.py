"""The price of surviving a Redis failure: uncontended lock+unlock pairs, p50, vs the floor.

    python bench/failover.py [--seconds 1.5] [--rounds 3]

Variants, interleaved in every round: the floor (two EVALSHA of ``return 1``) on a master
without replica; ``RLock`` there; ``RLock`` on a master with one replica (replica sync: WAIT in
the same round trip); ``RLock`` there with the check off; ``MultiLock`` over 3 and ``RedLock``
over 5 independent servers, members taken one by one, and their asyncio twins (members taken
concurrently, one event loop, ``run_until_complete`` per pair) next to 3x and 5x the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis.asyncio  # noqa: E402

from bench.stats import median, step_p50_us  # noqa: E402
from django_rlock import (  # noqa: E402
    AsyncMultiLock,
    AsyncRedLock,
    AsyncRLock,
    MultiLock,
    RedLock,
    RLock,
)
from django_rlock.engine.replicas import online  # noqa: E402
from django_rlock.testing import RedisServer, free_port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    master = RedisServer(port=free_port(), args=["--repl-diskless-sync-delay", "0"]).start()
    replica = RedisServer(port=free_port(), args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    alone = [RedisServer().start() for _ in range(5)]
    servers = [master, replica, *alone]
    try:
        m = master.client()
        deadline = time.monotonic() + 10
        while online(m.info("replication")) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        plain = [s.client() for s in alone]
        sha = plain[0].script_load("return 1")

        def floor() -> None:
            plain[0].evalsha(sha, 1, "f")
            plain[0].evalsha(sha, 1, "f")

        loop = asyncio.new_event_loop()
        aplain = [redis.asyncio.Redis(unix_socket_path=s.socket) for s in alone]

        def apair(loop, lock):
            async def once() -> None:
                await lock.lock()
                await lock.unlock()

            def step() -> None:
                loop.run_until_complete(once())
            return step

        def pair(lock):
            def step() -> None:
                lock.lock()
                lock.unlock()
            return step

        variants = {
            "floor (no replica)": floor,
            "RLock, no replica": pair(RLock(plain[0], "b")),
            "RLock, 1 replica, replica sync": pair(RLock(m, "b")),
            "RLock, 1 replica, sync off": pair(RLock(m, "b2", sync_replicas=None)),
            "MultiLock over 3 (one by one)": pair(MultiLock(*(RLock(c, "b") for c in plain[:3]))),
            "RedLock over 5 (one by one)": pair(RedLock(*(RLock(c, "b") for c in plain))),
            "AsyncMultiLock over 3 (concurrent)": apair(
                loop, AsyncMultiLock(*(AsyncRLock(c, "b2") for c in aplain[:3]))),
            "AsyncRedLock over 5 (concurrent)": apair(
                loop, AsyncRedLock(*(AsyncRLock(c, "b2") for c in aplain))),
        }
        got: dict[str, list[float]] = {k: [] for k in variants}
        ratio: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            base = 0.0
            for name, step in variants.items():
                v = step_p50_us(step, args.seconds)
                base = base or v
                got[name].append(v)
                ratio[name].append(v / base)
        version = m.info()["redis_version"]
        print(f"{args.rounds} rounds x {args.seconds} s per variant, redis-server {version}")
        print(f"{'variant':34}  {'p50 us':>8}  {'p50 / floor':>11}")
        for name in variants:
            print(f"{name:34}  {median(got[name]):8.1f}  {median(ratio[name]):10.2f}x")
    finally:
        for s in servers:
            s.stop()
            shutil.rmtree(s.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
