"""(B) Many contenders on one key, each holding it ~1 ms: hand-off speed and fairness.

Every run happens in freshly spawned processes (one process with N threads, or N processes
with one thread each) so no library inherits another's threads, pools or subscriptions,
and the coordinator's own bookkeeping never competes for the GIL with the contenders.

Timestamps come from ``time.monotonic_ns`` (CLOCK_MONOTONIC), which all processes of one
Linux host share, so hand-offs between processes can be timed from both sides.

Inside the critical section each contender reads a counter, sleeps out the hold and writes
the counter back plus one: a non-atomic increment, so any overlap of two holders loses an
update and shows as a final count below the number of acquisitions. A second check needs no
Redis: with the records sorted by acquire time, a holder's acquire can only return after its
predecessor called release, so a negative hand-off gap is an overlap.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from .clients import (
    HANDSHAKE,
    RLOCK,
    Adapter,
    commandstats,
    counting_client,
    delta,
    make_adapter,
    warm_pool,
)
from .stats import median, percentile

if TYPE_CHECKING:  # (not imported at run time: a spawned contender of the baseline must
    # import ``django_rlock`` from the baseline's tree, and ``.server`` imports it)
    from .server import RedisServer

#: ``--baseline``: django-rlock as it is at another git revision, in the same run.
BASELINE = "django-rlock (baseline)"

#: (holder id, acquire called, acquire returned, release called), monotonic ns.
Record = tuple[int, int, int, int]

#: Commands the benchmark itself sends (the counter, INFO), left out of the server's count.
BENCH_COMMANDS = frozenset({"info", "hget", "hset"}) | HANDSHAKE


@dataclass(frozen=True)
class ChildSpec:
    lib: str
    conn: dict[str, Any]  # redis.Redis keyword arguments: a unix socket or loopback TCP
    lock_name: str
    counter_key: str
    index: int
    threads: int
    duration_s: float
    hold_s: float
    wait_s: float
    max_per_thread: int
    code: str = ""  # a tree whose ``django_rlock`` this process imports (``BASELINE``)


def _contend(a: Adapter, counter: redis.Redis, spec: ChildSpec, hid: int, go: threading.Event,
             start_ns: list[int], out: list[Record], errors: list[str]) -> None:
    go.wait()
    start = start_ns[0]
    deadline = start + int(spec.duration_s * 1e9)
    now = time.monotonic_ns
    lag = start - now()
    if lag > 0:
        time.sleep(lag / 1e9)
    acquire, release, key, hold = a.acquire, a.release, spec.counter_key, spec.hold_s
    try:
        for _ in range(spec.max_per_thread):
            t_call = now()
            if t_call >= deadline:
                break
            acquire()
            t_ret = now()
            v = counter.hget(key, "n")
            time.sleep(hold)
            counter.hset(key, "n", int(v or 0) + 1)
            t_rel = now()
            release()
            out.append((hid, t_call, t_ret, t_rel))
    except (TimeoutError, RuntimeError, ValueError, OSError, redis.RedisError) as exc:
        # A lock error, a failed wait or a lost connection: reported, and the run is marked failed.
        errors.append(f"holder {hid}: {type(exc).__name__}: {exc}")


def _child(spec: ChildSpec, results: Any, start_evt: Any, start_val: Any) -> None:
    """Entry point of a spawned contender process."""
    try:
        lib = spec.lib
        if spec.code:
            sys.path.insert(0, spec.code)
            import django_rlock
            assert django_rlock.__file__ and django_rlock.__file__.startswith(spec.code)
            lib = RLOCK
        client, packer = counting_client(spec.conn)
        counter = redis.Redis(**spec.conn)
        adapters = [make_adapter(lib, client, spec.lock_name, spec.wait_s)
                    for _ in range(spec.threads)]
        for a in adapters:  # loads the scripts and starts any library thread before timing
            a.acquire()
            a.release()
        warm_pool(client, spec.threads + 2)
        warm_pool(counter, spec.threads + 1)
        go = threading.Event()
        start_ns = [0]
        outs: list[list[Record]] = [[] for _ in adapters]
        errors: list[str] = []
        threads = [threading.Thread(target=_contend, daemon=True,
                                    args=(a, counter, spec, spec.index * 1000 + i, go, start_ns,
                                          outs[i], errors))
                   for i, a in enumerate(adapters)]
        for t in threads:
            t.start()
        results.put(("ready", spec.index, None))
        if not start_evt.wait(120):
            raise RuntimeError("no start signal")
        start_ns[0] = start_val.value
        packer.reset()
        go.set()
        for t in threads:
            t.join(spec.duration_s + spec.wait_s + 30)
            if t.is_alive():
                errors.append(f"a contender of {spec.lib} did not finish")
        counts = packer.snapshot()
        results.put(("result", spec.index, ([r for o in outs for r in o], counts, errors)))
    except Exception:
        results.put(("error", spec.index, traceback.format_exc()))


@dataclass
class RunResult:
    """One run of one library in one mode."""

    lib: str
    acquisitions: int
    seconds: float
    gaps_ms: list[float]
    cross_ms: list[float]
    same_holder: int
    waits_ms: list[float]
    per_holder: dict[int, int]
    overlaps: int
    counter: int
    client: dict[str, int]
    server: dict[str, int]
    errors: list[str] = field(default_factory=list)
    #: Share of grants that went to a contender who called after the previous grantee did:
    #: an earlier caller was passed over (a fair lock should show almost none).
    out_of_order: float = float("nan")
    #: Every record, sorted by acquire return (for analyses of a mix of contenders).
    records: list[Record] = field(default_factory=list, repr=False)
    #: Client commands counted in each contender process, by process index.
    client_by_proc: dict[int, dict[str, int]] = field(default_factory=dict)
    #: Every contender's id, those that never got the lock included (``per_holder`` has
    #: only those that did).
    holders: list[int] = field(default_factory=list)

    @property
    def acq_per_s(self) -> float:
        return self.acquisitions / self.seconds if self.seconds > 0 else 0.0

    @property
    def handoffs(self) -> int:
        return len(self.gaps_ms)

    @property
    def self_fraction(self) -> float:
        return self.same_holder / self.handoffs if self.handoffs else float("nan")

    def per_acq(self, counts: dict[str, int]) -> float:
        return sum(counts.values()) / self.acquisitions if self.acquisitions else float("nan")

    @property
    def counter_ok(self) -> bool:
        return self.counter == self.acquisitions and self.overlaps == 0

    @property
    def evalsha_agrees(self) -> bool:
        return self.client.get("evalsha", 0) == self.server.get("evalsha", 0)


def analyze(lib: str, records: list[Record], start_ns: int, counter: int, client: dict[str, int],
            server: dict[str, int], errors: list[str]) -> RunResult:
    recs = sorted(records, key=lambda r: r[2])
    gaps: list[float] = []
    cross: list[float] = []
    same = overlaps = 0
    for prev, nxt in itertools.pairwise(recs):
        g = (nxt[2] - prev[3]) / 1e6
        if g < 0:
            overlaps += 1
        gaps.append(g)
        if nxt[0] == prev[0]:
            same += 1
        else:
            cross.append(g)
    waits = sorted((r[2] - r[1]) / 1e6 for r in recs)
    inversions = sum(1 for prev, nxt in itertools.pairwise(recs) if nxt[1] < prev[1])
    end = max((r[3] for r in recs), default=start_ns)
    gaps.sort()
    cross.sort()
    return RunResult(lib, len(recs), (end - start_ns) / 1e9, gaps, cross, same, waits,
                     dict(Counter(r[0] for r in recs)), overlaps, counter,
                     delta(client, {}, HANDSHAKE), server, errors,
                     inversions / (len(recs) - 1) if len(recs) > 1 else float("nan"), recs)


def run_one(server: RedisServer, lib: str, procs: int, threads: int, duration_s: float,
            hold_s: float, tag: str, wait_s: float = 30.0, max_per_thread: int = 100_000,
            mix: Sequence[str] = (), transport: str = "unix", code: str = "") -> RunResult:
    """One contention run: ``procs`` spawned processes of ``threads`` contenders each.

    ``mix``: one library per process (then ``procs`` is its length and ``lib`` only names the
    run), for contenders of different libraries on the same key. ``transport``: "unix" or
    "tcp" (loopback; the server must listen there). ``code``: the tree ``BASELINE`` imports.
    """
    conn = server.conn(transport)
    libs = list(mix) or [lib] * procs
    procs = len(libs)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_evt = ctx.Event()
    start_val = ctx.Value("q", 0)
    lock_name = f"bench:b:{tag}:{transport}"
    counter_key = f"bench:b:counter:{tag}:{transport}"
    stats = server.client()
    stats.delete(counter_key)
    children = [ctx.Process(target=_child, daemon=True,
                            args=(ChildSpec(child_lib, conn, lock_name, counter_key,
                                            i, threads, duration_s, hold_s, wait_s, max_per_thread,
                                            code if child_lib == BASELINE else ""),
                                  results, start_evt, start_val))
                for i, child_lib in enumerate(libs)]
    for c in children:
        c.start()
    try:
        def collect(kind: str, timeout: float) -> dict[int, Any]:
            got: dict[int, Any] = {}
            deadline = time.monotonic() + timeout
            while len(got) < procs:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{lib}: {procs - len(got)} contender process(es) never "
                                       f"reported {kind}")
                try:
                    k, idx, payload = results.get(timeout=min(left, 1.0))
                except queue.Empty:
                    if any(c.exitcode not in (None, 0) for c in children):
                        raise RuntimeError(f"{lib}: a contender process died") from None
                    continue
                if k == "error":
                    raise RuntimeError(f"{lib}: contender process {idx} failed:\n{payload}")
                got[idx] = payload
            return got

        collect("ready", 120)
        before = commandstats(stats)
        start_ns = time.monotonic_ns() + 50_000_000
        start_val.value = start_ns
        start_evt.set()
        done = collect("result", duration_s + wait_s + 90)
        after = commandstats(stats)
        counter = int(stats.hget(counter_key, "n") or 0)
    finally:
        for c in children:
            c.join(10)
            if c.is_alive():
                c.terminate()
                c.join(5)
        stats.close()
    records: list[Record] = []
    client_counts: Counter[str] = Counter()
    errors: list[str] = []
    for recs, counts, errs in done.values():
        records.extend(recs)
        client_counts.update(counts)
        errors.extend(errs)
    res = analyze(lib, records, start_ns, counter, dict(client_counts),
                  delta(after, before, BENCH_COMMANDS), errors)
    res.client_by_proc = {idx: delta(counts, {}, HANDSHAKE) for idx, (_, counts, _) in done.items()}
    res.holders = [i * 1000 + t for i in range(procs) for t in range(threads)]
    return res


@dataclass
class Summary:
    """One library in one mode over all rounds: medians, except the worst wait (max)."""

    lib: str
    runs: list[RunResult]
    cross_ratio: float = float("nan")   # cross-holder gap p50 / python-redis-lock's, per round

    def _med(self, f: Callable[[RunResult], float]) -> float:
        return median([f(r) for r in self.runs])

    @property
    def acquisitions(self) -> int:
        return sum(r.acquisitions for r in self.runs)

    @property
    def acq_per_s(self) -> float:
        return self._med(lambda r: r.acq_per_s)

    def gap(self, q: float) -> float:
        return self._med(lambda r: percentile(r.gaps_ms, q))

    def cross(self, q: float) -> float:
        return self._med(lambda r: percentile(r.cross_ms, q))

    @property
    def self_fraction(self) -> float:
        return self._med(lambda r: r.self_fraction)

    @property
    def max_wait_ms(self) -> float:
        return max((r.waits_ms[-1] for r in self.runs if r.waits_ms), default=float("nan"))

    @property
    def p99_wait_ms(self) -> float:
        return self._med(lambda r: percentile(r.waits_ms, 99))

    @property
    def client_per_acq(self) -> float:
        return self._med(lambda r: r.per_acq(r.client))

    @property
    def server_per_acq(self) -> float:
        return self._med(lambda r: r.per_acq(r.server))

    def breakdown(self, side: str) -> dict[str, float]:
        total: Counter[str] = Counter()
        n = 0
        for r in self.runs:
            total.update(r.client if side == "client" else r.server)
            n += r.acquisitions
        return {k: v / n for k, v in total.most_common()} if n else {}

    def _spread(self, group: Callable[[int], int]) -> tuple[float, float]:
        lo, hi = [], []
        for r in self.runs:
            per: Counter[int] = Counter({group(hid): 0 for hid in r.holders})  # starved: 0
            for hid, n in r.per_holder.items():
                per[group(hid)] += n
            if per and r.acquisitions:
                mean = r.acquisitions / len(per)
                lo.append(min(per.values()) / mean)
                hi.append(max(per.values()) / mean)
        return median(lo), median(hi)

    @property
    def share_spread(self) -> tuple[float, float]:
        """Fewest and most acquisitions of one contender, relative to the mean (1.0 = fair)."""
        return self._spread(lambda hid: hid)

    @property
    def process_share_spread(self) -> tuple[float, float]:
        """As ``share_spread``, per process (all its contender threads together)."""
        return self._spread(lambda hid: hid // 1000)

    @property
    def checks_ok(self) -> bool:
        return all(r.counter_ok and not r.errors for r in self.runs)

    @property
    def evalsha_agrees(self) -> bool:
        return all(r.evalsha_agrees for r in self.runs)


def run(server: RedisServer, libs: list[str], procs: int, threads: int, rounds: int,
        duration_s: float, hold_s: float, reference: str, label: str, transport: str = "unix",
        code: str = "") -> dict[str, Summary]:
    """``rounds`` rounds of every library, rotated; ratios against ``reference`` per round.
    ``transport``: "unix" or "tcp" (loopback); ``code``: the tree ``BASELINE`` imports."""
    runs: dict[str, list[RunResult]] = {lib: [] for lib in libs}
    ratios: dict[str, list[float]] = {lib: [] for lib in libs}
    for r in range(rounds):
        order = libs[r % len(libs):] + libs[:r % len(libs)]
        this: dict[str, RunResult] = {}
        for lib in order:
            tag = f"{label}:{r}:{lib}"
            this[lib] = run_one(server, lib, procs, threads, duration_s, hold_s, tag,
                                transport=transport, code=code)
            runs[lib].append(this[lib])
        ref = percentile(this[reference].cross_ms, 50)
        for lib, res in this.items():
            ratios[lib].append(percentile(res.cross_ms, 50) / ref if ref else float("nan"))
    return {lib: Summary(lib, runs[lib], median(ratios[lib])) for lib in libs}
