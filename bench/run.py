"""Run the benchmark suite: ``python bench/run.py [--quick] [--markdown docs/benchmarks.md]``.

One private redis-server serves every phase, so the libraries are compared on the same
server in the same run; see ``docs/benchmarks.md`` for what is measured and why.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

import redis

from bench import contention, foreign, renewal, report, uncontended
from bench.clients import FLOOR, PRL, REDIS_PY, RLOCK, RLOCK_LEASE, commandstats, delta
from bench.server import RedisServer


@dataclass(frozen=True)
class Plan:
    a_rounds: int
    a_seconds: float
    b_rounds: int
    b_seconds: float
    w_locks: int
    w_settle: float
    w_observe: float
    f_rounds: int
    f_seconds: float
    #: B layouts, (processes, threads each): in-process, then between processes (issue #11).
    b_modes: tuple[tuple[int, int], ...] = ((1, 8), (4, 1), (4, 2))
    hold_s: float = 0.001
    w_timeout: float = 3.0
    f_rlock_procs: int = 3


FULL = Plan(a_rounds=5, a_seconds=2.0, b_rounds=7, b_seconds=4.0, w_locks=10_000, w_settle=2,
            w_observe=9, f_rounds=2, f_seconds=4.0)
QUICK = Plan(a_rounds=1, a_seconds=1.0, b_rounds=1, b_seconds=2.5, w_locks=10_000, w_settle=1,
             w_observe=3, f_rounds=1, f_seconds=2.5)

A_LIBS = [FLOOR, RLOCK, RLOCK_LEASE, REDIS_PY, PRL]
B_LIBS = [RLOCK, REDIS_PY, PRL]


def script_calls_counted(server: RedisServer) -> bool:
    """Does this server count commands called from Lua in INFO commandstats? (6.2 and 7 do.)"""
    c = server.client()
    try:
        before = commandstats(c)
        c.eval("redis.call('exists', KEYS[1]) return 1", 1, "bench:probe")
        return delta(commandstats(c), before).get("exists", 0) > 0
    finally:
        c.close()


def machine(server: RedisServer) -> list[tuple[str, str]]:
    from redis.utils import HIREDIS_AVAILABLE
    try:
        import hiredis
        hv = f"yes ({hiredis.__version__})" if HIREDIS_AVAILABLE else "no"
    except ImportError:
        hv = "no"
    try:
        import redis_lock
        prl = redis_lock.__version__
    except ImportError:
        prl = "not installed"
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False).stdout.strip() or "?"
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "django_rlock"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        if dirty:
            rev += " + uncommitted changes under django_rlock/"
    except (OSError, subprocess.SubprocessError):
        rev = "?"
    return [
        ("date", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("machine", (f"{platform.machine()}, {os.cpu_count()} CPUs (nproc), {platform.system()} "
                    f"{platform.release()}")),
        ("python", platform.python_version()),
        ("redis-server", f"{server.version} ({server.binary}), unix socket"
                         + (" and loopback TCP (B)" if server.port else "") + ", no persistence"),
        ("redis-py", redis.__version__),
        ("hiredis", hv),
        ("python-redis-lock", prl),
        ("django-rlock", f"git {rev}"),
    ]


def method_notes(plan: Plan, counted: bool, server: RedisServer) -> list[str]:
    return [
        ("(A) every library in each round, taking turns in blocks of 50 pairs (rotated order; "
         "each on its own client), after 500 warm-up pairs; a pair is "
        "`lock()` + `unlock()` (redis-py `acquire()`/`release()`), timed with "
        "`time.perf_counter_ns`. The floor is two `EVALSHA` of `return 1` through the same "
        "redis-py client. Ratios are taken within a round; the table shows medians of rounds."),
        ("django-rlock runs in watchdog mode (the default, `lease_time=None`); the lease row uses "
        "`lease_time=30`. redis-py `Lock(timeout=30)` (default 0.1 s retry sleep), "
        "python-redis-lock `Lock(expire=30, auto_renewal=False)`."),
        (f"(B) every run is {plan.b_seconds:g} s in freshly spawned processes. A contender "
        f"loops: acquire (wait up to 30 s), HGET a counter, sleep {plan.hold_s * 1e3:g} ms, HSET "
        "counter+1, release. Timestamps are `time.monotonic_ns` (CLOCK_MONOTONIC, shared by all "
        "processes). Hand-off gap = next holder's acquire returning minus the previous "
        "holder's release call; cross-holder = the holder changed; same holder = a contender "
        "got the lock straight back. Wait = acquire call to acquire return. share min-max = "
        "fewest and most acquisitions of one contender relative to the mean (1.00 is fair). "
        "Medians over rounds, except max wait (the worst of all rounds). Layouts: "
        + ", ".join(report.BMode(p, t).title for p, t in plan.b_modes) + "; between processes "
        "the share target is per process (all its threads together). With `--transport both` "
        "(the default) every layout runs on the unix socket, then again over loopback TCP to "
        "the same server (the sections marked TCP)."),
        ("Exclusion is checked twice: the non-atomic counter must equal the number of "
        "acquisitions, and no hand-off gap may be negative (an overlap)."),
        "Client commands are counted at redis-py's command packer in the contender processes "
        "(every command on every connection, the pub/sub one included; connection handshakes "
        "excluded). Server commands are the `INFO commandstats` delta over the run without the "
        "benchmark's own INFO/HGET/HSET. "
        + (f"This Redis ({server.version}) counts commands called inside Lua scripts in "
           "commandstats (checked at start with a probe script), so the server figure is work "
           "done, not commands sent."
           if counted else f"This Redis ({server.version}) did not count script-inner "
           "commands in commandstats (checked at start).")
        + " EVALSHA is never called from a script, so its client and server counts must agree.",
        (f"(W) a spawned process acquires {plan.w_locks:,} distinct locks in watchdog mode with "
        f"`watchdog_timeout={plan.w_timeout:g}` (renewal period {plan.w_timeout / 3:g} s), lets "
        f"{plan.w_settle:g} period(s) pass, then observes {plan.w_observe:g} periods: "
        "`watchdog().round_trips` and `.renewed` deltas, process CPU (`time.process_time`) and "
        "the watchdog thread's own CPU clock, and the server's INFO. Then every key's PTTL is "
        "read and all locks are released."),
        (f"(F) {plan.f_rounds} round(s) of {plan.f_seconds:g} s: {plan.f_rlock_procs} spawned "
        "django-rlock processes (`RLock`, watchdog mode) and one spawned process that calls "
        "nothing of django-rlock and runs what a Java Redisson client sends for "
        "`tryLock(waitTime)`/`unlock()`: Redisson's acquire script (field `<uuid>:<thread>`, "
        "lease 30 s); on failure a plain SUBSCRIBE (RESP2, its own connection) to "
        "`redisson_lock__channel:{key}`, one more try, then a wait for `0` or the returned PTTL "
        "before each retry; UNSUBSCRIBE once it holds the lock; Redisson's unlock script "
        "(`del`, `publish 0`). One thread each, the B loop (counter, ~1 ms hold, records). "
        "Share = a process's acquisitions (total over rounds) / the mean of the django-rlock "
        "processes'; straight back = its acquisitions that followed its own release."),
        ("On a 2-core machine the client processes, redis-server and anything else running "
        "share two CPUs; absolute numbers move between runs, ratios within a run much less."),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run (fewer, shorter rounds)")
    ap.add_argument("--markdown", metavar="PATH", help="write the results page (e.g. docs/benchmarks.md)")
    ap.add_argument("--only", default="abfw",
                    help="phases to run, any of a, b, f, w (default: abfw)")
    ap.add_argument("--transport", choices=["unix", "tcp", "both"], default="both",
                    help="B's connections: a unix socket, loopback TCP, or each in turn "
                         "(default: both)")
    args = ap.parse_args(argv)
    transports = ["unix", "tcp"] if args.transport == "both" else [args.transport]
    plan = QUICK if args.quick else FULL
    only = set(args.only.lower())
    command = shlex.join([sys.executable, *sys.argv])
    t0 = time.monotonic()

    def phase(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    from django_rlock.testing import free_port
    with RedisServer(port=free_port() if "tcp" in transports else 0) as server:
        phase(f"redis-server {server.version} on {server.socket_path}")
        counted = script_calls_counted(server)
        res = report.Results(plan.hold_s * 1e3)
        if "a" in only:
            phase("A: uncontended pairs")
            res.a = uncontended.run(server, A_LIBS, plan.a_rounds, plan.a_seconds)
        if "b" in only:
            for transport in transports:
                for procs, threads in plan.b_modes:
                    mode = report.BMode(procs, threads, transport)
                    phase(f"B: {mode.label}")
                    res.b.append((mode, contention.run(
                        server, B_LIBS, procs, threads, plan.b_rounds, plan.b_seconds,
                        plan.hold_s, PRL, f"{procs}x{threads}", transport)))
        if "f" in only:
            phase(f"F: {plan.f_rlock_procs} django-rlock processes and a foreign waiter")
            res.f = foreign.run(server, plan.f_rounds, plan.f_seconds, plan.hold_s,
                                plan.f_rlock_procs)
        if "w" in only:
            phase(f"W: {plan.w_locks:,} watchdog-mode locks")
            res.w = renewal.run(server, plan.w_locks, plan.w_timeout, plan.w_settle, plan.w_observe)
        info = machine(server)
        method = method_notes(plan, counted, server)
    phase("done")
    print(report.render_text(res))
    if args.markdown:
        path = Path(args.markdown)
        settings = [("mode", "quick" if args.quick else "full"),
                    ("A", f"{plan.a_rounds} round(s) x {plan.a_seconds:g} s per library"),
                    ("B", f"{plan.b_rounds} round(s) x {plan.b_seconds:g} s per library and mode"),
                    ("F", f"{plan.f_rounds} round(s) x {plan.f_seconds:g} s"),
                    ("W", f"{plan.w_locks:,} locks, {plan.w_observe:g} periods observed"),
                    ("wall time", f"{time.monotonic() - t0:.0f} s")]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.render_markdown(res, path, command, info, settings, method))
        print(f"\nwrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
