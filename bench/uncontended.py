"""(A) Uncontended lock+unlock pairs, against the floor of two EVALSHA round trips.

Every library runs in every round, the libraries taking turns in blocks of 50 pairs (rotated
order), so that machine noise (another job on a 2-core box) lands on all of them alike; the
ratio to the floor is taken within a round and the median over rounds is reported.
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


#: Pairs per library before the next one takes over (interleaved rounds; see ``run``).
BLOCK = 50


def run(server: RedisServer, libs: list[str], rounds: int, seconds: float, max_pairs: int = 1_000_000,
        warmup: int = 500) -> dict[str, LibResult]:
    """``libs`` must include FLOOR. ``seconds`` per library per round.

    Within a round the libraries take turns in blocks of ``BLOCK`` pairs (rotated order), so
    they sample the same moments of the host: on a shared 2-core VM the floor's own p50 moved
    from 134 to 509 us between two back-to-back runs, and a library measured alone for its 2 s
    caught whichever phase it fell in."""
    results = {lib: LibResult(lib) for lib in libs}
    for r in range(rounds):
        order = libs[r % len(libs):] + libs[:r % len(libs)]
        clients = {lib: server.client() for lib in order}
        try:
            calls = {}
            for lib in order:
                a = make_adapter(lib, clients[lib], f"bench:a:{r}:{lib}", wait_s=None)
                for _ in range(warmup):
                    a.acquire()
                    a.release()
                calls[lib] = (a.acquire, a.release)
            lat: dict[str, list[int]] = {lib: [] for lib in order}
            spent = dict.fromkeys(order, 0)
            gc.collect()
            now = time.perf_counter_ns
            end = now() + int(seconds * len(order) * 1e9)
            while now() < end and min(len(v) for v in lat.values()) < max_pairs:
                for lib in order:
                    acquire, release = calls[lib]
                    out = lat[lib]
                    b0 = t = now()
                    for _ in range(BLOCK):
                        s = t
                        acquire()
                        release()
                        t = now()
                        out.append(t - s)
                    spent[lib] += t - b0
        finally:
            for c in clients.values():
                c.close()
        this_round: dict[str, RoundResult] = {}
        for lib in order:
            ls = sorted(lat[lib])
            this_round[lib] = RoundResult(len(ls), len(ls) / (spent[lib] / 1e9),
                                          percentile(ls, 50) / 1e3, percentile(ls, 99) / 1e3)
        floor = this_round[FLOOR].p50_us
        for lib, res in this_round.items():
            results[lib].rounds.append(res)
            results[lib].ratios.append(res.p50_us / floor)
    return results
