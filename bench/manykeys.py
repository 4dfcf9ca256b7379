"""Server work per lock (issue #22): many keys, and many held locks.

    python bench/manykeys.py [--procs 4] [--threads 8] [--keys 10000] [--seconds 3]
        [--rounds 3] [--held 1000,10000,100000] [--baseline REF] [--transport both]
        [--held-only] [--markdown docs/benchmarks.md]

On a private redis-server (a unix socket and a loopback TCP port):

- **(K) many keys.** ``--procs`` spawned processes x ``--threads`` threads each run
  uncontended pairs on random keys out of ``--keys`` for ``--seconds`` per variant and round
  (the variants take turns, rotated each round). Variants: the floor (two ``EVALSHA`` of
  ``return 1`` naming the key), redis-py ``Lock`` (``SET NX PX`` + its release script),
  ``RLock`` (watchdog mode: the default) and, with ``--baseline REF``, ``RLock`` as it is at
  git revision REF (its ``django_rlock`` extracted to a temp dir and imported by its
  processes instead of this tree's). Per pair, from the server: CPU (``used_cpu_sys`` +
  ``used_cpu_user`` delta), commands (``INFO commandstats`` calls, those run inside scripts
  included) and the commandstats usec of EVALSHA/EVAL (time inside the scripts, which is
  load-independent: a busy machine stretches wall time, not this).
- **(M) many held locks.** One process per variant takes ``--held`` N distinct locks (lease
  mode, nothing renews them) and the server's ``used_memory`` delta divided by N is the
  memory per held lock, next to redis-py ``Lock``'s ``SET NX PX`` (its 32-char token). The
  index's share is the delta minus the lock keys' own (``MEMORY USAGE`` of the keys alone,
  summed over a sample, is not used: it leaves out the main dict's entries).

Server-side figures are what this measures: client CPU and wall time on a shared 2-core
machine move with load; commandstats usec and memory do not much.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import random
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

from bench.baseline import extract  # noqa: E402

FLOOR = "floor (2 EVALSHA)"
REDIS_PY = "redis-py Lock"
RLOCK = "RLock"
BASE = "RLock (baseline)"
SCRIPT_CMDS = ("evalsha", "eval")
OWN = ("info", "config", "ping", "hello", "client", "select", "script", "flushall", "memory")


def _pairs(code: str, conn: dict[str, Any], variant: str, keys: int, threads: int,
           start: float, seconds: float, out: Any) -> None:
    """One contender process: ``threads`` threads of uncontended pairs on random keys."""
    sys.path.insert(0, code)
    import redis

    client = redis.Redis(**conn)
    make: Any
    if variant == FLOOR:
        sha = client.script_load("return 1")

        def make(name: str) -> Any:
            def pair() -> None:
                client.evalsha(sha, 1, name)
                client.evalsha(sha, 1, name)
            return pair
    elif variant == REDIS_PY:
        def make(name: str) -> Any:
            lock = client.lock(name, timeout=30)

            def pair() -> None:
                lock.acquire()
                lock.release()
            return pair
    else:
        import django_rlock.engine.lock as engine_lock

        assert engine_lock.__file__.startswith(code), engine_lock.__file__

        def make(name: str) -> Any:
            lock = engine_lock.RLock(client, name, prefix="k:")

            def pair() -> None:
                lock.lock()
                lock.unlock()
            return pair
    pairs = [make(f"k:{i}") for i in range(keys)]
    counts = [0] * threads

    def run(n: int) -> None:
        rnd = random.Random(n)
        for _ in range(200):  # warm-up: scripts loaded, connections made
            pairs[rnd.randrange(keys)]()
        while time.time() < start:
            time.sleep(0.001)
        end = start + seconds
        c = 0
        while time.time() < end:
            for _ in range(20):
                pairs[rnd.randrange(keys)]()
            c += 20
        counts[n] = c

    ts = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(sum(counts))


def _server_stats(client: Any) -> tuple[float, dict[str, dict[str, float]]]:
    cpu = client.info("cpu")
    stats = {k.removeprefix("cmdstat_"): v for k, v in client.info("commandstats").items()}
    return cpu["used_cpu_sys"] + cpu["used_cpu_user"], stats


def many_keys(server: Any, conn: dict[str, Any], variants: dict[str, str], procs: int,
              threads: int, keys: int, seconds: float, rounds: int) -> dict[str, list[dict[str, float]]]:
    """Per variant, per round: server CPU us, commands, script usec per pair."""
    ctx = mp.get_context("spawn")
    admin = server.client()
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    order = list(variants)
    for rnd in range(rounds):
        for variant in order[rnd % len(order):] + order[:rnd % len(order)]:
            admin.flushall()
            q = ctx.Queue()
            start = time.time() + 4.0  # spawn, imports, warm-up
            ps = [ctx.Process(target=_pairs, args=(variants[variant], conn, variant, keys,
                                                    threads, start, seconds, q))
                  for _ in range(procs)]
            for p in ps:
                p.start()
            while time.time() < start - 0.3:
                time.sleep(0.05)
            while time.time() < start - 0.05:
                time.sleep(0.005)
            admin.config_resetstat()
            cpu0, _ = _server_stats(admin)
            total = sum(q.get(timeout=seconds + 120) for _ in ps)
            cpu1, stats = _server_stats(admin)
            for p in ps:
                p.join(30)
            cmds = {k: v for k, v in stats.items() if k.split("|")[0] not in OWN}
            results[variant].append({
                "pairs": total,
                "cpu_us": (cpu1 - cpu0) * 1e6 / total,
                "cmds": sum(v["calls"] for k, v in cmds.items() if k not in SCRIPT_CMDS) / total,
                "script_us": sum(cmds.get(k, {}).get("usec", 0) for k in SCRIPT_CMDS) / total,
                "inner": {k: v["calls"] / total for k, v in cmds.items() if k not in SCRIPT_CMDS},
            })
            print(f"  {variant}: {results[variant][-1]['cpu_us']:.1f} us CPU/pair, "
                  f"{total} pairs", file=sys.stderr, flush=True)
    return results


def _hold(code: str, conn: dict[str, Any], variant: str, n: int, out: Any, go: Any) -> None:
    sys.path.insert(0, code)
    import redis

    client = redis.Redis(**conn)
    # A pair first, so the scripts are loaded (and cached by the server) before the parent
    # reads used_memory: N locks' figure is theirs alone.
    if variant == REDIS_PY:
        lock = client.lock("h:warm", timeout=600)
        lock.acquire()
        lock.release()
    else:
        import django_rlock.engine.lock as engine_lock

        warm = engine_lock.RLock(client, "warm", prefix="h:")
        warm.lock(lease_time=600)
        warm.unlock()
    out.put("ready")
    go.wait(120)
    if variant == REDIS_PY:
        for i in range(n):
            assert client.lock(f"h:{i}", timeout=600).acquire(blocking=False)
    else:
        assert engine_lock.__file__.startswith(code), engine_lock.__file__
        for i in range(n):
            assert engine_lock.RLock(client, f"{i}", prefix="h:").try_lock(0, lease_time=600)
    one = client.memory_usage("h:1") or 0
    out.put(one)


def many_held(server: Any, conn: dict[str, Any], variants: dict[str, str],
              sizes: list[int]) -> dict[tuple[str, int], tuple[float, int]]:
    """(variant, N) -> (used_memory delta per lock, MEMORY USAGE of one lock key)."""
    ctx = mp.get_context("spawn")
    admin = server.client()
    out: dict[tuple[str, int], tuple[float, int]] = {}
    for n in sizes:
        for variant, code in variants.items():
            if variant == FLOOR:
                continue
            admin.flushall()
            q = ctx.Queue()
            go = ctx.Event()
            p = ctx.Process(target=_hold, args=(code, conn, variant, n, q, go))
            p.start()
            assert q.get(timeout=120) == "ready"
            time.sleep(0.2)
            before = admin.info("memory")["used_memory"]
            go.set()
            one = q.get(timeout=600)
            p.join(60)  # its connection closed: client buffers are not counted
            time.sleep(0.2)
            after = admin.info("memory")["used_memory"]
            out[(variant, n)] = ((after - before) / n, one)
            print(f"  {variant} x {n}: {(after - before) / n:.0f} B/lock", file=sys.stderr,
                  flush=True)
    admin.flushall()
    return out


def render(title: str, res: dict[str, list[dict[str, float]]], md: bool) -> str:
    from bench.stats import median

    floor = median([r["cpu_us"] for r in res.get(FLOOR, [])]) if FLOOR in res else float("nan")
    head = ["variant", "pairs/s", "server CPU us/pair", "x floor", "server cmds/pair",
            "script usec/pair", "inner commands per pair"]
    rows = []
    for v, rs in res.items():
        cpu = median([r["cpu_us"] for r in rs])
        inner = rs[-1]["inner"]
        rows.append([v, f"{median([r['pairs'] for r in rs]) / ARGS_SECONDS:,.0f}", f"{cpu:.1f}",
                     f"{cpu / floor:.2f}", f"{median([r['cmds'] for r in rs]):.2f}",
                     f"{median([r['script_us'] for r in rs]):.1f}",
                     " ".join(f"{k}:{c:.2f}" for k, c in sorted(inner.items()) if c >= 0.01)])
    return _table(title, head, rows, md)


def render_mem(mem: dict[tuple[str, int], tuple[float, int]], md: bool) -> str:
    sizes = sorted({n for _, n in mem})
    variants = list(dict.fromkeys(v for v, _ in mem))
    head = ["variant", *(f"B/lock at {n:,}" for n in sizes), "MEMORY USAGE of one lock key"]
    rows = [[v, *(f"{mem[(v, n)][0]:.0f}" for n in sizes), str(mem[(v, sizes[-1])][1])]
            for v in variants]
    return _table("many held locks (lease mode): used_memory delta / N", head, rows, md)


def _table(title: str, head: list[str], rows: list[list[str]], md: bool) -> str:
    if md:
        lines = [f"**{title}**", "", "| " + " | ".join(head) + " |",
                 "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


ARGS_SECONDS = 1.0


def main(argv: list[str] | None = None) -> int:
    global ARGS_SECONDS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--held", default="1000,10000,100000")
    ap.add_argument("--transport", choices=["unix", "tcp", "both"], default="both")
    ap.add_argument("--baseline", metavar="REF", help="also run RLock as it is at git revision REF")
    ap.add_argument("--markdown", metavar="FILE", help="add the tables to FILE's Notes")
    ap.add_argument("--held-only", action="store_true",
                    help="only the many held locks (memory), not the many keys")
    args = ap.parse_args(argv)
    ARGS_SECONDS = args.seconds
    # Imported here, not at the top: spawned processes import this module, and the baseline's
    # must import django_rlock from its own tree.
    from django_rlock.testing import RedisServer, free_port

    command = shlex.join(["python", "bench/manykeys.py",
                          *(argv if argv is not None else sys.argv[1:])])
    variants = {FLOOR: str(ROOT), REDIS_PY: str(ROOT), RLOCK: str(ROOT)}
    if args.baseline:
        variants[BASE] = extract(args.baseline)
    tables = []
    with RedisServer(port=free_port()) as server:
        version = server.client().info("server")["redis_version"]
        transports = ["unix", "tcp"] if args.transport == "both" else [args.transport]
        if args.held_only:
            transports = []
        for transport in transports:
            conn: dict[str, Any] = ({"unix_socket_path": server.socket} if transport == "unix"
                                    else {"host": "127.0.0.1", "port": server.port})
            print(f"[{transport}] many keys", file=sys.stderr, flush=True)
            res = many_keys(server, conn, variants, args.procs, args.threads, args.keys,
                            args.seconds, args.rounds)
            tables.append((f"{transport}: {args.procs} processes x {args.threads} threads, "
                           f"random keys out of {args.keys:,}", res))
        sizes = [int(x) for x in args.held.split(",") if x]
        mem = many_held(server, {"unix_socket_path": server.socket}, variants, sizes) if sizes else {}
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip() or "?"
    head = (f"redis-server {version}, Python {platform.python_version()}, django-rlock git {rev}"
            + (f", baseline = git {args.baseline}" if args.baseline else "")
            + f"; {args.rounds} rounds x {args.seconds:g} s per variant (medians of rounds).")
    text = [head, ""] + [render(t, r, False) + "\n" for t, r in tables]
    if mem:
        text.append(render_mem(mem, False))
    print("\n".join(text))
    if args.markdown:
        from bench.decorator import write_section

        section = ["", "### Server work per lock (bench/manykeys.py, issue #22)", "", "```",
                   command, "```", "", head, ""]
        section += [render(t, r, True) + "\n" for t, r in tables]
        if mem:
            section.append(render_mem(mem, True) + "\n")
        write_section(Path(args.markdown), "\n".join(section))
        print(f"\nwrote a section into {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
