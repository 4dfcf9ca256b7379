"""Run by tests/load/test_ratelimit_load.py and bench/ratelimit.py.

``python -m tests.load._rate_proc SOCKET NAME THREADS START END [fixed RATE]``: THREADS
threads wait until the server's clock reads START (seconds since the epoch), then call
``RateLimiter(NAME).acquire()`` (blocking) until a grant's server time is past END; prints
the JSON list of grant times that fell before END. With ``fixed RATE``: a fixed-window
``INCR`` + ``EXPIRE`` counter instead (one window per server-time second, at most RATE per
window; a refused caller sleeps until the next second), each grant's time from ``TIME``
in the same round trip.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import redis

from django_rlock.engine.ratelimit import RateLimiter

# KEYS[1] the window's counter; ARGV[1] the rate. Reply: {granted, server s, server us}.
FIXED = """
local t = redis.call('time')
local key = KEYS[1] .. ':' .. t[1]
local n = redis.call('incr', key)
if n == 1 then redis.call('expire', key, 2) end
return {n <= tonumber(ARGV[1]) and 1 or 0, t[1], t[2]}
"""


def main() -> None:
    sock, name, threads, start, end = sys.argv[1:6]
    fixed = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[6] == "fixed" else 0
    client = redis.Redis(unix_socket_path=sock, max_connections=int(threads) + 8)
    s, us = client.time()
    offset = s + us / 1e6 - time.time()  # server clock - ours
    t_start, t_end = float(start), float(end)
    out: list[float] = []
    lock = threading.Lock()
    limiter = RateLimiter(client, name)
    script = client.register_script(FIXED)

    def work() -> None:
        mine: list[float] = []
        time.sleep(max(0.0, t_start - (time.time() + offset)))
        while True:
            if fixed:
                ok, s, us = script(keys=[name], args=[fixed])
                at = int(s) + int(us) / 1e6
                if not ok:
                    time.sleep(max(0.0, int(s) + 1 - at))
                    continue
            else:
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
