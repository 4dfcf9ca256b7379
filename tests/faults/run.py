"""The fault test from the command line:

    python -m tests.faults.run --seconds 600 --seed 7
    python -m tests.faults.run --seconds 20 --seed 1 --seed 2 --seed 3
    RLOCK_FAULTS_BREAK=naive python -m tests.faults.run --seconds 15 --seed 1   (or --break naive)

Prints each run's summary (``--json``: as JSON) and the first silent overlaps, unexplained
lost updates and stale fenced writes; exits 1 if any run has one. ``--keep`` keeps the run
directories (histories, faults, store dump, workers' stderr) for reading.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tests.faults.checker import check, format_summary
from tests.faults.harness import ROUND, FaultRun, cleanup
from tests.faults.worker import KINDS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, action="append", help="repeatable; default 7")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--threads", type=int, default=3, help="threads per worker (sync kinds)")
    ap.add_argument("--loops", type=int, default=1, help="event loops per worker (async kinds)")
    ap.add_argument("--tasks", type=int, default=3, help="asyncio tasks per event loop")
    ap.add_argument("--lease", type=float, default=2.0, help="watchdog_timeout of every lock")
    ap.add_argument("--kinds", default=",".join(ROUND),
                    help="one round of the fault schedule, comma-separated (a kind may repeat)")
    ap.add_argument("--lock-kinds", default=",".join(KINDS), help="the lock kinds workers take")
    ap.add_argument("--break", dest="broken", default=os.environ.get("RLOCK_FAULTS_BREAK", ""),
                    choices=("", "naive", "ignore-lost"), help="a deliberately broken lock")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--verbose", action="store_true", help="print each fault as it happens")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--show", type=int, default=3, help="how many of each problem to print")
    args = ap.parse_args(argv)
    failed = False
    for seed in args.seed or [7]:
        run = FaultRun(seed, args.seconds, workers=args.workers, threads=args.threads,
                       loops=args.loops, tasks=args.tasks,
                       lease=args.lease, kinds=tuple(args.kinds.split(",")), broken=args.broken,
                       lock_kinds=tuple(args.lock_kinds.split(",")),
                       log=print if args.verbose else None)
        directory = run.run()
        report = check(directory)
        print(f"== seed {seed}{' (broken: ' + args.broken + ')' if args.broken else ''}: {directory}")
        print(json.dumps(report.summary, indent=1) if args.json else format_summary(report.summary))
        for title, items in (("silent overlap", report.silent),
                             ("unexplained lost update", report.lost_unexplained),
                             ("unexplained stale fenced write", report.stale_unexplained),
                             ("holder not told its hold was gone", report.unowned),
                             ("phantom hold", report.phantoms),
                             ("overlap told without an injected fault", report.told_only),
                             ("late answer without a fault", report.late)):
            for item in items[:args.show]:
                print(f"-- {title}: {json.dumps(item, default=str)}")
        failed |= not report.ok()
        if not args.keep:
            cleanup(directory)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
