"""The rate limiter at its limit, beside a fixed-window ``INCR`` + ``EXPIRE`` counter (#21).

    python bench/ratelimit.py [--processes 8] [--threads 4] [--rate 100] [--seconds 10]
                              [--markdown docs/benchmarks.md]

One private redis-server (unix socket); PROCESSES x THREADS callers draw from one budget of
RATE per second for SECONDS, first from a ``RateLimiter`` (blocking ``acquire()``: each
caller sleeps until the server says its permit frees), then, in the same run, from the counter
most projects hand-roll: ``INCR rl:<second>`` + ``EXPIRE`` in one pipeline with ``TIME``
(the window is the server's current second; a refused caller sleeps to the next one). Each
grant's server time comes with its reply (the limiter's reply carries it; the counter's
pipeline reads ``TIME``). Reported per variant:

- grants per second over the run, and as a share of the limit;
- the worst sliding 1 s window of grant times: the most grants any 1 s interval holds
  (the limit is RATE), and the overshoot beyond it;
- commands per grant the callers sent (INFO commandstats, the commands that scripts run left
  out), and round trips per grant.

``--markdown FILE`` adds the table as a section at the end of FILE's Notes (``bench/run.py``
keeps it when it regenerates the page).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

import redis  # noqa: E402

from django_rlock.engine.ratelimit import RateLimiter  # noqa: E402
from django_rlock.testing import RedisServer  # noqa: E402

#: What the limiter's scripts run (commandstats counts those too): not sent by a caller.
IN_SCRIPTS = {"hmget", "get", "set", "zrangebyscore", "zremrangebyscore", "zrange", "zadd",
              "zrem", "zscore", "pexpire", "pttl", "hget", "hexists", "hset", "hsetnx", "del",
              "publish", "persist", "incrby", "exists", "time"}


# -- the callers (``--worker``: one process of them) ------------------------------------------
def worker(sock: str, variant: str, name: str, threads: int, rate: int, start: float,
           end: float) -> None:
    client = redis.Redis(unix_socket_path=sock, max_connections=threads + 8)
    s, us = client.time()
    offset = s + us / 1e6 - time.time()  # the server's clock minus ours
    limiter = RateLimiter(client, name)
    out: list[float] = []
    trips = [0]
    lock = threading.Lock()

    def fixed_window() -> float:
        while True:
            pipe = client.pipeline(transaction=False)
            pipe.time()
            pipe.incr(f"{name}:{int(time.time() + offset)}")
            pipe.expire(f"{name}:{int(time.time() + offset)}", 2)
            (s, us), n, _ = pipe.execute()
            with lock:
                trips[0] += 1
            at = int(s) + int(us) / 1e6
            if n <= rate:
                return at
            time.sleep(max(0.0, int(s) + 1 - at))

    def work() -> None:
        mine: list[float] = []
        time.sleep(max(0.0, start - (time.time() + offset)))
        while True:
            at = limiter.acquire() if variant == "limiter" else fixed_window()
            if at >= end:
                break
            mine.append(at)
        with lock:
            out.extend(mine)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(json.dumps({"times": out, "trips": trips[0]}))


# -- the run ----------------------------------------------------------------------------------
def worst_window(times: list[float]) -> int:
    """The most grants any 1 s interval (closed) holds."""
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - 1.0:
            j += 1
        best = max(best, i - j + 1)
    return best


def run(server: RedisServer, variant: str, processes: int, threads: int, rate: int,
        seconds: float) -> dict[str, float]:
    c = server.client()
    name = f"bench:{variant}"
    if variant == "limiter":
        RateLimiter(c, name).set_rate(rate, 1.0)
    c.config_resetstat()
    s, us = c.time()
    start = s + us / 1e6 + 2.0
    end = start + seconds
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", server.socket, variant, name, str(threads),
         str(rate), repr(start), repr(end)], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)]
    times: list[float] = []
    trips = 0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        got = json.loads(out)
        times.extend(got["times"])
        trips += got["trips"]
    stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in c.info("commandstats").items()}
    c.close()
    times.sort()
    granted = len(times) + processes * threads  # each caller's last grant fell past the end
    scripts = stats.get("evalsha", 0) + stats.get("eval", 0)
    skip = IN_SCRIPTS if variant == "limiter" else set()
    sent = scripts + sum(n for k, n in stats.items()
                         if k not in skip and k not in ("evalsha", "eval", "info",
                                                        "config|resetstat"))
    worst = worst_window(times)
    return {"grants": len(times), "per_s": len(times) / seconds,
            "used": len(times) / (rate * seconds), "worst": worst,
            "overshoot": max(0, worst - rate) / rate,
            "commands": sent / granted,
            "trips": (scripts if variant == "limiter" else trips) / granted}


LABELS = {"limiter": "RateLimiter.acquire()", "fixed": "fixed window (INCR + EXPIRE)"}


def render(rows: list[tuple[str, dict[str, float]]], rate: int, markdown: bool) -> str:
    head = ["caller", "grants/s", "of the limit", f"worst 1 s window (limit {rate})",
            "overshoot", "commands/grant", "round trips/grant"]
    body = [[LABELS[v], f"{r['per_s']:.1f}", f"{r['used']:.1%}", f"{r['worst']:.0f}",
             f"{r['overshoot']:.0%}", f"{r['commands']:.2f}", f"{r['trips']:.2f}"]
            for v, r in rows]
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |",
                          "|---|" + "---:|" * (len(head) - 1),
                          *("| " + " | ".join(b) + " |" for b in body)])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(line, widths, strict=True)))
                     for line in [head, *body])


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in and args_in[0] == "--worker":
        sock, variant, name, threads, rate, start, end = args_in[1:8]
        worker(sock, variant, name, int(threads), int(rate), float(start), float(end))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--threads", type=int, default=4, help="per process")
    ap.add_argument("--rate", type=int, default=100, help="per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="per variant")
    ap.add_argument("--markdown", metavar="FILE",
                    help="add the table as a section at the end of FILE's Notes")
    args = ap.parse_args(args_in)
    command = shlex.join(["python", "bench/ratelimit.py", *args_in])
    rows = []
    with RedisServer() as server:
        version = server.client().info("server")["redis_version"]
        for variant in ("limiter", "fixed"):
            print(f"[{variant}] {args.processes} x {args.threads} callers, {args.seconds:g} s ...",
                  file=sys.stderr, flush=True)
            rows.append((variant, run(server, variant, args.processes, args.threads, args.rate,
                                      args.seconds)))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip() or "?"
    head = (f"redis-server {version}, redis-py {redis.__version__}, Python "
            f"{platform.python_version()}, django-rlock git {rev}; {args.processes} processes x "
            f"{args.threads} threads, a budget of {args.rate} per second, {args.seconds:g} s per "
            f"caller kind, one after the other on one server.")
    print(head + "\n")
    print(render(rows, args.rate, markdown=False))
    if args.markdown:
        from bench.decorator import write_section

        section = ["", "### Rate limiter (bench/ratelimit.py, issue #21)", "", "```", command,
                   "```", "", head, "", render(rows, args.rate, markdown=True), ""]
        write_section(Path(args.markdown), "\n".join(section))
        print(f"\nwrote a section into {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
