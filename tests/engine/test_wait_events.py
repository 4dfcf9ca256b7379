"""The wait events: ``wait_started`` / ``wait_ended`` around every wait, on the waiting thread
(or task), with its outcome, wait and hand-off; ``refused`` for a one-shot acquire turned away.
They feed the live gauges and the traces (docs/django.md)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis.asyncio

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import events
from django_rlock.engine.semaphore import Semaphore


@pytest.fixture
def seen() -> Iterator[list[tuple[str, dict, int]]]:
    got: list[tuple[str, dict, int]] = []

    def listener(event: str, data: dict) -> None:
        got.append((event, data, threading.get_ident()))

    events.add_listener(listener)
    yield got
    events.remove_listener(listener)


def named(seen, name: str) -> list[tuple[str, dict, int]]:
    return [x for x in seen if x[1]["name"] == name]


def test_a_wait_that_gets_the_lock_by_hand_off(r, seen, holders):
    lock = RLock(r, "we", label="we:{n}")
    h, waiter = holders(), holders()
    h.call(lock.lock)
    threading.Timer(0.2, lambda: h.call(lock.unlock)).start()
    t0 = time.monotonic()
    assert waiter.call(lambda: lock.try_lock(wait_time=5)) is True
    measured = time.monotonic() - t0
    waiter_thread = waiter.call(threading.get_ident)
    mine = [(e, d) for e, d, t in named(seen, "we") if t == waiter_thread]
    kinds = [e for e, _ in mine]
    assert kinds[0] == "wait_started" and kinds[-1] == "wait_ended"
    started, ended = mine[0][1], mine[-1][1]
    assert started["label"] == "we:{n}" and started["kind"] == "RLock"
    assert started["owner"] == ended["owner"] == waiter.call(lock.current_owner)
    assert ended["outcome"] == "acquired" and ended["handed_over"] is True
    assert 0.15 <= ended["wait"] <= measured and ended["client"] is None
    # The grant itself is booked by the releasing thread: one acquired for the waiter, anywhere.
    assert [d["owner"] for e, d, _ in named(seen, "we") if e == "acquired"][-1] == ended["owner"]
    waiter.call(lock.unlock)


def test_a_wait_that_runs_out_and_a_one_shot_refusal(r, seen, holders):
    lock = RLock(r, "we-out")
    h = holders()
    h.call(lock.lock)
    assert lock.try_lock(wait_time=0.2) is False
    assert lock.acquire(blocking=False) is False
    got = [(e, d) for e, d, t in named(seen, "we-out") if t == threading.get_ident()]
    assert [e for e, _ in got] == ["wait_started", "wait_ended", "refused"]
    ended, refused = got[1][1], got[2][1]
    assert ended["outcome"] == "timeout" and ended["handed_over"] is False
    assert 0.2 <= ended["wait"] < 5 and ended["client"] is r
    assert refused["kind"] == "RLock" and 0 <= refused["wait"] < 1 and refused["client"] is r
    h.call(lock.unlock)


def test_an_uncontended_acquire_sends_no_wait_event(r, seen):
    lock = RLock(r, "we-free")
    with lock:
        pass
    assert [e for e, _, _ in named(seen, "we-free")] == ["acquired", "released"]


def test_a_semaphore_wait_is_reported_too(r, seen, holders):
    sem = Semaphore(r, "we-sem")
    sem.try_set_permits(1)
    sem.acquire()
    threading.Timer(0.2, sem.release).start()
    assert sem.try_acquire(wait_time=5) is True
    assert sem.try_acquire() is False
    got = [(e, d) for e, d, _ in named(seen, "we-sem")]
    assert [e for e, _ in got] == ["wait_started", "wait_ended", "refused"]
    assert got[1][1]["outcome"] == "acquired" and got[1][1]["kind"] == "Semaphore"
    assert got[1][1]["wait"] >= 0.15


def test_asyncio_waits_are_reported_on_their_task(redis_server, seen):
    async def main() -> None:
        ar = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ar, "we-async", label="a")
        held = asyncio.Event()

        async def holder() -> None:
            await lock.lock()
            held.set()
            await asyncio.sleep(0.2)
            await lock.unlock()

        task = asyncio.create_task(holder())
        await held.wait()
        assert await lock.try_lock() is False  # one-shot: refused
        assert await lock.try_lock(wait_time=5) is True
        await lock.unlock()
        await task
        await ar.aclose()

    asyncio.run(main())
    got = [(e, d) for e, d, _ in named(seen, "we-async")
           if e.startswith("wait_") or e == "refused"]
    assert [e for e, _ in got] == ["refused", "wait_started", "wait_ended"]
    assert got[0][1]["kind"] == "AsyncRLock" and got[0][1]["client"] is not None
    got = got[1:]
    assert got[1][1]["outcome"] == "acquired" and got[1][1]["wait"] >= 0.15
    assert got[1][1]["kind"] == "AsyncRLock"


def test_a_rate_limiter_wait_is_reported_from_its_call(r, seen):
    from django_rlock.engine import RateLimiter

    rl = RateLimiter(r, "we-rate")
    rl.set_rate(1, 0.3)
    rl.acquire()
    t0 = time.monotonic()
    rl.acquire()  # waits for the next permit, ~0.3 s
    measured = time.monotonic() - t0
    got = [(e, d) for e, d, _ in named(seen, "we-rate") if e.startswith("wait_")]
    assert [e for e, _ in got] == ["wait_started", "wait_ended"]
    ended = got[1][1]
    assert ended["kind"] == "RateLimiter" and ended["outcome"] == "acquired"
    assert 0.2 <= ended["wait"] <= measured
