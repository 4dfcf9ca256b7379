"""Run by tests/engine/test_windows.py: `python -m tests.engine._windows_proc SOCKET NAME
[MAX_HOLD]`.

Says "ready", waits for a line on stdin, then blocks in ``lock()`` on NAME and prints the
monotonic time (system-wide on Linux) at which it got the lock, and, 0.3 s later, whether
its hold is lost.
"""

from __future__ import annotations

import sys
import time

import redis

from django_rlock import RLock

if __name__ == "__main__":
    max_hold = float(sys.argv[3]) if len(sys.argv) > 3 else None
    lock = RLock(redis.Redis(unix_socket_path=sys.argv[1]), sys.argv[2], watchdog_timeout=3.0,
                 max_hold=max_hold)
    print("ready", flush=True)
    sys.stdin.readline()
    lock.lock()
    got = time.monotonic()
    time.sleep(0.3)
    print(f"got {got} {lock.is_lost()}", flush=True)
    lock.unlock()
