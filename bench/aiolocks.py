"""The asyncio path against its floor and redis.asyncio's ``Lock`` (issue #22).

    python bench/aiolocks.py [--rounds 5] [--seconds 2] [--code PATH]

On a private redis-server, over a unix socket and over loopback TCP, in one run:

- one task, uncontended lock+unlock pairs: the floor (two ``await client.evalsha`` of
  ``return 1`` on ``redis.asyncio``), ``AsyncRLock`` (watchdog mode) and ``redis.asyncio``'s
  ``Lock(timeout=30)``, in interleaved blocks of 50 pairs, each on its own client; the p50 of
  each round, its ratio to the floor's in that round, medians over rounds;
- contention on one key: 1 process x 16 tasks and 4 processes x 16 tasks, each task looping
  acquire, ~1 ms hold (``asyncio.sleep``), release, for ``--seconds`` per library: per
  acquisition, the server commands and server CPU (``INFO commandstats`` delta: calls and
  usec, the commands run inside scripts included) and the client processes' CPU
  (``time.process_time``); the worst wait of any acquisition. ``--threads`` splits the
  client CPU into the event loop thread's and the other threads' (the pub/sub listener's),
  with the context switches per acquisition (Linux).

``--code PATH``: import ``django_rlock`` from another checkout (a before/after comparison
runs this file twice, once per checkout). ``--layouts 4x16`` and ``--transports unix`` run
part of it (a run that looked disturbed is repeated in a minute, not in four).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _paths(code: str | None) -> None:
    for p in (str(ROOT), code):
        if p and p not in sys.path:
            sys.path.insert(0, p)


def _clients(where: dict[str, Any], n: int) -> list[Any]:
    import redis.asyncio
    if where.get("port"):
        return [redis.asyncio.Redis(host="127.0.0.1", port=where["port"]) for _ in range(n)]
    return [redis.asyncio.Redis(unix_socket_path=where["socket"]) for _ in range(n)]


def _sync(where: dict[str, Any]) -> Any:
    import redis
    if where.get("port"):
        return redis.Redis(host="127.0.0.1", port=where["port"])
    return redis.Redis(unix_socket_path=where["socket"])


async def _pairs(where: dict[str, Any], rounds: int, seconds: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in range(rounds):
        p50 = await _round(where, r, seconds)
        for k, v in p50.items():
            out.setdefault(k, []).append(v)
            out.setdefault(f"{k} ratio", []).append(v / p50["floor"])
    return out


async def _round(where: dict[str, Any], r: int, seconds: float) -> dict[str, float]:
    """One round: the three take turns in blocks of 50 pairs (rotated order); p50 of each."""
    from redis.asyncio.lock import Lock as ALock

    from django_rlock.engine import AsyncRLock
    from django_rlock.engine.naming import (
        UNLOCK_MESSAGE,
        grant_channel,
        handoff_queue,
        handoff_waiters,
        index_key,
        lock_channel,
    )
    from django_rlock.engine.scripts import ACQUIRE, RELEASE
    c1, c2, c3, c4 = _clients(where, 4)
    sync = _sync(where)
    sha = sync.script_load("return 1")
    lock = AsyncRLock(c2, f"bench:aio:{r}", sync_client=sync)
    alock = ALock(c3, f"bench:aioredis:{r}", timeout=30)
    # The same two scripts with AsyncRLock's keys and arguments, sent by hand: their cost.
    key, field = f"bench:aiohand:{r}", "bench-by-hand:1"
    akeys = (key, index_key("", None))
    aargs = (30000, field, "{}", "")
    rkeys = (key, lock_channel(key).encode(), akeys[1], handoff_queue(key),
             handoff_waiters(key), grant_channel(key).encode())
    rargs = (field, 30000, UNLOCK_MESSAGE)
    asha, rsha = sync.script_load(ACQUIRE), sync.script_load(RELEASE)

    async def floor() -> None:
        await c1.evalsha(sha, 0)
        await c1.evalsha(sha, 0)

    async def rlock() -> None:
        await lock.lock()
        await lock.unlock()

    async def redis_lock() -> None:
        await alock.acquire()
        await alock.release()

    async def scripts() -> None:
        await c4.evalsha(asha, len(akeys), *akeys, *aargs)
        await c4.evalsha(rsha, len(rkeys), *rkeys, *rargs)

    fns = {"floor": floor, "AsyncRLock": rlock, "redis.asyncio Lock": redis_lock,
           "its two scripts by hand": scripts}
    for f in fns.values():
        for _ in range(300):
            await f()
    lat: dict[str, list[int]] = {k: [] for k in fns}
    names = list(fns)
    names = names[r % len(names):] + names[:r % len(names)]
    now = time.perf_counter_ns
    end = time.monotonic() + seconds * len(fns)
    while time.monotonic() < end:
        for k in names:
            f, samples = fns[k], lat[k]
            for _ in range(50):
                t = now()
                await f()
                samples.append(now() - t)
    for c in (c1, c2, c3, c4):
        await c.aclose()
    sync.close()
    return {k: statistics.median(v) / 1e3 for k, v in lat.items()}


def _contender(where: dict[str, Any], code: str | None, lib: str, tasks: int, seconds: float,
               start_at: float, q: Any) -> None:
    _paths(code)

    async def main() -> tuple[int, float, float]:
        from redis.asyncio.lock import Lock as ALock

        from django_rlock.engine import AsyncRLock
        client = _clients(where, 1)[0]
        sync = _sync(where)
        count = 0
        worst = 0.0

        async def one() -> None:
            nonlocal count, worst
            if lib == "AsyncRLock":
                lock: Any = AsyncRLock(client, "bench:aio:hot", sync_client=sync)
                acquire, release = lock.lock, lock.unlock
            else:
                lock = ALock(client, "bench:aio:hot", timeout=30)
                acquire, release = lock.acquire, lock.release
            while time.monotonic() < start_at + seconds:
                t = time.monotonic()
                await acquire()
                worst = max(worst, time.monotonic() - t)
                count += 1
                await asyncio.sleep(0.001)
                await release()

        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        switches = _switches()
        cpu, loop_cpu = time.process_time(), time.thread_time()
        await asyncio.gather(*(one() for _ in range(tasks)))
        cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop_cpu
        switches = _switches() - switches
        await client.aclose()
        return count, worst, cpu, loop_cpu, switches

    q.put(asyncio.run(main()))


def _switches() -> int:
    """Context switches of this process's threads so far (Linux; 0 elsewhere)."""
    total = 0
    for task in Path("/proc/self/task").glob("*"):
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total


def _contention(where: dict[str, Any], code: str | None, lib: str, procs: int, tasks: int,
                seconds: float) -> dict[str, float]:
    admin = _sync(where)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.monotonic() + 2.0 + procs * 0.5  # spawned interpreters import first
    ps = [ctx.Process(target=_contender, args=(where, code, lib, tasks, seconds, start_at, q))
          for _ in range(procs)]
    for p in ps:
        p.start()
    while time.monotonic() < start_at - 0.2:
        time.sleep(0.05)
    admin.config_resetstat()
    got = [q.get(timeout=seconds + 120) for _ in ps]
    stats = admin.info("commandstats")
    for p in ps:
        p.join(30)
    stats = {k: v for k, v in stats.items()
             if k not in ("cmdstat_info", "cmdstat_config|resetstat")}
    n = sum(g[0] for g in got)
    admin.close()
    if os.environ.get("BENCH_THREADS"):  # --threads: where the client CPU went
        print(f"  {lib} {procs} x {tasks}: per acquisition, event loop thread "
              f"{sum(g[3] for g in got) * 1e6 / n:.0f} us, other threads (listener, watchdog) "
              f"{sum(g[2] - g[3] for g in got) * 1e6 / n:.0f} us, context switches "
              f"{sum(g[4] for g in got) / n:.2f}", flush=True)
    if os.environ.get("BENCH_COMMANDS"):  # --commands: which commands, per acquisition
        per = sorted(((v["calls"] / n, k[len("cmdstat_"):]) for k, v in stats.items()),
                     reverse=True)
        print(f"  {lib} {procs} x {tasks}: " + ", ".join(f"{k} {c:.2f}" for c, k in per
                                                        if c >= 0.005), flush=True)
    return {"acquisitions": n,
            "server cmds": sum(v["calls"] for v in stats.values()) / n,
            "server us": sum(v["usec"] for v in stats.values()) / n,
            "client us": sum(g[2] for g in got) * 1e6 / n,
            "worst wait ms": max(g[1] for g in got) * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per library and round")
    ap.add_argument("--contention-seconds", type=float, default=4.0)
    ap.add_argument("--code", help="import django_rlock from this checkout")
    ap.add_argument("--only", default="pc", help="p: pairs, c: contention")
    ap.add_argument("--layouts", default="1x16,4x16",
                    help="contention layouts, processes x tasks (comma-separated)")
    ap.add_argument("--transports", default="unix,tcp", help="unix, tcp or both")
    ap.add_argument("--commands", action="store_true",
                    help="also print each contention run's server commands per acquisition")
    ap.add_argument("--threads", action="store_true",
                    help="also print each contention run's client CPU by thread (the event "
                         "loop's, the others') and context switches per acquisition")
    args = ap.parse_args(argv)
    if args.commands:
        os.environ["BENCH_COMMANDS"] = "1"
    if args.threads:
        os.environ["BENCH_THREADS"] = "1"
    layouts = [tuple(int(n) for n in lay.split("x")) for lay in args.layouts.split(",")]
    transports = set(args.transports.split(","))
    _paths(args.code)
    import django_rlock
    from django_rlock.testing import RedisServer
    print(f"django_rlock from {Path(django_rlock.__file__).parent}", flush=True)
    with RedisServer(port=int(os.environ.get("BENCH_PORT", "0")) or _free_port()) as server:
        for label, where in (("unix socket", {"socket": server.socket}),
                             ("TCP loopback", {"port": server.port})):
            if ("port" in where and "tcp" not in transports) or (
                    "socket" in where and "unix" not in transports):
                continue
            if "p" in args.only:
                res = asyncio.run(_pairs(where, args.rounds, args.seconds))
                print(f"\n{label}: one task, uncontended pair, median of {args.rounds} rounds")
                print("| | p50 us | x floor (per round, median) |\n|---|---:|---:|")
                for k in ("floor", "AsyncRLock", "redis.asyncio Lock", "its two scripts by hand"):
                    ratio = statistics.median(res[f"{k} ratio"]) if k != "floor" else 1.0
                    print(f"| {k} | {statistics.median(res[k]):.1f} | {ratio:.2f} |")
            if "c" in args.only:
                print(f"\n{label}: contention on one key, {args.contention_seconds:g} s each")
                print("| layout | library | acquisitions | server cmds / acq | server us / acq "
                      "| client CPU us / acq | worst wait ms |\n|---|---|---:|---:|---:|---:|---:|")
                for procs, tasks in layouts:
                    for lib in ("AsyncRLock", "redis.asyncio Lock"):
                        c = _contention(where, args.code, lib, procs, tasks,
                                        args.contention_seconds)
                        print(f"| {procs} x {tasks} | {lib} | {c['acquisitions']:.0f} | "
                              f"{c['server cmds']:.1f} | {c['server us']:.0f} | "
                              f"{c['client us']:.0f} | {c['worst wait ms']:.0f} |", flush=True)
    return 0


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
