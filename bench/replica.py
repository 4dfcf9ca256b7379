"""What replica sync costs: uncontended lock+unlock pairs, p50/p99, against the floor.

    python bench/replica.py [--seconds 1.5] [--rounds 5]

On a master with replicas every acquire and release carries ``WAIT`` in the same round trip, so
a pair costs two round trips plus the replicas' acknowledgements. Variants:

- the floor: two EVALSHA of ``return 1`` on a master without replica (bench/clients.py FLOOR);
- the synced floor: two EVALSHA of a one-key write, each with ``WAIT 1`` behind it, on the
  master with one replica: the least a replicated pair can cost;
- ``RLock`` on a master without replica, on the master with one replica (WAIT) and there with
  the check off, and on a master with two replicas (``"auto"``: WAIT for both, one needed).

Variants take turns in 0.1 s slices, in a rotated order, so that machine noise lands on all
alike; p50/p99 are over every pair of a variant, the ratio is the median of per-slice ratios.

Then, measured apart (each pair takes seconds): the master with two replicas while one is
paused (SIGSTOP), with ``"auto"`` and with ``sync_replicas=1``. WAIT returns when *all* the
replicas it names have acknowledged, or at its timeout: ``"auto"`` names every connected
replica, so one stalled replica costs every acquire and release the whole ``sync_timeout``.

Every server is the benchmark's own (unix sockets for clients, loopback TCP, on ports picked
at run time, for replication).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

import redis  # noqa: E402

from bench.clients import FLOOR_SCRIPT  # noqa: E402
from bench.stats import median, percentile  # noqa: E402
from django_rlock import RLock  # noqa: E402
from django_rlock.testing import RedisServer, free_port  # noqa: E402

#: Seconds each variant runs before the next one's turn.
SLICE = 0.1
#: A one-key write: WAIT only waits for something when the connection wrote.
SYNCED_FLOOR_SCRIPT = "return redis.call('incr', KEYS[1])"


def start_server(args: list[str] | None = None) -> RedisServer:
    """A server with a loopback TCP port (replicas need one); another port if it was taken."""
    for _ in range(5):
        server = RedisServer(port=free_port(), args=["--repl-diskless-sync-delay", "0", *(args or [])])
        try:
            return server.start()
        except RuntimeError:
            shutil.rmtree(server.dir, ignore_errors=True)
    raise RuntimeError("no free loopback port")


def online_replicas(client: redis.Redis) -> int:
    info = client.info("replication")
    return sum(1 for k, v in info.items()
               if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")


def wait_online(client: redis.Redis, n: int) -> None:
    deadline = time.monotonic() + 20
    while online_replicas(client) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} replica(s) not online")
        time.sleep(0.05)


def latencies(step: Callable[[], None], seconds: float) -> list[int]:
    lat: list[int] = []
    now = time.perf_counter_ns
    end = now() + int(seconds * 1e9)
    while True:
        t = now()
        if t >= end:
            break
        step()
        lat.append(now() - t)
    return lat


def pair(lock: RLock) -> Callable[[], None]:
    def step() -> None:
        lock.lock()
        lock.unlock()
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stalled-pairs", type=int, default=3,
                    help="pairs timed with a paused replica (each takes up to 2 x sync_timeout)")
    args = ap.parse_args()

    alone = start_server()
    m1 = start_server()
    m2 = start_server()
    reps = [start_server(["--replicaof", "127.0.0.1", str(m.port)]) for m in (m1, m2, m2)]
    servers = [alone, m1, m2, *reps]
    try:
        c0, c1, c2 = alone.client(), m1.client(), m2.client()
        wait_online(c1, 1)
        wait_online(c2, 2)
        floor_sha = c0.script_load(FLOOR_SCRIPT)
        synced_sha = c1.script_load(SYNCED_FLOOR_SCRIPT)

        def floor() -> None:
            c0.evalsha(floor_sha, 1, "bench:floor")
            c0.evalsha(floor_sha, 1, "bench:floor")

        def synced_floor() -> None:
            for _ in range(2):
                pipe = c1.pipeline(transaction=False)
                pipe.evalsha(synced_sha, 1, "bench:synced-floor")
                pipe.execute_command("WAIT", 1, 1000)
                if pipe.execute()[1] != 1:
                    raise RuntimeError("the replica did not acknowledge")

        variants: dict[str, Callable[[], None]] = {
            "floor: 2 x EVALSHA, no replica": floor,
            "synced floor: 2 x (EVALSHA write + WAIT 1)": synced_floor,
            "RLock, no replica": pair(RLock(c0, "bench:r")),
            "RLock, 1 replica, replica sync (WAIT)": pair(RLock(c1, "bench:r")),
            "RLock, 1 replica, sync off": pair(RLock(c1, "bench:r-off", sync_replicas=None)),
            "RLock, 2 replicas, auto (WAIT 2, 1 needed)": pair(RLock(c2, "bench:r")),
        }
        names = list(variants)
        for step in variants.values():  # warm up: connections, scripts, the replica count probe
            for _ in range(300):
                step()
        gc.collect()
        # Short slices, in a rotated order: on a busy machine noise comes and goes within a
        # second, and must land on every variant alike.
        samples: dict[str, list[int]] = {k: [] for k in names}
        ratios: dict[str, list[float]] = {k: [] for k in names}
        slices = max(1, round(args.seconds / SLICE))
        for r in range(args.rounds * slices):
            order = names[r % len(names):] + names[:r % len(names)]
            this: dict[str, float] = {}
            for name in order:
                lat = latencies(variants[name], SLICE)
                samples[name].extend(lat)
                this[name] = percentile(sorted(lat), 50)
            for name in names:
                ratios[name].append(this[name] / this[names[0]])
        for lat in samples.values():
            lat.sort()

        # One of the two replicas stalls (SIGSTOP): it stays "connected" until repl-timeout.
        stalled: dict[str, float] = {}
        os.kill(reps[2].proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            for label, lock in (("auto", RLock(c2, "bench:stalled")),
                                ("sync_replicas=1", RLock(c2, "bench:stalled-1", sync_replicas=1))):
                lock.lock()
                lock.unlock()  # the replica count is probed (both still connected)
                times = []
                for _ in range(args.stalled_pairs):
                    t = time.perf_counter()
                    lock.lock()
                    lock.unlock()
                    times.append(time.perf_counter() - t)
                stalled[label] = median(times) * 1e6
        finally:
            os.kill(reps[2].proc.pid, signal.SIGCONT)  # type: ignore[union-attr]

        version = c0.info("server")["redis_version"]
        print(f"{args.rounds} rounds x {args.seconds:g} s per variant in {SLICE:g} s slices, "
              f"redis-server {version}, clients on unix sockets, replication over loopback TCP")
        print("p50/p99 over every pair; p50 / floor: the median of the per-slice ratios")
        print(f"| {'variant':44} | {'p50 us':>8} | {'p99 us':>8} | {'p50 / floor':>11} |")
        print(f"|{'-' * 46}|{'-' * 10}|{'-' * 10}|{'-' * 13}|")
        for name in names:
            print(f"| {name:44} | {percentile(samples[name], 50) / 1e3:8.1f} | "
                  f"{percentile(samples[name], 99) / 1e3:8.1f} | {median(ratios[name]):10.2f}x |")
        floor_p50 = percentile(samples[names[0]], 50) / 1e3
        for label, us in stalled.items():
            name = f"RLock, 2 replicas, 1 paused, {label}"
            print(f"| {name:44} | {us:8.0f} | {'':>8} | {us / floor_p50:10.0f}x |")
        print(f"(paused replica: median of {args.stalled_pairs} pairs; default sync_timeout 1 s)")
    finally:
        for s in servers:
            s.stop()
            shutil.rmtree(s.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
