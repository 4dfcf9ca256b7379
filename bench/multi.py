"""What MultiLock and RedLock cost: uncontended lock+unlock pairs, p50/p99, against the floor.

    python bench/multi.py [--seconds 1.5] [--rounds 5]

A MultiLock over N servers pays a pair per member. The sync classes take the members one by
one, so their floor is N x the floor (two EVALSHA of ``return 1``, bench/clients.py FLOOR, on
each of N servers in turn); the asyncio twins take them concurrently, so theirs is one event
loop turn over N concurrent floors. Variants:

- the floor on one server, and 3x / 5x it (the floors of 3 and 5 servers, in turn);
- the asyncio floors: 3 and 5 concurrent floors (``asyncio.gather``), one ``run_until_complete``
  per pair, as the asyncio locks are timed;
- ``RLock`` (one server), ``MultiLock`` over 3, ``RedLock`` over 5 (members one by one);
- ``AsyncRLock``, ``AsyncMultiLock`` over 3, ``AsyncRedLock`` over 5 (members concurrently).

Variants take turns in 0.1 s slices, in a rotated order, so that machine noise lands on all
alike; p50/p99 are over every pair of a variant, the ratio is the median of per-slice ratios.
Every server is the benchmark's own (unix sockets, no TCP port).

On local sockets a round trip is mostly client CPU, which concurrency cannot overlap (one
Python process, one core for it). ``--delay-ms 1`` puts a proxy (a thread with its own event
loop) in front of every server that holds each chunk, each way, that long: a network round trip
of 2 ms, the case the concurrent members are for. By default both tables are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

from bench.clients import FLOOR_SCRIPT  # noqa: E402
from bench.replica import SLICE, latencies  # noqa: E402
from bench.stats import median, percentile  # noqa: E402
from django_rlock import (  # noqa: E402
    AsyncMultiLock,
    AsyncRedLock,
    AsyncRLock,
    MultiLock,
    RedLock,
    RLock,
)
from django_rlock.testing import RedisServer  # noqa: E402


class DelayProxy:
    """Unix-socket proxies that deliver every chunk ``delay`` seconds late, each way, in order."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.dir = tempfile.mkdtemp(prefix="rlock-bench-proxy-")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def front(self, target: str) -> str:
        """A socket path that reaches ``target`` through the delay."""
        path = os.path.join(self.dir, f"{len(os.listdir(self.dir))}.sock")

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_r, up_w = await asyncio.open_unix_connection(target)
            try:
                await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer),
                                     return_exceptions=True)
            except asyncio.CancelledError:
                pass  # the proxy is closing: the streams' callback must not see a cancel
            finally:
                writer.close()
                up_w.close()

        asyncio.run_coroutine_threadsafe(asyncio.start_unix_server(handle, path),
                                         self.loop).result(10)
        return path

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                if not data:
                    writer.close()
                    return
                if at > loop.time():
                    await asyncio.sleep(at - loop.time())
                writer.write(data)
                await writer.drain()

        out = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.delay, data))
            queue.put_nowait((0.0, b""))
            await out
        finally:
            out.cancel()

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def sync_pair(lock: Any) -> Callable[[], None]:
    def step() -> None:
        lock.lock()
        lock.unlock()
    return step


def on_loop(loop: asyncio.AbstractEventLoop,
            make: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """One pair per ``run_until_complete``: each pair is its own task, as a request would be."""
    def step() -> None:
        loop.run_until_complete(make())
    return step


def async_pair(loop: asyncio.AbstractEventLoop, lock: Any) -> Callable[[], None]:
    async def once() -> None:
        await lock.lock()
        await lock.unlock()
    return on_loop(loop, once)


def run(sockets: list[str], seconds: float, rounds: int, delay_ms: float) -> None:
    """Time every variant over clients on ``sockets`` and print one table."""
    loop = asyncio.new_event_loop()
    try:
        plain = [redis.Redis(unix_socket_path=p) for p in sockets]
        aplain = [redis.asyncio.Redis(unix_socket_path=p) for p in sockets]
        sha = plain[0].script_load(FLOOR_SCRIPT)
        for c in plain[1:]:
            c.script_load(FLOOR_SCRIPT)

        def floor(n: int) -> Callable[[], None]:
            def step() -> None:
                for c in plain[:n]:
                    c.evalsha(sha, 1, "bench:floor")
                    c.evalsha(sha, 1, "bench:floor")
            return step

        def afloor(n: int) -> Callable[[], None]:
            async def one(c: redis.asyncio.Redis) -> None:
                await c.evalsha(sha, 1, "bench:floor")
                await c.evalsha(sha, 1, "bench:floor")

            async def all_() -> None:
                await asyncio.gather(*(one(c) for c in aplain[:n]))
            return on_loop(loop, all_)

        def amembers(n: int, name: str) -> list[AsyncRLock]:
            return [AsyncRLock(aplain[i], name, sync_client=plain[i]) for i in range(n)]

        variants: dict[str, tuple[Callable[[], None], int]] = {  # step, its floor's N
            "floor: 2 x EVALSHA, one server": (floor(1), 1),
            "3x floor: 3 servers in turn": (floor(3), 3),
            "5x floor: 5 servers in turn": (floor(5), 5),
            "RLock": (sync_pair(RLock(plain[0], "bench:r")), 1),
            "MultiLock over 3, one by one": (
                sync_pair(MultiLock(*(RLock(c, "bench:m") for c in plain[:3]))), 3),
            "RedLock over 5, one by one": (
                sync_pair(RedLock(*(RLock(c, "bench:q") for c in plain))), 5),
            "asyncio floor: one server": (afloor(1), 1),
            "asyncio floor: 3 servers concurrently": (afloor(3), 3),
            "asyncio floor: 5 servers concurrently": (afloor(5), 5),
            "AsyncRLock": (async_pair(loop, amembers(1, "bench:ar")[0]), 1),
            "AsyncMultiLock over 3, concurrently": (
                async_pair(loop, AsyncMultiLock(*amembers(3, "bench:am"))), 3),
            "AsyncRedLock over 5, concurrently": (
                async_pair(loop, AsyncRedLock(*amembers(5, "bench:aq"))), 5),
        }
        names = list(variants)
        warm = 300 if not delay_ms else 30
        for step, _ in variants.values():  # warm up: connections, scripts, replica probes
            for _ in range(warm):
                step()
        gc.collect()
        samples: dict[str, list[int]] = {k: [] for k in names}
        ratios: dict[str, list[float]] = {k: [] for k in names}
        slices = max(1, round(seconds / SLICE))
        for r in range(rounds * slices):
            order = names[r % len(names):] + names[:r % len(names)]
            this: dict[str, float] = {}
            for name in order:
                lat = latencies(variants[name][0], SLICE)
                samples[name].extend(lat)
                this[name] = percentile(sorted(lat), 50)
            for name in names:
                ratios[name].append(this[name] / this[names[0]])
        for lat in samples.values():
            lat.sort()

        version = plain[0].info("server")["redis_version"]
        where = (f"through a proxy adding {delay_ms:g} ms each way" if delay_ms
                 else "unix sockets, no added delay")
        print(f"\n{rounds} rounds x {seconds:g} s per variant in {SLICE:g} s slices, "
              f"redis-server {version}, 5 servers, {where}, hiredis "
              f"{'on' if redis.utils.HIREDIS_AVAILABLE else 'off'}")
        print("p50/p99 over every pair; p50 / floor: the median of the per-slice ratios "
              "against the one-server sync floor")
        print(f"| {'variant':38} | {'servers':>7} | {'p50 us':>8} | {'p99 us':>8} | "
              f"{'p50 / floor':>11} |")
        print(f"|{'-' * 40}|{'-' * 9}|{'-' * 10}|{'-' * 10}|{'-' * 13}|")
        for name in names:
            print(f"| {name:38} | {variants[name][1]:7} | "
                  f"{percentile(samples[name], 50) / 1e3:8.1f} | "
                  f"{percentile(samples[name], 99) / 1e3:8.1f} | {median(ratios[name]):10.2f}x |")
        for c in aplain:
            loop.run_until_complete(c.aclose())
        for c in plain:
            c.close()
    finally:
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="per variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 1.0],
                    help="one-way delay added by a proxy (0: direct); a table for each")
    args = ap.parse_args()

    servers = [RedisServer().start() for _ in range(5)]
    try:
        for delay_ms in args.delay_ms:
            if not delay_ms:
                run([s.socket for s in servers], args.seconds, args.rounds, 0.0)
                continue
            proxy = DelayProxy(delay_ms / 1000.0)
            try:
                run([proxy.front(s.socket) for s in servers], args.seconds, args.rounds,
                    delay_ms)
            finally:
                proxy.close()
                time.sleep(0.1)  # the proxied connections' owners (watchdog, pools) let go
    finally:
        for s in servers:
            s.stop()
            shutil.rmtree(s.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
