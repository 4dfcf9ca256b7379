"""Run by tests/load/test_ratelimit_load.py.

``python -m tests.load._rate_proc SOCKET NAME THREADS START END``: THREADS threads wait until
the server's clock reads START (seconds since the epoch), then call
``RateLimiter(NAME).acquire()`` (blocking) until a grant's server time is past END; prints
the JSON list of grant times that fell before END (each grant's reply carries its time).
"""

from __future__ import annotations

import json
import sys
import threading
import time

import redis

from django_rlock.engine.ratelimit import RateLimiter


def main() -> None:
    sock, name, threads, start, end = sys.argv[1:6]
    client = redis.Redis(unix_socket_path=sock, max_connections=int(threads) + 8)
    s, us = client.time()
    offset = s + us / 1e6 - time.time()  # server clock - ours
    t_start, t_end = float(start), float(end)
    out: list[float] = []
    lock = threading.Lock()
    limiter = RateLimiter(client, name)

    def work() -> None:
        mine: list[float] = []
        time.sleep(max(0.0, t_start - (time.time() + offset)))
        while True:
            at = limiter.acquire()
            if at >= t_end:
                break
            mine.append(at)
        with lock:
            out.extend(mine)

    pool = [threading.Thread(target=work) for _ in range(int(threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
