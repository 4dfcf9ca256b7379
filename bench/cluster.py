"""(C) The same locks on a Redis Cluster, next to one server: ``python bench/cluster.py``.

Starts a 3-master cluster (no replicas, so no acquire pays a WAIT; the standalone server has
none either) and one standalone server, all on loopback TCP from the same binary, and measures
in one run, alternating the two in every round:

- uncontended lock+unlock pairs of ``RLock`` and the floor (two EVALSHA of ``return 1`` on
  the same server: on the cluster, the key's master);
- 8 threads of one process taking turns on one key, each holding it ~1 ms: hand-off gap
  (release call to the next holder's return) p50, acquisitions per second, worst wait;
- 10,000 watchdog-mode locks spread over the 3 masters: renewal pipelines per master and
  period, EVALSHA per master and period (a batch per slot), and every lock still alive.

Prints a Markdown section for docs/benchmarks.md.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench``, ``tests``, ``django_rlock`` importable

import redis  # noqa: E402
from redis.crc import key_slot  # noqa: E402

from bench.stats import median, percentile  # noqa: E402
from django_rlock import RLock  # noqa: E402
from django_rlock.engine.watchdog import watchdog  # noqa: E402
from django_rlock.testing import RedisServer  # noqa: E402
from tests.cluster_topology import ClusterTopology, free_cluster_port  # noqa: E402

FLOOR_SCRIPT = "return 1"


def _pairs(lock: RLock, send_floor: Any, seconds: float) -> tuple[float, float]:
    """p50 of one lock+unlock pair and of the floor pair, in µs, measured alternately."""
    lat: dict[str, list[int]] = {"lock": [], "floor": []}
    now = time.perf_counter_ns
    for _ in range(200):  # warm-up: scripts loaded, connections open
        lock.lock()
        lock.unlock()
        send_floor()
        send_floor()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            t = now()
            lock.lock()
            lock.unlock()
            lat["lock"].append(now() - t)
            t = now()
            send_floor()
            send_floor()
            lat["floor"].append(now() - t)
    return (percentile(sorted(lat["lock"]), 50) / 1e3, percentile(sorted(lat["floor"]), 50) / 1e3)


def _floor(client: redis.Redis) -> Any:
    sha = client.script_load(FLOOR_SCRIPT)
    return lambda: client.evalsha(sha, 0)


@dataclass
class Handoff:
    acq_per_s: float
    gap_p50_ms: float
    max_wait_ms: float
    overlaps: int


def _handoff(client: Any, name: str, seconds: float, threads: int = 8,
             hold_s: float = 0.001) -> Handoff:
    records: list[tuple[int, int, int]] = []  # (acquire called, returned, release called)
    start = threading.Barrier(threads)
    end = time.monotonic() + seconds

    def run() -> None:
        lock = RLock(client, name)
        mine = []
        start.wait()
        while time.monotonic() < end:
            t0 = time.monotonic_ns()
            lock.lock()
            t1 = time.monotonic_ns()
            time.sleep(hold_s)
            t2 = time.monotonic_ns()
            lock.unlock()
            mine.append((t0, t1, t2))
        records.extend(mine)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    recs = sorted(records, key=lambda r: r[1])
    gaps = sorted((b[1] - a[2]) / 1e6 for a, b in zip(recs, recs[1:], strict=False))
    span = (recs[-1][2] - recs[0][1]) / 1e9 if len(recs) > 1 else float("nan")
    return Handoff(len(recs) / span, percentile(gaps, 50), max((r[1] - r[0]) / 1e6 for r in recs),
                   sum(1 for g in gaps if g < 0))


@dataclass
class Renewal:
    locks: int
    periods: float
    pipelines: dict[int, float]   # per master port, per period
    evalsha: dict[int, float]     # per master port, per period (server side)
    alive: int


def _renewal(cluster: ClusterTopology, rc: Any, n: int, watchdog_timeout: float = 3.0,
             observe_s: float = 6.0) -> Renewal:
    wd = watchdog()
    sent: Counter[int] = Counter()
    real = wd._pipeline

    def counting(client: Any, calls: Any, wait: Any = None) -> Any:  # passes every call on
        sent[client.connection_pool.connection_kwargs["port"]] += 1
        return real(client, calls, wait)

    locks = [RLock(rc, f"bench:c:w:{i}", watchdog_timeout=watchdog_timeout) for i in range(n)]
    for lock in locks:
        lock.lock()
    masters = cluster.masters()

    def evalsha() -> dict[int, int]:
        out = {}
        for m in masters:
            with cluster.node_client(m) as c:
                out[m.port] = c.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        return out

    wd._pipeline = counting  # type: ignore[method-assign]
    try:
        before = evalsha()
        time.sleep(observe_s)
        after = evalsha()
    finally:
        del wd._pipeline
    periods = observe_s / (watchdog_timeout / 3)
    alive = 0
    for m in masters:  # one pipeline per master: which of its keys still exist
        slots = _slots(cluster, m)
        with cluster.node_client(m) as c:
            mine = [lock.key for lock in locks if key_slot(lock.key.encode()) in slots]
            pipe = c.pipeline(transaction=False)
            for k in mine:
                pipe.exists(k)
            alive += sum(pipe.execute())
    for lock in locks:
        lock.unlock()
    return Renewal(n, periods, {p: sent[p] / periods for p in before},
                   {p: (after[p] - before[p]) / periods for p in before}, alive)


def _slots(cluster: ClusterTopology, master: Any) -> set[int]:
    ranges = cluster.view()[cluster.node_id(master)].slots
    return {s for a, b in ranges for s in range(a, b + 1)}


def main(rounds: int = 5, seconds: float = 2.0, locks: int = 10_000) -> str:
    with ClusterTopology(masters=3, replicas_per_master=0) as cluster:
        standalone = RedisServer(port=free_cluster_port()).start()
        try:
            rc = cluster.client(socket_timeout=10)
            one = redis.Redis("127.0.0.1", standalone.port, socket_timeout=10)
            name = "bench:c:pair"
            node = rc.get_node_from_key(name).redis_connection
            sides = {"one server": (RLock(one, name), _floor(one), one),
                     "cluster": (RLock(rc, name), _floor(node), rc)}
            pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
            handoffs: dict[str, list[Handoff]] = {k: [] for k in sides}
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for side in order:
                    lock, floor, client = sides[side]
                    pairs[side].append(_pairs(lock, floor, seconds))
                    handoffs[side].append(_handoff(client, f"bench:c:b:{r}", seconds))
            renewal = _renewal(cluster, rc, locks)
        finally:
            standalone.stop()
    return _markdown(rounds, seconds, pairs, handoffs, renewal)


def _markdown(rounds: int, seconds: float, pairs: dict[str, list[tuple[float, float]]],
              handoffs: dict[str, list[Handoff]], w: Renewal) -> str:
    md = [f"Medians over {rounds} rounds of {seconds:g} s per side and measure, the two sides "
          f"alternating; loopback TCP for both.", "",
          "| | RLock pair p50 µs | floor pair p50 µs | RLock / floor | 8 threads: acq/s | "
          "hand-off p50 ms | max wait ms | overlaps |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for side in pairs:
        p = pairs[side]
        h = handoffs[side]
        md.append(f"| {side} | {median([x[0] for x in p]):.0f} | {median([x[1] for x in p]):.0f} | "
                  f"{median([x[0] / x[1] for x in p]):.2f}x | "
                  f"{median([x.acq_per_s for x in h]):,.0f} | "
                  f"{median([x.gap_p50_ms for x in h]):.3f} | "
                  f"{max(x.max_wait_ms for x in h):.1f} | {sum(x.overlaps for x in h)} |")
    md += ["", f"{w.locks:,} watchdog-mode locks over 3 masters, observed for {w.periods:.1f} "
           f"renewal periods:", "", "| master | renewal pipelines per period | EVALSHA per period "
           "(server) |", "|---|---:|---:|"]
    for port in w.pipelines:
        md.append(f"| :{port} | {w.pipelines[port]:.2f} | {w.evalsha[port]:,.0f} |")
    md += ["", f"Still alive at the end: {w.alive:,} of {w.locks:,}."]
    return "\n".join(md)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    print(main(rounds=1, seconds=1.0, locks=2_000) if quick else main())
