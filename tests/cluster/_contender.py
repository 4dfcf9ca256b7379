"""A contender process for the cluster tests: ``python -m tests.cluster._contender PORTS NAME
THREADS ROUNDS``. Each thread takes the lock ROUNDS times on a ``RedisCluster`` of its own
process and, inside, bumps a counter non-atomically (GET, then SET) and checks no one else is
inside (INCR/DECR): any overlap shows as a lost update or a second occupant. Prints
``done <acquisitions> <overlaps>``."""

from __future__ import annotations

import sys
import threading

import redis
from redis.cluster import ClusterNode, RedisCluster

from django_rlock import RLock


def main() -> None:
    ports, name, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", int(p)) for p in ports.split(",")],
                      socket_timeout=10)
    counter, inside = f"{name}:counter", f"{name}:inside"
    got = [0] * threads
    overlaps = [0] * threads
    print("ready", flush=True)
    sys.stdin.readline()  # go

    def run(i: int) -> None:
        lock = RLock(rc, name)
        for _ in range(rounds):
            with lock:
                if rc.incr(inside) != 1:
                    overlaps[i] += 1
                v = int(rc.get(counter) or 0)
                rc.set(counter, v + 1)
                rc.decr(inside)
            got[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("done", sum(got), sum(overlaps), flush=True)
    rc.close()


if __name__ == "__main__":
    try:
        main()
    except redis.RedisError as exc:
        print("error", type(exc).__name__, exc, flush=True)
        raise
