"""(W) One process holding 10,000 watchdog-mode locks: what keeping them alive costs.

Runs in a freshly spawned process so that the only django-rlock thread alive is the one
watchdog (no pub/sub listener, no holds left over from other phases); its main thread just
sleeps while the locks are held, so the process's CPU time is the watchdog's.

Run alone it compares the watchdog's server CPU with its floor in one run, on one server
(issue #22)::

    python -m bench.renewal [--locks 100000] [--timeout 3] [--rounds 2] [--baseline REF]

the floor being one pipeline of ``PEXPIRE`` per key per period, sent as the watchdog sends
(pipelines of 1,000), from a process that holds as many RLocks (taken the same way, so the
server's keys, index and memory layout are the same: keys made back to back, with no index
entries between them, are cheaper to reach per key); with
``--baseline REF`` the watchdog as it is at git revision REF runs too (its ``django_rlock``
extracted and imported by its process; the ``django_rlock`` its process had already
imported is forgotten first, and where it came from is checked). The variants take turns,
rotated each round, on one server; ``--floor-gap S`` adds a floor that sleeps S seconds after
each pipeline. The table is followed by every command the server ran per period. (Run at
once, each on a server of its own, two 100,000-lock watchdogs and their acquires overload two
shared cores: renewals go out late and locks are lost.)

``--scripts`` measures the renew scripts alone, without the watchdog around them: the same
locks (taken in lease mode: nothing else renews them) renewed over and over in one process,
the variants interleaved sweep by sweep (so a load change on a shared machine hits them
alike): the ``PEXPIRE`` pipeline, a ``PEXPIREAT`` pipeline, the per-key layout
(``renew.lua``, what the watchdog sent before #22), ``--baseline REF``'s ``renew_many.lua``
and this tree's, each in pipelines of 1,000 keys, ``RENEW_BATCH`` keys a script.
``bench/renewal_inline.py`` compares them inside the running watchdog instead.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import redis

from .baseline import extract
from .server import RedisServer

WATCHDOG_THREAD = "django-rlock-watchdog"


@dataclass
class WResult:
    locks: int
    watchdog_timeout: float
    period: float
    acquire_s: float
    periods: float
    round_trips: float          # per period
    renewed: float              # keys per period
    server_evalsha: float       # per period, INFO commandstats
    process_cpu_ms: float       # per period
    thread_cpu_ms: float        # per period, the watchdog thread alone
    redis_cpu_ms: float         # per period, INFO cpu of the server
    redis_script_ms: float      # per period, EVALSHA usec in INFO commandstats
    watchdog_threads: int
    threads_total: int
    alive: int                  # keys still there with a TTL > 0 after the observation
    min_ttl_ms: int
    release_s: float
    left_after_release: int
    commands: dict[str, float]  # per period, every command the server ran (INFO commandstats)


def server_sample(c: redis.Redis) -> tuple[int, float, float]:
    ev = c.info("commandstats").get("cmdstat_evalsha", {})
    cpu = c.info("cpu")
    return (int(ev.get("calls", 0)), float(ev.get("usec", 0)) / 1e3,
            (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e3)


def commands(c: redis.Redis) -> dict[str, int]:
    """Calls per command since the server started (in-script calls included)."""
    return {k.removeprefix("cmdstat_"): int(v.get("calls", 0))
            for k, v in c.info("commandstats").items()}


def _thread_cpu(t: threading.Thread | None) -> float:
    """CPU seconds of one thread (Linux/POSIX thread CPU clock); NaN where unsupported."""
    if t is None or t.ident is None:
        return float("nan")
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    except (AttributeError, OSError):
        return float("nan")


def import_from(code: str) -> None:
    """Make ``django_rlock`` import from ``code``: first on the path, and the copy this
    process already imported (``bench.server`` imports ``django_rlock.testing``) forgotten."""
    sys.path.insert(0, code)
    for name in [m for m in sys.modules if m == "django_rlock" or m.startswith("django_rlock.")]:
        del sys.modules[name]


def _child(socket_path: str, n: int, watchdog_timeout: float, settle: float, observe: float,
           out: Any, code: str | None = None) -> None:
    try:
        if code is not None:
            import_from(code)
        import django_rlock
        from django_rlock import RLock
        from django_rlock.engine.watchdog import watchdog

        # Before this check the baseline ran this tree's code: ``bench.server`` had imported
        # ``django_rlock`` (this tree's) before the path was set, and the two "variants" of
        # docs/benchmarks.md's first watchdog table measured the same code.
        assert code is None or django_rlock.__file__.startswith(code), django_rlock.__file__

        client = redis.Redis(unix_socket_path=socket_path)
        stats = redis.Redis(unix_socket_path=socket_path)
        locks = [RLock(client, f"bench:w:{i}", watchdog_timeout=watchdog_timeout) for i in range(n)]
        t0 = time.perf_counter()
        for lk in locks:
            lk.lock()
        acquire_s = time.perf_counter() - t0
        period = watchdog_timeout / 3.0
        # Let the acquisition burst settle into the steady sweep schedule.
        time.sleep(settle * period)
        wd = watchdog()
        wd_threads = [t for t in threading.enumerate() if t.name == WATCHDOG_THREAD]
        wdt = wd_threads[0] if wd_threads else None
        rt0, rn0 = wd.round_trips, wd.renewed
        cmd0 = commands(stats)
        ev0, us0, rc0 = server_sample(stats)
        cpu0, tc0, w0 = time.process_time(), _thread_cpu(wdt), time.monotonic()
        time.sleep(observe * period)
        cpu1, tc1, w1 = time.process_time(), _thread_cpu(wdt), time.monotonic()
        ev1, us1, rc1 = server_sample(stats)
        cmd1 = commands(stats)
        rt1, rn1 = wd.round_trips, wd.renewed
        periods = (w1 - w0) / period
        n_wd = sum(1 for t in threading.enumerate() if t.name == WATCHDOG_THREAD)
        n_threads = threading.active_count()
        ttls: list[int] = []
        names = [lk.key for lk in locks]
        for i in range(0, n, 1000):
            pipe = client.pipeline(transaction=False)
            for name in names[i:i + 1000]:
                pipe.pttl(name)
            ttls.extend(int(x) for x in pipe.execute())
        t0 = time.perf_counter()
        from django_rlock import LockNotOwnedError

        for lk in locks:
            try:
                lk.unlock()
            except LockNotOwnedError:
                pass  # lost (counted by ``alive``)
        release_s = time.perf_counter() - t0
        left = sum(int(client.exists(*names[i:i + 1000])) for i in range(0, n, 1000))
        out.put(("ok", WResult(
            n, watchdog_timeout, period, acquire_s, periods,
            (rt1 - rt0) / periods, (rn1 - rn0) / periods, (ev1 - ev0) / periods,
            (cpu1 - cpu0) * 1e3 / periods, (tc1 - tc0) * 1e3 / periods, (rc1 - rc0) / periods,
            (us1 - us0) / periods, n_wd, n_threads, sum(1 for t in ttls if t > 0),
            min(ttls) if ttls else -2, release_s, left,
            {k: (v - cmd0.get(k, 0)) / periods for k, v in cmd1.items()
             if v > cmd0.get(k, 0) and k != "info"})))
    except Exception:
        out.put(("error", traceback.format_exc()))


def run(server: RedisServer, n: int = 10_000, watchdog_timeout: float = 3.0, settle: float = 2.0,
        observe: float = 8.0, code: str | None = None) -> WResult:
    """``settle`` and ``observe`` are in watchdog periods (``watchdog_timeout / 3``); ``code``:
    a directory to import ``django_rlock`` from instead of this tree."""
    return spawn(_child, (server.socket_path, n, watchdog_timeout, settle, observe),
                 120 + n / 500 + (settle + observe) * watchdog_timeout / 3.0, code)


def _floor_child(socket_path: str, n: int, watchdog_timeout: float, settle: float,
                 observe: float, gap: float, out: Any, code: str | None = None) -> None:
    """The floor: ``n`` RLocks taken as the watchdog variant takes them (lease mode here, so
    this process's watchdog leaves them alone: same keys, same index entries, the same memory
    layout on the server), kept by one ``PEXPIRE`` per key per period in pipelines of 1,000,
    sent back to back (``gap`` 0) or ``gap`` seconds apart (nearer the watchdog's pace: its
    client work leaves the server ~1.5 ms idle between two of its pipelines). Reports server
    CPU ms per period."""
    try:
        from django_rlock import RLock

        client = redis.Redis(unix_socket_path=socket_path)
        stats = redis.Redis(unix_socket_path=socket_path)
        locks = [RLock(client, f"bench:f:{i}") for i in range(n)]
        for lk in locks:
            lk.lock(lease_time=600)
        keys = [lk.key for lk in locks]
        period = watchdog_timeout / 3.0

        def sweep() -> None:
            for i in range(0, n, 1000):
                pipe = client.pipeline(transaction=False)
                for k in keys[i:i + 1000]:
                    # Their taken lease, again: a slow sweep (a busy client) loses no key, and
                    # a PEXPIRE costs the server the same whatever the value.
                    pipe.pexpire(k, 600_000)
                pipe.execute()
                if gap:
                    time.sleep(gap)

        at = [time.monotonic()]

        def sweeps(count: float) -> None:
            """``count`` sweeps, one a period, on the watchdog's schedule."""
            for _ in range(int(count)):
                sweep()
                at[0] += period
                time.sleep(max(0.0, at[0] - time.monotonic()))

        sweeps(settle)
        _, _, rc0 = server_sample(stats)
        w0 = time.monotonic()
        sweeps(observe)
        _, _, rc1 = server_sample(stats)
        periods = (time.monotonic() - w0) / period
        client.flushall()  # its lease holds: nothing renews them, nothing to release in order
        out.put(("ok", (rc1 - rc0) / periods))
    except Exception:
        out.put(("error", traceback.format_exc()))


def floor(server: RedisServer, n: int = 10_000, watchdog_timeout: float = 3.0,
          settle: float = 2.0, observe: float = 8.0, gap: float = 0.0) -> float:
    """Server CPU ms per period of the floor (``_floor_child``)."""
    return spawn(_floor_child, (server.socket_path, n, watchdog_timeout, settle, observe, gap),
                 120 + (settle + observe) * watchdog_timeout / 3.0, None)


def spawn(target: Any, args: tuple[Any, ...], budget: float, code: str | None) -> Any:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, out, code), daemon=True)
    p.start()
    try:
        deadline = time.monotonic() + budget
        while True:
            try:
                kind, payload = out.get(timeout=1.0)
                break
            except queue.Empty:
                if p.exitcode is not None or time.monotonic() > deadline:
                    raise RuntimeError("watchdog benchmark process died or hung") from None
        if kind != "ok":
            raise RuntimeError(f"watchdog benchmark failed:\n{payload}")
        return payload
    finally:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(5)


def script_costs(server: RedisServer, n: int, rounds: int, pace: float = 0.0,
                 baseline: str | None = None) -> dict[str, list[float]]:
    """Server CPU us per key renewed, per variant and round (``--scripts``); ``baseline``:
    the source of another revision's ``renew_many.lua``, a variant of its own."""
    from django_rlock import RLock
    from django_rlock.engine.identity import thread_owner
    from django_rlock.engine.renewal import RENEW_BATCH, RENEW_MANY_SCRIPT
    from django_rlock.engine.scripts import RENEW_SCRIPT

    client = redis.Redis(unix_socket_path=server.socket_path)
    owner = thread_owner()
    locks = [RLock(client, f"bench:s:{i}") for i in range(n)]
    for lk in locks:  # real locks and index entries: the memory layout of held locks
        lk.lock(lease_time=600)
    keys = [lk.key for lk in locks]
    per_key = client.script_load(RENEW_SCRIPT.source)

    def floor(part: list[str], pipe: Any) -> None:
        for k in part:
            pipe.pexpire(k, 60_000)

    def floor_at(part: list[str], pipe: Any) -> None:
        at = int(time.time() * 1000) + 60_000
        for k in part:
            pipe.pexpireat(k, at)

    def old(part: list[str], pipe: Any) -> None:
        for j in range(0, len(part), RENEW_BATCH):
            chunk = part[j:j + RENEW_BATCH]
            pipe.evalsha(per_key, len(chunk), *chunk, *[a for _ in chunk for a in (owner, 60_000)])

    def runs(source: str) -> Any:
        sha = client.script_load(source)

        def fill(part: list[str], pipe: Any) -> None:
            for j in range(0, len(part), RENEW_BATCH):
                chunk = part[j:j + RENEW_BATCH]
                pipe.evalsha(sha, len(chunk), *chunk, owner, 60_000, len(chunk))
        return fill

    variants = {"floor (PEXPIRE pipeline)": floor, "PEXPIREAT pipeline": floor_at,
                "renew.lua (owner, lease per key)": old}
    if baseline is not None:
        variants["renew_many.lua (baseline)"] = runs(baseline)
    variants["renew_many.lua (this tree)"] = runs(RENEW_MANY_SCRIPT.source)
    out: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v, fill in variants.items():
            before = server_sample(client)[2]
            for i in range(0, n, 1000):
                pipe = client.pipeline(transaction=False)
                fill(keys[i:i + 1000], pipe)
                replies = pipe.execute()
                if pace:
                    time.sleep(pace)  # the watchdog's pace: client work between pipelines
                assert all(r == 1 or r == [] or r == [1] * len(r) for r in replies)
            out[v].append((server_sample(client)[2] - before) * 1e3 / n)
    client.flushall()
    return out


def baseline_source(code: str) -> str:
    """``renew_many.lua`` as the revision extracted to ``code`` sends it."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from django_rlock.engine.renewal import RENEW_MANY_SCRIPT as s; print(s.source)", code],
        capture_output=True, check=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    import argparse
    import statistics

    from bench import renewal  # this module by its importable name (spawned children)

    ap = argparse.ArgumentParser(description="watchdog server CPU vs one PEXPIRE pipeline")
    ap.add_argument("--locks", type=int, default=100_000)
    ap.add_argument("--timeout", type=float, default=3.0, help="watchdog_timeout (s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--observe", type=float, default=8.0, help="periods measured")
    ap.add_argument("--baseline", metavar="REF", help="also run the watchdog of git REF")
    ap.add_argument("--scripts", action="store_true",
                    help="the renew scripts alone, interleaved (no watchdog)")
    ap.add_argument("--pace", type=float, default=0.0,
                    help="--scripts: sleep this long (s) after each pipeline")
    ap.add_argument("--floor-gap", type=float, default=0.0,
                    help="also a floor that sleeps this long (s) after each pipeline")
    args = ap.parse_args(argv)
    code = extract(args.baseline) if args.baseline else None
    if args.scripts:
        with RedisServer() as server:
            res = script_costs(server, args.locks, args.rounds, args.pace,
                               baseline_source(code) if code else None)
        floor_each = res["floor (PEXPIRE pipeline)"]
        print(f"{args.locks:,} lock hashes renewed, {args.rounds} interleaved sweeps each "
              f"(medians), unix socket\n")
        print("| variant | server CPU us/key | x floor (median of sweeps) | range over sweeps |")
        print("|---|---|---|---|")
        for v, xs in res.items():
            ratios = [x / y for x, y in zip(xs, floor_each, strict=True)]
            print(f"| {v} | {statistics.median(xs):.2f} | {statistics.median(ratios):.2f} | "
                  f"{min(ratios):.2f}-{max(ratios):.2f} |")
        return 0
    variants: dict[str, str | None] = {"floor (PEXPIRE pipeline)": None}
    if args.floor_gap:
        variants[f"floor, {args.floor_gap * 1e3:g} ms after each pipeline"] = None
    variants["RLock"] = None
    if code:  # its django_rlock, extracted to a temp dir, imported by its process
        variants[f"RLock ({args.baseline})"] = code
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    scripts: dict[str, list[float]] = {v: [] for v in variants}
    trips: dict[str, list[float]] = {v: [] for v in variants}
    alive: dict[str, list[int]] = {v: [] for v in variants}
    client: dict[str, list[float]] = {v: [] for v in variants}
    inside: dict[str, list[float]] = {v: [] for v in variants}
    commands: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    names = list(variants)
    with RedisServer() as server:
        for rnd in range(args.rounds):
            for v in names[rnd % len(names):] + names[:rnd % len(names)]:
                if v.startswith("floor"):
                    gap = args.floor_gap if v != names[0] else 0.0
                    cpu[v].append(renewal.floor(server, args.locks, args.timeout,
                                                observe=args.observe, gap=gap))
                else:
                    w = renewal.run(server, args.locks, args.timeout, observe=args.observe,
                                    code=variants[v])
                    cpu[v].append(w.redis_cpu_ms)
                    scripts[v].append(w.server_evalsha)
                    trips[v].append(w.round_trips)
                    alive[v].append(w.alive)
                    client[v].append(w.process_cpu_ms)
                    inside[v].append(w.redis_script_ms * 1e3 / w.renewed if w.renewed else 0.0)
                    commands[v].append(w.commands)
                print(f"  round {rnd + 1} {v}: {cpu[v][-1]:.0f} ms server CPU per period",
                      file=sys.stderr, flush=True)
    period = args.timeout / 3.0
    base = statistics.median(cpu[names[0]])
    print(f"{args.locks:,} held locks, watchdog_timeout {args.timeout:g} s (period "
          f"{period:g} s), {args.rounds} rounds (medians; {args.observe:g} periods measured "
          f"per variant and round, in turns), unix socket\n")
    print("| variant | server CPU ms/s | x floor | rounds (x floor) | EVALSHA per period | "
          "round trips per period | usec in scripts per key | client CPU ms/s | locks kept |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v in names:
        m = statistics.median(cpu[v])
        ev = f"{statistics.median(scripts[v]):.0f}" if scripts[v] else "-"
        rt = f"{statistics.median(trips[v]):.0f}" if trips[v] else f"{args.locks / 1000:.0f}"
        each = ", ".join(f"{x / y:.2f}" for x, y in zip(cpu[v], cpu[names[0]], strict=True))
        kept = f"{min(alive[v]):,}" if alive[v] else "-"
        own = f"{statistics.median(client[v]) / period:.0f}" if client[v] else "-"
        usec = f"{statistics.median(inside[v]):.2f}" if inside[v] else "-"
        print(f"| {v} | {m / period:.0f} | {m / base:.2f} | {each} | {ev} | {rt} | {usec} | "
              f"{own} | {kept} |")
    print("\nEvery command the server ran per period, in scripts or not (median over rounds):\n")
    for v in names:
        if commands[v]:
            seen = sorted({k for c in commands[v] for k in c})
            ran = ", ".join(f"{k} {statistics.median([c.get(k, 0.0) for c in commands[v]]):,.0f}"
                            for k in seen)
            print(f"- {v}: {ran}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
