"""What the index sweep costs (``engine/sweep.py``): a round's commands and time, and the memory
it gives back.

    python -m bench.sweepcost [--entries 100000] [--leases 5000]

On a private unix-socket redis-server, rounds run as the watchdog's thread runs them
(``sweep.page`` then ``sweep.prune``, one after the other):

- **live**: ``--entries`` index entries whose locks exist (lock hashes with a TTL, as RLock
  writes them): a round reads one page and prunes nothing;
- **gone**: as many entries whose locks are gone (what expired leases leave): a round prunes
  its page;
- **leases**: ``--leases`` RLock leases taken and run out (PEXPIRE 1 ms): ``used_memory``
  before the sweep, after it, and the rounds it took.

Per round: the commands the server ran (INFO commandstats, the script's inner ones included),
their server time (commandstats ``usec``), and the round's wall time on the client (median and
max over a whole walk of the index, the cursor back to 0, or 200 rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OWNER = "d26d846d-12b2-435b-98ab-818cde2fcd44:2"
ENTRY = "1764000000.000000 \x1ed26d846d:2\x1e\x01\x1e1bdpp8k4xc"


def _stats(client: Any) -> tuple[int, int]:
    stats = client.info("commandstats")
    own = ("cmdstat_info", "cmdstat_config")
    calls = sum(v["calls"] for k, v in stats.items() if not k.startswith(own))
    usec = sum(v["usec"] for k, v in stats.items() if not k.startswith(own))
    return calls, usec


def _fill(client: Any, n: int, live: bool) -> None:
    client.flushall()
    for i in range(0, n, 5000):
        pipe = client.pipeline(transaction=False)
        for j in range(i, min(n, i + 5000)):
            key = f"b:{j}"
            if live:
                pipe.hincrby(key, OWNER, 1)
                pipe.pexpire(key, 600_000)
            pipe.hset("rlock-index:b:", key, ENTRY)
        pipe.execute()


def rounds(client: Any, prefix: str, limit: int = 200) -> dict[str, float]:
    """Rounds from cursor 0 until the walk ends (or ``limit``): per-round costs."""
    from django_rlock.engine import sweep

    cursor, walls, cmds, usecs, pruned = 0, [], [], [], []
    for _ in range(limit):
        client.config_resetstat()
        t0 = time.perf_counter()
        cursor, gone = sweep.page(client, prefix, cursor)
        pruned.append(sweep.prune(client, gone) if gone else 0)
        walls.append(time.perf_counter() - t0)
        calls, usec = _stats(client)
        cmds.append(calls)
        usecs.append(usec)
        if cursor == 0:
            break
    return {"rounds": len(walls), "wall_ms_median": statistics.median(walls) * 1000,
            "wall_ms_max": max(walls) * 1000, "commands_median": statistics.median(cmds),
            "commands_max": max(cmds), "server_us_median": statistics.median(usecs),
            "pruned_per_round": statistics.median(pruned)}


def leases(client: Any, n: int) -> dict[str, float]:
    """``n`` RLock leases that ran out: memory with their entries, then after the sweep."""
    from django_rlock import RLock
    from django_rlock.engine import sweep
    from django_rlock.engine.naming import index_key

    client.flushall()
    base = client.info("memory")["used_memory"]
    keys = []
    for i in range(n):
        lock = RLock(client, f"l{i}", prefix="lease:")
        lock.lock(lease_time=600)
        keys.append(lock.key)
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.pexpire(k, 1)
    pipe.execute()
    time.sleep(0.05)
    while any(client.exists(*keys[i:i + 1000]) for i in range(0, n, 1000)):  # reaped now
        time.sleep(0.05)
    client.execute_command("MEMORY", "PURGE")
    left = client.info("memory")["used_memory"]
    entries = client.hlen(index_key("lease:"))
    index_kb = client.memory_usage(index_key("lease:"), samples=0) / 1024
    cursor, done = 0, 0
    while client.hlen(index_key("lease:")):
        cursor, gone = sweep.page(client, "lease:", cursor)
        sweep.prune(client, gone)
        done += 1
    client.execute_command("MEMORY", "PURGE")
    after = client.info("memory")["used_memory"]
    return {"entries": entries, "index_kb": index_kb,
            "dbsize": client.dbsize(), "kb_left_by_expired": (left - base) / 1024,
            "kb_after_sweep": (after - base) / 1024, "index_after": client.exists(index_key("lease:")),
            "rounds": done}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--leases", type=int, default=5000)
    args = ap.parse_args()
    from bench.server import RedisServer
    from django_rlock.engine import sweep

    print(f"COUNT={sweep.COUNT} PERIOD={sweep.PERIOD}s HURRY={sweep.HURRY}s")
    with RedisServer() as server:
        client = server.client()
        for live in (True, False):
            _fill(client, args.entries, live)
            got = rounds(client, "b:")
            print(f"{'live' if live else 'gone'} x {args.entries}: " + ", ".join(
                f"{k}={v:.3g}" for k, v in got.items()))
        got = leases(client, args.leases)
        print(f"leases x {args.leases}: " + ", ".join(f"{k}={v:.4g}" for k, v in got.items()))


if __name__ == "__main__":
    main()
