"""What a FairLock's contended wait costs the server (invariant 50: turns of our waiters).

    python bench/fair_turns.py [--code PATH] [--waiters 1,2,4]

On a private redis-server: a holder takes the lock, N waiters queue behind it one after the
other (threads of this process, then one process each), the holder releases after 0.2 s and
they drain the line (each holds 50 ms). Printed per layout and N: the scripts the clients ran
(EVALSHA + EVAL) and the commands run inside them (``INFO commandstats``, the clients' own
commands left out), the median of 3 runs. ``--code PATH`` imports ``django_rlock`` from another
checkout: run it once per checkout for a before/after comparison.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The clients' own commands (the bench's and the engine's round trips), not script-inner.
OWN = {"evalsha", "eval", "info", "wait", "config", "hello", "ping", "client", "script",
       "rpush", "blpop", "llen", "subscribe", "unsubscribe"}
CHILD = """
import sys, time, redis
sys.path.insert(0, {code!r})
from django_rlock.engine.fair import FairLock
c = redis.Redis(unix_socket_path={sock!r})
lock = FairLock(c, "bench-fair")
lock.lock(); lock.unlock()
c.rpush("bench-ready", 1)
c.blpop(["bench-go"], 60)
lock.lock(); time.sleep(0.05); lock.unlock()
"""


def counts(r) -> tuple[int, int]:
    c = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
    inner = sum(v for k, v in c.items() if k.split("|")[0] not in OWN)
    return c.get("evalsha", 0) + c.get("eval", 0), inner


def threads_run(r, lock, n: int) -> tuple[int, int]:
    lock.lock()
    r.config_resetstat()
    ts = []
    for i in range(n):
        t = threading.Thread(target=lambda: (lock.lock(), time.sleep(0.05), lock.unlock()))
        t.start()
        ts.append(t)
        while r.llen(lock.queue_key) < i + 1:
            time.sleep(0.005)
    time.sleep(0.2)
    lock.unlock()
    for t in ts:
        t.join()
    return counts(r)


def processes_run(r, lock, n: int, code: str, sock: str) -> tuple[int, int]:
    ps = [subprocess.Popen([sys.executable, "-c", CHILD.format(code=code, sock=sock)])
          for _ in range(n)]
    while r.llen("bench-ready") < n:
        time.sleep(0.01)
    r.delete("bench-ready")
    lock.lock()
    r.config_resetstat()
    for i in range(n):
        r.rpush("bench-go", 1)
        while r.llen(lock.queue_key) < i + 1:
            time.sleep(0.005)
    time.sleep(0.2)
    lock.unlock()
    for p in ps:
        p.wait(60)
    return counts(r)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", help="import django_rlock from this checkout")
    ap.add_argument("--waiters", default="1,2,4")
    args = ap.parse_args()
    code = str(Path(args.code).resolve()) if args.code else str(ROOT)
    sys.path.insert(0, code)
    sys.path.insert(1, str(ROOT))
    from bench.server import RedisServer
    from django_rlock.engine.fair import FairLock

    with RedisServer() as server:
        r = server.client()
        lock = FairLock(r, "bench-fair")
        lock.lock()
        lock.unlock()
        print(f"code: {code}")
        for layout in ("threads", "processes"):
            for n in (int(x) for x in args.waiters.split(",")):
                runs = [threads_run(r, lock, n) if layout == "threads"
                        else processes_run(r, lock, n, code, server.socket_path)
                        for _ in range(3)]
                print(f"{layout:9} N={n}: scripts {statistics.median(s for s, _ in runs):g}, "
                      f"inner commands {statistics.median(i for _, i in runs):g}")


if __name__ == "__main__":
    main()
