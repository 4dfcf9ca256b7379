"""Run by the MultiLock tests: `python -m tests.engine._multi_proc KIND ITERATIONS SOCKET...`.

Increments a counter on the first server with GET, sleep, SET (racy without exclusion) under a
MultiLock or RedLock over all the servers given.
"""

from __future__ import annotations

import sys
import time

import redis

from django_rlock import RLock
from django_rlock.engine.multi import MultiLock, RedLock


def main(kind: str, iterations: str, *sockets: str) -> None:
    clients = [redis.Redis(unix_socket_path=s) for s in sockets]
    cls = {"multi": MultiLock, "red": RedLock}[kind]
    lock = cls(*(RLock(c, "multi:counter") for c in clients))
    counter = clients[0]
    for _ in range(int(iterations)):
        with lock:
            value = int(counter.get("counter") or 0)
            time.sleep(0.001)
            counter.set("counter", value + 1)
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
