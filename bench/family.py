"""The lock family against RLock and the floor, on one private server in one run.

    python bench/family.py [--quick]

- Fair hand-off: 8 contenders (4 spawned processes x 2 threads) on one key, each holding it
  ~1 ms (bench/contention.py's harness, the same as RLock's B table): hand-off gap p50 between
  different holders, acquire wait p50 / max, and how often a grant went to a contender that
  called after the previous holder (an *overtake*: a fair lock should have almost none, RLock
  many).
- Semaphore pairs: uncontended acquire+release pairs of ``Semaphore`` and
  ``PermitExpirableSemaphore`` (1000 permits), next to the floor (two EVALSHA of ``return 1``)
  and RLock, in rotated rounds (bench/uncontended.py).

Prints a Markdown section; paste it into docs/benchmarks.md with the command.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

from bench import contention, uncontended  # noqa: E402
from bench.clients import FAIR, FLOOR, PERMITS, RLOCK, SEMAPHORE  # noqa: E402
from bench.server import RedisServer  # noqa: E402
from bench.stats import median, percentile  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rounds, seconds, b_seconds = (1, 1.0, 2.5) if args.quick else (3, 2.0, 4.0)
    with RedisServer() as server:
        fair = contention.run(server, [RLOCK, FAIR], procs=4, threads=2, rounds=rounds,
                              duration_s=b_seconds, hold_s=0.001, reference=RLOCK,
                              label="family")
        pairs = uncontended.run(server, [FLOOR, RLOCK, SEMAPHORE, PERMITS], rounds, seconds)
        version = server.client().info("server")["redis_version"]
    cmd = "python bench/family.py" + (" --quick" if args.quick else "")
    print(f"Command: `{cmd}`; Redis {version}, Python {platform.python_version()}, "
          f"{rounds} round(s).\n")
    print("Hand-off, 4 processes x 2 threads, one key, ~1 ms hold:\n")
    print("| lock | acq/s | hand-off p50 (ms, other holder) | vs RLock | wait p50 (ms) "
          "| wait max (ms) | out-of-order grants | checks |")
    print("|---|---|---|---|---|---|---|---|")
    for lib, s in fair.items():
        waits = median([percentile(r.waits_ms, 50) for r in s.runs])
        order = median([r.out_of_order for r in s.runs])
        print(f"| {lib} | {s.acq_per_s:,.0f} | {s.cross(50):.2f} | {s.cross_ratio:.2f}x | "
              f"{waits:.1f} | {s.max_wait_ms:.1f} | {order:.1%} | "
              f"{'clean' if s.checks_ok else 'FAILED'} |")
    print("\nUncontended acquire+release pairs (1000 permits):\n")
    print("| | pairs/s | p50 (µs) | p99 (µs) | p50 vs floor |")
    print("|---|---|---|---|---|")
    for lib, res in pairs.items():
        print(f"| {lib} | {res.pairs_per_s:,.0f} | {res.p50_us:.0f} | {res.p99_us:.0f} | "
              f"{res.ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
