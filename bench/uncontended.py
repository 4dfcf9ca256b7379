"""(A) Uncontended lock+unlock pairs, against the floor of two EVALSHA round trips.

Every library runs in every round, in a rotated order, so that machine noise (another job
on a 2-core box) lands on all of them alike; the ratio to the floor is taken within a round
and the median over rounds is reported.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

from .clients import FLOOR, make_adapter
from .server import RedisServer
from .stats import median, percentile


@dataclass
class RoundResult:
    pairs: int
    pairs_per_s: float
    p50_us: float
    p99_us: float


@dataclass
class LibResult:
    lib: str
    rounds: list[RoundResult] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)   # p50 / floor p50, per round

    @property
    def pairs_per_s(self) -> float:
        return median([r.pairs_per_s for r in self.rounds])

    @property
    def p50_us(self) -> float:
        return median([r.p50_us for r in self.rounds])

    @property
    def p99_us(self) -> float:
        return median([r.p99_us for r in self.rounds])

    @property
    def ratio(self) -> float:
        return median(self.ratios)


def _measure(server: RedisServer, lib: str, name: str, seconds: float, max_pairs: int,
             warmup: int) -> RoundResult:
    client = server.client()
    try:
        a = make_adapter(lib, client, name, wait_s=None)
        acquire, release = a.acquire, a.release
        for _ in range(warmup):
            acquire()
            release()
        gc.collect()
        lat: list[int] = []
        now = time.perf_counter_ns
        t0 = now()
        end = t0 + int(seconds * 1e9)
        t = t0
        while len(lat) < max_pairs and t < end:
            s = now()
            acquire()
            release()
            t = now()
            lat.append(t - s)
        elapsed = (t - t0) / 1e9
        lat.sort()
        return RoundResult(len(lat), len(lat) / elapsed, percentile(lat, 50) / 1e3,
                           percentile(lat, 99) / 1e3)
    finally:
        client.close()


def run(server: RedisServer, libs: list[str], rounds: int, seconds: float, max_pairs: int = 1_000_000,
        warmup: int = 500) -> dict[str, LibResult]:
    """``libs`` must include FLOOR. ``seconds`` per library per round."""
    results = {lib: LibResult(lib) for lib in libs}
    for r in range(rounds):
        order = libs[r % len(libs):] + libs[:r % len(libs)]
        this_round: dict[str, RoundResult] = {}
        for lib in order:
            this_round[lib] = _measure(server, lib, f"bench:a:{r}:{lib}", seconds, max_pairs, warmup)
        floor = this_round[FLOOR].p50_us
        for lib, res in this_round.items():
            results[lib].rounds.append(res)
            results[lib].ratios.append(res.p50_us / floor)
    return results
