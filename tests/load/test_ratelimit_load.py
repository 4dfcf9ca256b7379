"""The rate limiter under load (issue #21): 8 processes x 4 threads draw from a 100/s limiter
for 20 s with blocking ``acquire()``.

- In every sliding 1 s window of server-side grant times (each grant's reply carries the
  server's time), at most 100 grants: ``t[i + 100] - t[i] > 1`` for the sorted times.
- At least 95% of the limit used: >= 1,900 grants in the 20 s.
- A bounded number of commands per grant (INFO commandstats): the blocking callers wait in
  line, so about two attempts a grant, whatever the number of callers.

It lives here, not in tests/engine, so CI runs it once (``make test``) and not again on Redis
6.2 and Valkey: it takes ~25 s and says nothing about the server's version.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from django_rlock.engine.ratelimit import RateLimiter

ROOT = Path(__file__).parents[2]
PROCESSES, THREADS, RATE, SECONDS = 8, 4, 100, 20.0
#: What the limiter's scripts run (commandstats counts them too): not sent by a client.
IN_SCRIPTS = {"hmget", "get", "set", "zrangebyscore", "zremrangebyscore", "zrange", "zadd",
              "zrem", "zscore", "pexpire", "pttl", "hget", "hexists", "hset", "hsetnx", "del",
              "publish", "persist", "incrby", "exists", "time",
              "hdel", "hlen", "hgetall"}  # the last three: waiter records (invariant 41)


def test_eight_processes_draw_from_one_100_per_second_budget(redis_server, r):
    RateLimiter(r, "load").set_rate(RATE, 1.0)
    r.config_resetstat()
    s, us = r.time()
    start = s + us / 1e6 + 3.0  # time for the processes to start
    end = start + SECONDS
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.load._rate_proc", redis_server.socket, "load",
         str(THREADS), repr(start), repr(end)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(PROCESSES)]
    times: list[float] = []
    for p in procs:
        out, _ = p.communicate(timeout=SECONDS + 60)
        assert p.returncode == 0
        times.extend(json.loads(out))
    stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
    times.sort()
    assert times[0] >= start
    worst = min(times[i + RATE] - times[i] for i in range(len(times) - RATE))
    assert worst > 1.0, f"{RATE + 1} grants within {worst:.6f} s"
    assert len(times) >= 0.95 * RATE * SECONDS, len(times)
    # Every grant and refusal is one EVALSHA; the processes' other commands (HELLO, SUBSCRIBE,
    # TIME, ...) are a handful each. (commandstats also counts the commands the scripts run.)
    sent = stats.get("evalsha", 0) + stats.get("eval", 0) + sum(
        n for k, n in stats.items() if k not in IN_SCRIPTS and k not in ("evalsha", "eval"))
    grants = len(times) + PROCESSES * THREADS  # each thread's last grant fell past the end
    assert stats["evalsha"] / grants < 3.0, (stats, grants)
    assert sent / grants < 3.2, (stats, grants)
    print(f"\n{len(times)} grants in {SECONDS:g} s, worst 1 s window {worst:.6f} s for "
          f"{RATE + 1}, {stats['evalsha'] / grants:.2f} EVALSHA and {sent / grants:.2f} commands "
          f"a grant")
