"""What the lock index costs the server (issue #22): memory by entry size, and a pair's time.

    python -m bench.indexcost [--held 10000,100000] [--sizes 0,40,44,51,60,67,90]
        [--pairs 20000] [--rounds 5]

On a private unix-socket redis-server:

- **Memory by entry size.** N lock hashes as an RLock writes them (one owner field, a TTL) and,
  per variant, an index entry of S bytes per lock in one hash (what ``naming.index_key``
  names): ``used_memory`` delta / N, next to no index at all. It says which entry sizes a
  shorter format would have to reach: an entry costs its jemalloc size class (sds header and
  terminator included), so bytes saved count only across a class boundary.
- **A pair's script time by part.** The acquire and release scripts as they are, and with the
  index's parts taken out (its ``TIME``, its ``HSET``/``HDEL``), run in pipelines of 200 pairs
  on random keys out of 10,000 (no round trip per pair: what is left is the scripts' own
  server CPU), interleaved round by round, next to two ``EVALSHA`` of ``return 1``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OWNER = "d26d846d-12b2-435b-98ab-818cde2fcd44:2"
#: A format 2 entry as ``identity.thread_info`` writes it (host "vm", label "bench": short).
INFO = ("1795710736840\x1fd26d846d:2\x1fThread-1 (go)\x1f139884957263552\x1f540\x1fbench"
        "\x1fvm")


def memory(client: Any, n: int, size: int | None) -> float:
    """Bytes per lock: N lock hashes, each with an index entry of ``size`` bytes (None: no
    index)."""
    client.flushall()
    before = client.info("memory")["used_memory"]
    for i in range(0, n, 5000):
        pipe = client.pipeline(transaction=False)
        for j in range(i, min(n, i + 5000)):
            key = f"h:{j}"
            pipe.hincrby(key, OWNER, 1)
            pipe.pexpire(key, 600_000)
            if size is not None:
                pipe.hset("rlock-index:h:", key, "x" * size)
        pipe.execute()
    after = client.info("memory")["used_memory"]
    client.flushall()
    return (after - before) / n


def pair_parts(client: Any, pairs: int, rounds: int) -> dict[str, list[float]]:
    """Server CPU us per pair, per variant and round."""
    from django_rlock.engine.scripts import ACQUIRE, RELEASE

    time_line = ("local t = redis.call('time'); local now = tonumber(t[1]) * 1000 + "
                 "math.floor(tonumber(t[2]) / 1000)")
    hset = "redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], now))"
    hdel = "redis.call('hdel', KEYS[3], KEYS[1])"
    for part, script in ((time_line, ACQUIRE), (hset, ACQUIRE), (hdel, RELEASE)):
        if part not in script:
            raise SystemExit(f"the scripts changed: no {part!r}; update bench/indexcost.py")
    no_time = ACQUIRE.replace(time_line, "local now = 0", 1)
    one = client.script_load("return 1")
    variants = {
        "floor (2 EVALSHA of return 1)": (one, one),
        "acquire + release as they are": (client.script_load(ACQUIRE),
                                          client.script_load(RELEASE)),
        "without the index's TIME": (client.script_load(no_time), client.script_load(RELEASE)),
        "without any index work (TIME, HSET, HDEL)": (
            client.script_load(no_time.replace(hset, "", 1)),
            client.script_load(RELEASE.replace(hdel, "", 1))),
    }
    keys = [f"k{i}" for i in range(10_000)]

    def run(acq: str, rel: str, floor: bool) -> None:
        for _ in range(0, pairs, 200):
            pipe = client.pipeline(transaction=False)
            for _ in range(200):
                k = random.choice(keys)
                if floor:
                    pipe.evalsha(acq, 1, k)
                    pipe.evalsha(rel, 1, k)
                    continue
                pipe.evalsha(acq, 2, k, "rlock-index:", 30000, OWNER, INFO, "fresh")
                pipe.evalsha(rel, 6, k, f"redisson_lock__channel:{{{k}}}", "rlock-index:",
                             f"rlock_handoff_queue:{{{k}}}", f"rlock_handoff_waiters:{{{k}}}",
                             f"rlock_handoff_channel:{{{k}}}", OWNER, 30000, 0, "", 0, 0, "", "",
                             OWNER[:36])
            replies = pipe.execute()
            if not floor and (replies[0] is not None or replies[1] != 1):
                raise SystemExit(f"unexpected replies {replies[:2]}")

    def cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    out: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v, (acq, rel) in variants.items():
            before = cpu()
            run(acq, rel, v.startswith("floor"))
            out[v].append((cpu() - before) * 1e6 / pairs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held", default="10000,100000")
    ap.add_argument("--sizes", default="0,40,44,51,60,67,90")
    ap.add_argument("--pairs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    import redis

    from bench.server import RedisServer

    held = [int(x) for x in args.held.split(",") if x]
    sizes: list[int | None] = [None, *(int(x) for x in args.sizes.split(",") if x)]
    with RedisServer() as server:
        client = redis.Redis(unix_socket_path=server.socket_path)
        mem = {(s, n): memory(client, n, s) for n in held for s in sizes}
        parts = pair_parts(client, args.pairs, args.rounds) if args.pairs else {}
    print("**memory per held lock by index entry size (used_memory delta / N)**\n")
    print("| index entry | " + " | ".join(f"B/lock at {n:,}" for n in held) + " |")
    print("|---|" + "---|" * len(held))
    for s in sizes:
        label = "no index" if s is None else f"{s} B"
        print(f"| {label} | " + " | ".join(f"{mem[(s, n)]:.0f}" for n in held) + " |")
    if parts:
        floor = statistics.median(next(iter(parts.values())))
        print(f"\n**a pair's server CPU by part ({args.pairs:,} pairs in pipelines of 200, "
              f"{args.rounds} interleaved rounds, medians)**\n")
        print("| variant | server CPU us/pair | x floor |")
        print("|---|---|---|")
        for v, xs in parts.items():
            m = statistics.median(xs)
            print(f"| {v} | {m:.2f} | {m / floor:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
