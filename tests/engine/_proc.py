"""Run as a subprocess by the tests: `python -m tests.engine._proc MODE SOCKET ...`."""

from __future__ import annotations

import sys
import threading
import time

import redis

from django_rlock import RLock


def hold(sock: str, name: str, watchdog_timeout: str) -> None:
    """Take the lock in watchdog mode, say so, and hold it until killed."""
    lock = RLock(redis.Redis(unix_socket_path=sock), name, watchdog_timeout=float(watchdog_timeout))
    lock.lock()
    print("locked", flush=True)
    while True:
        time.sleep(1)


def count(sock: str, name: str, threads: str, iterations: str) -> None:
    """Threads incrementing a Redis counter with GET then SET under the lock: racy without it."""
    client = redis.Redis(unix_socket_path=sock)
    lock = RLock(client, name)

    def work() -> None:
        for _ in range(int(iterations)):
            with lock:
                value = int(client.get("counter") or 0)
                time.sleep(0.0005)
                client.set("counter", value + 1)

    workers = [threading.Thread(target=work) for _ in range(int(threads))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    print("done", flush=True)


if __name__ == "__main__":
    {"hold": hold, "count": count}[sys.argv[1]](*sys.argv[2:])
