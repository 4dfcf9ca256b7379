"""Run by tests/engine/test_semaphore.py, test_permits.py and test_latch.py.

``python -m tests.engine._sem_proc MODE SOCKET NAME ...``:

- ``sem NAME THREADS ROUNDS``: each thread takes permits of ``Semaphore(NAME)`` ROUNDS times
  (1 or 2 at a time, through ``with``, ``acquire`` and ``try_acquire``) and, while holding
  them, adds them to the Redis counter ``in`` and records its peak in ``peak``. Prints the
  JSON number of rounds done.
- ``permits NAME THREADS ROUNDS``: the same with ``PermitExpirableSemaphore`` (one permit,
  no lease: watchdog mode).
- ``hold NAME WATCHDOG``: takes a permit of ``PermitExpirableSemaphore(NAME)`` with no lease,
  prints its id and sleeps until killed.
- ``latch NAME WAITERS TIMEOUT``: WAITERS threads ``wait(TIMEOUT)`` on ``CountDownLatch(NAME)``;
  prints the JSON list of [result, wall time it returned].
"""

from __future__ import annotations

import json
import sys
import threading
import time

import redis

from django_rlock.engine.latch import CountDownLatch
from django_rlock.engine.semaphore import PermitExpirableSemaphore, Semaphore

# KEYS[1] in, KEYS[2] peak; ARGV[1] permits entering.
ENTER = """
local v = redis.call('incrby', KEYS[1], ARGV[1])
if v > tonumber(redis.call('get', KEYS[2]) or 0) then redis.call('set', KEYS[2], v) end
return v
"""


def _run_threads(n: int, work: object) -> None:
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        work(i)  # type: ignore[operator]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def sem(client: redis.Redis, name: str, threads: str, rounds: str) -> None:
    s = Semaphore(client, name)
    done = []

    def inside(n: int) -> None:
        client.eval(ENTER, 2, "in", "peak", n)
        time.sleep(0.002)
        client.decrby("in", n)

    def work(i: int) -> None:
        for j in range(int(rounds)):
            if i % 3 == 0:
                with s:
                    inside(1)
            elif i % 3 == 1:
                s.acquire(2)
                try:
                    inside(2)
                finally:
                    s.release(2)
            else:
                while not s.try_acquire(1, wait_time=0.05 * (j % 3)):
                    pass
                try:
                    inside(1)
                finally:
                    s.release()
            done.append(1)

    _run_threads(int(threads), work)
    print(json.dumps(len(done)), flush=True)


def permits(client: redis.Redis, name: str, threads: str, rounds: str) -> None:
    s = PermitExpirableSemaphore(client, name)
    done = []

    def work(i: int) -> None:
        for _ in range(int(rounds)):
            pid = s.acquire()
            try:
                client.eval(ENTER, 2, "in", "peak", 1)
                time.sleep(0.002)
                client.decr("in")
            finally:
                s.release(pid)
            done.append(1)

    _run_threads(int(threads), work)
    print(json.dumps(len(done)), flush=True)


def hold(client: redis.Redis, name: str, wd: str) -> None:
    s = PermitExpirableSemaphore(client, name, watchdog_timeout=float(wd))
    print(s.acquire(), flush=True)
    while True:
        time.sleep(60)


def latch(client: redis.Redis, name: str, waiters: str, timeout: str) -> None:
    lt = CountDownLatch(client, name)
    out: list[list[object]] = []

    def work(i: int) -> None:
        got = lt.wait(float(timeout))
        out.append([got, time.time()])

    _run_threads(int(waiters), work)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    mode, sock, *rest = sys.argv[1:]
    {"sem": sem, "permits": permits, "hold": hold, "latch": latch}[mode](
        redis.Redis(unix_socket_path=sock), *rest)
