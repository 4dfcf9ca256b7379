"""Run by the failover test: ``python -m tests.failover._proc ROLE CONFIG_JSON``.

Both roles reach Redis through redis-py's Sentinel client only, and write what they did to the
*counter* server, an independent redis-server outside the failover, so the record survives it.
Per lock ``<name>``: ``fence:<name>`` is the fencing counter (INCR on entry: the token),
``inside:<name>`` counts waiters inside the critical section (must read 1 on entry), and
``records:<name>`` is a list of JSON records. Times are ``time.monotonic()``: one clock for
every process on the machine, so the parent can order intervals across processes.

holder: takes every lock of ``locks`` ({name: watchdog_timeout}) in watchdog mode, prints
    ``ready`` and holds them until a line arrives on stdin (an ``on_lost`` call is also
    pushed to the counter's list ``told``), watching ``is_lost()`` meanwhile
    (when it first turned true: the hold in doubt; whether it turned false again); then, per
    lock, records whether it was told the lock was lost (``on_lost``, a WARNING) and what
    ``unlock()`` said.
waiter: one thread per lock, ``try_lock`` in a loop with a budget until the key ``stop``
    exists, each critical section recorded; prints the errors it met (by type) as JSON at exit.
"""

from __future__ import annotations

import json
import logging
import select
import sys
import threading
import time
from collections import Counter
from typing import Any

import redis
from redis.sentinel import Sentinel

from django_rlock import LockError, LockNotOwnedError, RLock


def _clients(cfg: dict[str, Any]) -> tuple[redis.Redis, redis.Redis]:
    sentinel = Sentinel([tuple(a) for a in cfg["sentinels"]], socket_timeout=2)
    client = sentinel.master_for(cfg["service"], socket_timeout=2)
    return client, redis.Redis(unix_socket_path=cfg["counter"])


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def holder(cfg: dict[str, Any]) -> None:
    client, counter = _clients(cfg)
    warnings = _Warnings()
    logging.getLogger("django_rlock").addHandler(warnings)
    held: list[tuple[str, RLock, int, float, list[float]]] = []
    for name, wt in cfg["locks"].items():
        told: list[float] = []

        def on_lost(lost_name: str, told: list[float] = told) -> None:
            told.append(time.monotonic())
            counter.rpush("told", lost_name)  # the parent waits for this or a renewal

        lock = RLock(client, name, watchdog_timeout=wt, on_lost=on_lost)
        lock.lock()
        token = counter.incr(f"fence:{name}")
        held.append((name, lock, token, time.monotonic(), told))
    print("ready", flush=True)
    doubt: dict[str, float] = {}
    cleared: set[str] = set()
    while not select.select([sys.stdin], [], [], 0.005)[0]:  # polled on the owner thread
        now = time.monotonic()
        for name, lock, *_ in held:
            if lock.is_lost():
                doubt.setdefault(name, now)
            elif name in doubt:
                cleared.add(name)
    sys.stdin.readline()
    for name, lock, token, start, told in held:
        lost = lock.is_lost()
        end = time.monotonic()
        try:
            lock.unlock()
            unlock = "ok"
        except LockNotOwnedError:
            unlock = "LockNotOwnedError"
        except Exception as exc:  # recorded for the parent to report, not hidden
            unlock = f"{type(exc).__name__}: {exc}"
        counter.rpush(f"records:{name}", json.dumps({
            "who": "holder", "token": token, "start": start, "end": end, "lost": lost,
            "doubt_at": doubt.get(name), "cleared": name in cleared,
            "told_at": told[0] if told else None, "unlock": unlock,
            "warned": any("was lost" in m and repr(name) in m for m in warnings.messages)}))
    print("done", flush=True)


def waiter(cfg: dict[str, Any]) -> None:
    client, counter = _clients(cfg)
    errors: Counter[str] = Counter()
    tag = cfg["tag"]

    def run(name: str) -> None:
        lock = RLock(client, name, watchdog_timeout=cfg["waiter_watchdog"])
        while not counter.exists("stop"):
            try:
                got = lock.try_lock(wait_time=cfg["budget"])
            except (LockError, redis.RedisError) as exc:  # the failover window; tried again
                errors[f"{name}: {type(exc).__name__}"] += 1
                time.sleep(0.05)
                continue
            if not got:
                continue
            inside = counter.incr(f"inside:{name}")
            token = counter.incr(f"fence:{name}")
            start = time.monotonic()
            time.sleep(cfg["hold"])
            end = time.monotonic()
            counter.decr(f"inside:{name}")
            master = client.connection_pool.master_address
            try:
                lock.unlock()
                unlock = "ok"
            except Exception as exc:
                unlock = f"{type(exc).__name__}: {exc}"
            counter.rpush(f"records:{name}", json.dumps({
                "who": tag, "token": token, "start": start, "end": end, "inside": inside,
                "port": master[1] if master else None, "unlock": unlock}))

    threads = [threading.Thread(target=run, args=(name,), name=f"waiter-{name}")
               for name in cfg["locks"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(dict(errors)), flush=True)


if __name__ == "__main__":
    {"holder": holder, "waiter": waiter}[sys.argv[1]](json.loads(sys.argv[2]))
