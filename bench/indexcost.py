"""What the lock index costs the server (issue #22): memory by entry size, and a pair's time.

    python -m bench.indexcost [--held 10000,100000] [--sizes 0,40,44,51,60,67,90]
        [--pairs 20000] [--rounds 5]        (--held "": the pair's parts only)

On a private unix-socket redis-server:

- **Memory by entry size.** N lock hashes as an RLock writes them (one owner field, a TTL) and,
  per variant, an index entry of S bytes per lock in one hash (what ``naming.index_key``
  names): ``used_memory`` delta / N, next to no index at all. It says which entry sizes a
  shorter format would have to reach: an entry costs its jemalloc size class (sds header and
  terminator included), so bytes saved count only across a class boundary.
- **A pair's script time by part.** The acquire and release scripts as they are, and with
  one guarantee's part taken out after another (the index's ``TIME``, its ``HSET``/``HDEL``;
  the release's check for a hand-off line; the unlock message Redisson's clients wait for),
  run in pipelines of 200 pairs on random keys out of 10,000 (no round trip per pair: what is
  left is the scripts' own server CPU), interleaved round by round, next to two ``EVALSHA`` of
  ``return 1`` and redis-py's ``Lock`` (``SET NX PX`` and its release script). The last
  variant, Redisson's hash lock with nothing of ours, is what a pair costs before any of
  django-rlock's guarantees: the rows between say what each one costs.
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
#: A format 3 entry as ``identity.thread_info`` writes it for ``MainThread`` (no time: the
#: acquire script stamps it).
FLOOR = "floor (2 EVALSHA of return 1)"
REDIS_PY = "redis-py Lock (SET NX PX, its release script)"
BARE = "... and without the unlock message (PUBLISH): a bare hash lock"
REDISSON = "... and with Redisson's own arguments (3 and 5, not 6 and 9): Redisson's lock"
INFO = "\x1ed26d846d:2\x1e\x01\x1e1bdpp8k4xc"


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
    from redis.lock import Lock

    from django_rlock.engine.scripts import ACQUIRE, RELEASE

    time_line = ("local t = redis.call('time'); local now = tonumber(t[1]) * 1000 + "
                 "math.floor(tonumber(t[2]) / 1000)")
    hset = "redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], now))"
    hdel = "redis.call('hdel', KEYS[3], KEYS[1])"
    for part, script in ((time_line, ACQUIRE), (hset, ACQUIRE), (hdel, RELEASE)):
        if part not in script:
            raise SystemExit(f"the scripts changed: no {part!r}; update bench/indexcost.py")
    line = "local queued = KEYS[6] and redis.call('exists', KEYS[5]) == 1"
    publish = "local n = redis.call('publish', KEYS[2], ARGV[3])"
    for part, script in ((line, RELEASE), (publish, RELEASE)):
        if part not in script:
            raise SystemExit(f"the scripts changed: no {part!r}; update bench/indexcost.py")
    no_time = ACQUIRE.replace(time_line, "local now = 0", 1)
    no_index = (no_time.replace(hset, "", 1), RELEASE.replace(hdel, "", 1))
    no_line = (no_index[0], no_index[1].replace(line, "local queued = false", 1))
    no_publish = (no_line[0], no_line[1].replace(publish, "local n = 0", 1))
    one = client.script_load("return 1")
    variants = {
        FLOOR: (one, one),
        REDIS_PY: ("", client.script_load(Lock.LUA_RELEASE_SCRIPT)),
        "acquire + release as they are": (client.script_load(ACQUIRE),
                                          client.script_load(RELEASE)),
        "without the index's TIME": (client.script_load(no_time), client.script_load(RELEASE)),
        "without any index work (TIME, HSET, HDEL)": tuple(map(client.script_load, no_index)),
        "... and without the release's check for a hand-off line (EXISTS)":
            tuple(map(client.script_load, no_line)),
        "... and with Redisson's own arguments (3 and 5, not 6 and 9): Redisson's lock":
            tuple(map(client.script_load, no_line)),
        BARE:
            tuple(map(client.script_load, no_publish)),
    }
    keys = [f"k{i}" for i in range(10_000)]

    def run(acq: str, rel: str, variant: str) -> None:
        floor = variant == FLOOR
        for _ in range(0, pairs, 200):
            pipe = client.pipeline(transaction=False)
            for _ in range(200):
                k = random.choice(keys)
                if variant == REDIS_PY:
                    pipe.set(k, OWNER, nx=True, px=30000)
                    pipe.evalsha(rel, 1, k, OWNER)
                    continue
                if floor:
                    pipe.evalsha(acq, 1, k)
                    pipe.evalsha(rel, 1, k)
                    continue
                if variant in (REDISSON, BARE):  # Redisson's own arguments: 1 + 2, then 2 + 3
                    pipe.evalsha(acq, 1, k, 30000, OWNER)
                    pipe.evalsha(rel, 2, k, f"redisson_lock__channel:{{{k}}}", OWNER, 30000, "0")
                    continue
                # what RLock sends for an uncontended pair: 2 KEYS + 4 ARGV, 6 KEYS + 3 ARGV
                pipe.evalsha(acq, 2, k, "rlock-index:", 30000, OWNER, INFO, "fresh")
                pipe.evalsha(rel, 6, k, f"redisson_lock__channel:{{{k}}}", "rlock-index:",
                             f"rlock_handoff_queue:{{{k}}}", f"rlock_handoff_waiters:{{{k}}}",
                             f"rlock_handoff_channel:{{{k}}}", OWNER, 30000, "0")
            replies = pipe.execute()
            if variant == REDIS_PY:
                if replies[:2] != [True, 1]:
                    raise SystemExit(f"unexpected replies {replies[:2]}")
            elif not floor and (replies[0] is not None or replies[1] != 1):
                raise SystemExit(f"unexpected replies {replies[:2]}")

    def cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    out: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v, (acq, rel) in variants.items():
            before = cpu()
            run(acq, rel, v)
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
    if held:  # (--held "": the pair's parts only)
        print("**memory per held lock by index entry size (used_memory delta / N)**\n")
        print("| index entry | " + " | ".join(f"B/lock at {n:,}" for n in held) + " |")
        print("|---|" + "---|" * len(held))
        for s in sizes:
            label = "no index" if s is None else f"{s} B"
            print(f"| {label} | " + " | ".join(f"{mem[(s, n)]:.0f}" for n in held) + " |")
    if parts:
        floor = statistics.median(parts[FLOOR])
        print(f"\n**a pair's server CPU by part ({args.pairs:,} pairs in pipelines of 200, "
              f"{args.rounds} interleaved rounds, medians)**\n")
        print("| variant | server CPU us/pair | x floor |")
        print("|---|---|---|")
        for v, xs in parts.items():  # (each "..." row takes one more part out)
            m = statistics.median(xs)
            print(f"| {v} | {m:.2f} | {m / floor:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
