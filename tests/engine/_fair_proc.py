"""Run by tests/engine/test_fair.py.

``python -m tests.engine._fair_proc fifo SOCKET NAME PROC THREADS ROUNDS``: THREADS threads,
each named ``<PROC>-<t>``, write their owner to the hash ``owners`` and block on the list
``go:<PROC>-<t>`` until the test lets them join the line (one at a time, so the test knows the
order in which they queued). Each then takes the fair lock ROUNDS times; while holding it, it
appends its name to the list ``order`` and the line it sees behind it (the queue's owners,
JSON) to the list ``lines``; after unlocking it queues again at once.

``python -m tests.engine._fair_proc wait SOCKET NAME THREAD_WAIT_TIME``: writes its owner to
the key ``dead-owner`` and waits for the lock forever (the test SIGKILLs it in the queue, or
SIGSTOPs and resumes it). Once it holds the lock it appends ``dead`` to the list ``order``
and what the lock's hash held then (JSON) to ``dead-saw``, unlocks and exits.

``python -m tests.engine._fair_proc hold SOCKET NAME WATCHDOG_TIMEOUT``: holds the lock until
SIGKILLed (``hold``).
"""

from __future__ import annotations

import json
import sys
import threading

import redis

from django_rlock.engine.fair import FairLock
from django_rlock.engine.identity import thread_owner


def fifo(sock: str, name: str, proc: str, threads: str, rounds: str) -> None:
    client = redis.Redis(unix_socket_path=sock)
    lock = FairLock(client, name)  # one object shared by the threads

    def work(label: str) -> None:
        client.hset("owners", label, thread_owner())
        client.blpop([f"go:{label}"], timeout=120)
        for _ in range(int(rounds)):
            lock.lock()
            try:
                client.rpush("order", label)
                line = [o.decode() for o in client.lrange(lock.queue_key, 0, -1)]
                client.rpush("lines", json.dumps(line))
            finally:
                lock.unlock()

    workers = [threading.Thread(target=work, args=(f"{proc}-{t}",)) for t in range(int(threads))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    print("done", flush=True)


def wait(sock: str, name: str, thread_wait_time: str) -> None:
    client = redis.Redis(unix_socket_path=sock)
    lock = FairLock(client, name, thread_wait_time=float(thread_wait_time))
    client.set("dead-owner", thread_owner())
    lock.lock()  # killed (or stopped) while queued
    client.rpush("order", "dead")
    saw = {k.decode(): v.decode() for k, v in client.hgetall(lock.key).items()}
    client.rpush("dead-saw", json.dumps(saw))
    lock.unlock()
    print("acquired", flush=True)


def hold(sock: str, name: str, watchdog_timeout: str) -> None:
    """Takes the lock (watchdog mode), sets ``holder-up`` and holds it until SIGKILLed: the
    lock then expires with nobody releasing it."""
    client = redis.Redis(unix_socket_path=sock)
    lock = FairLock(client, name, watchdog_timeout=float(watchdog_timeout))
    lock.lock()
    client.set("holder-up", "1")
    threading.Event().wait()


if __name__ == "__main__":
    {"fifo": fifo, "wait": wait, "hold": hold}[sys.argv[1]](*sys.argv[2:])
