"""(T) What time windows cost (issue #21): ``max_hold`` / ``warn_held_after`` on holds that
end long before them, against the same locks without windows, and the renewals of many
windowed holds against as many plain ones.

    .venv/bin/python -m bench.windows [--seconds 3] [--rounds 5] [--holds 2000]

Pairs: the two locks take turns in blocks of 50 uncontended lock+unlock pairs (rotated
order, as bench A), median over rounds of each one's p50. Renewals: one process holds
``--holds`` locks at a 1.5 s watchdog (windows of an hour, or none) for 6 s; round trips and
renewal calls counted by the watchdog, CPU of the process.
"""

from __future__ import annotations

import argparse
import time

from django_rlock import RLock
from django_rlock.engine.watchdog import watchdog

from .server import RedisServer
from .stats import median, percentile

BLOCK = 50


def pairs(server: RedisServer, seconds: float, rounds: int) -> dict[str, float]:
    client = server.client()
    locks = {"plain": RLock(client, "t:plain"),
             "windows": RLock(client, "t:win", max_hold=3600.0, warn_held_after=600.0)}
    p50s: dict[str, list[float]] = {k: [] for k in locks}
    for r in range(rounds):
        order = list(locks)[r % 2:] + list(locks)[:r % 2]
        lat: dict[str, list[int]] = {k: [] for k in locks}
        end = time.perf_counter() + seconds * 2
        while time.perf_counter() < end:
            for k in order:
                lock, out = locks[k], lat[k]
                for _ in range(BLOCK):
                    t = time.perf_counter_ns()
                    lock.lock()
                    lock.unlock()
                    out.append(time.perf_counter_ns() - t)
        for k in locks:
            p50s[k].append(percentile(sorted(lat[k]), 50) / 1e3)
    return {k: median(v) for k, v in p50s.items()}


def renewals(server: RedisServer, holds: int, windows: bool) -> tuple[int, int, float]:
    client = server.client()
    opts = {"max_hold": 3600.0, "warn_held_after": 3600.0} if windows else {}
    locks = [RLock(client, f"t:h:{windows}:{i}", watchdog_timeout=1.5, **opts)
             for i in range(holds)]
    for lock in locks:
        lock.lock()
    wd = watchdog()
    time.sleep(1.0)
    trips, renewed, cpu = wd.round_trips, wd.renewed, time.process_time()
    time.sleep(6.0)
    out = (wd.round_trips - trips, wd.renewed - renewed, time.process_time() - cpu)
    for lock in locks:
        lock.unlock()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--holds", type=int, default=2000)
    a = ap.parse_args()
    with RedisServer() as server:
        p = pairs(server, a.seconds, a.rounds)
        print(f"pair p50: plain {p['plain']:.1f} us, with windows {p['windows']:.1f} us "
              f"({p['windows'] / p['plain']:.3f}x)")
        for windows in (False, True, False, True):
            trips, renewed, cpu = renewals(server, a.holds, windows)
            print(f"{a.holds} holds {'with' if windows else 'without'} windows, 6 s: "
                  f"{trips} round trips, {renewed} renewals, {cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
