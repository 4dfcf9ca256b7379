"""Run by tests/engine/test_windows.py: `python -m tests.engine._windows_proc SOCKET NAME`.

Says "ready", waits for a line on stdin, then blocks in ``lock()`` on NAME and prints the
monotonic time (system-wide on Linux) at which it got the lock.
"""

from __future__ import annotations

import sys
import time

import redis

from django_rlock import RLock

if __name__ == "__main__":
    lock = RLock(redis.Redis(unix_socket_path=sys.argv[1]), sys.argv[2], watchdog_timeout=3.0)
    print("ready", flush=True)
    sys.stdin.readline()
    lock.lock()
    print(f"got {time.monotonic()}", flush=True)
    lock.unlock()
