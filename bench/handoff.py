"""Bench B's hand-off, before and after, on a unix socket and on loopback TCP, in one run.

    python bench/handoff.py [--modes 1x8,4x1,4x2] [--rounds 5] [--seconds 4]
        [--transport both] [--baseline REF] [--libs prl,redis-py]

Runs ``contention.run`` (bench B: the same contenders, counter and checks) for every layout
(processes x threads on one key) and transport against one private redis-server, with
django-rlock, python-redis-lock (the reference of every ratio) and, with ``--baseline REF``,
django-rlock as it is at git revision REF (its ``django_rlock`` extracted to a temp dir and
imported by its contender processes), the libraries taking turns in every round. Prints one
markdown table per layout and transport: cross-holder hand-off p50 and p99, p50 against
python-redis-lock's (the median of the per-round ratios), worst wait, commands per
acquisition and the exclusion check.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

from bench import contention  # noqa: E402
from bench.baseline import extract  # noqa: E402
from bench.clients import PRL, REDIS_PY, RLOCK  # noqa: E402


def num(v: float, digits: int = 2) -> str:
    return f"{v:,.{digits}f}"


def table(res: dict[str, contention.Summary], ref: str) -> list[str]:
    rows = ["| library | cross-holder p50 / p99 ms | p50 vs python-redis-lock | max wait ms | "
            "client cmds/acq | server cmds/acq | exclusion |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for lib, s in res.items():
        name = lib if lib != contention.BASELINE else f"{lib}, {ref}"
        rows.append(f"| {name} | {num(s.cross(50), 3)} / {num(s.cross(99), 3)} | "
                    f"{num(s.cross_ratio)}x | {num(s.max_wait_ms, 1)} | {num(s.client_per_acq)} | "
                    f"{num(s.server_per_acq)} | {'ok' if s.checks_ok else 'VIOLATED'} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="1x8", help="layouts, PROCSxTHREADS, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0, help="per library, layout and round")
    ap.add_argument("--transport", choices=["unix", "tcp", "both"], default="both")
    ap.add_argument("--baseline", metavar="REF", help="also run django-rlock at git revision REF")
    ap.add_argument("--libs", default="prl", help="peers: prl, redis-py (comma-separated)")
    args = ap.parse_args(argv)
    modes = [tuple(int(x) for x in m.split("x")) for m in args.modes.split(",")]
    transports = ["unix", "tcp"] if args.transport == "both" else [args.transport]
    peers = {"prl": PRL, "redis-py": REDIS_PY}
    libs = [RLOCK] + ([contention.BASELINE] if args.baseline else []) + [
        peers[p] for p in args.libs.split(",") if p]
    if PRL not in libs:
        libs.append(PRL)
    code = extract(args.baseline) if args.baseline else ""
    try:
        return run(args, modes, transports, libs, code)
    finally:
        if code:
            shutil.rmtree(code, ignore_errors=True)


def run(args: argparse.Namespace, modes: list[tuple[int, ...]], transports: list[str],
        libs: list[str], code: str) -> int:
    # Here, not at the top: spawned contender processes import this module, and a baseline's
    # must import django_rlock from its own tree (``bench.server`` imports it).
    from bench.server import RedisServer
    from django_rlock.testing import free_port

    out = [f"`{shlex.join(['python', 'bench/handoff.py', *sys.argv[1:]])}`: "
           f"{args.rounds} round(s) x {args.seconds:g} s per library, layout and transport, "
           f"hold ~1 ms; medians over rounds (max wait: the worst)."]
    with RedisServer(port=free_port()) as server:
        out[0] += f" redis-server {server.version}."
        for procs, threads in modes:
            for transport in transports:
                label = (f"{threads} threads in one process" if procs == 1
                         else f"{procs} processes x {threads} threads")
                print(f"[{transport}] {label}", file=sys.stderr, flush=True)
                res = contention.run(server, libs, procs, threads, args.rounds, args.seconds,
                                     0.001, PRL, f"h{procs}x{threads}", transport, code)
                out += ["", f"**{transport}: {label}**", "", *table(res, args.baseline or "")]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
