"""Lock events without Django: one per hold, with wait and held times; listeners never hurt."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import redis.asyncio

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import events


@pytest.fixture
def seen() -> Iterator[list[tuple[str, dict]]]:
    got: list[tuple[str, dict]] = []

    def listener(event: str, data: dict) -> None:
        got.append((event, data))

    events.add_listener(listener)
    yield got
    events.remove_listener(listener)


def of(seen, event: str, name: str) -> list[dict]:
    return [d for e, d in seen if e == event and d["name"] == name]


def test_one_acquired_and_one_released_per_hold_not_per_reentry(r, seen):
    lock = RLock(r, "ev", label="ev:{n}")
    lock.lock()
    lock.lock()
    lock.unlock()
    lock.unlock()
    [acq], [rel] = of(seen, "acquired", "ev"), of(seen, "released", "ev")
    assert acq["label"] == "ev:{n}" and acq["key"] == "ev" and acq["lease"] is None
    assert 0 <= acq["wait"] < 1 and rel["reason"] == "unlock" and rel["held"] >= 0
    assert acq["owner"] == rel["owner"]
    lock.lock(lease_time=5)
    lock.unlock()
    assert of(seen, "acquired", "ev")[1]["lease"] == 5.0


def test_a_contended_acquire_reports_its_wait(r, seen, holders):
    lock = RLock(r, "ev-wait")
    h = holders()
    h.call(lock.lock)
    threading.Timer(0.3, lambda: h.call(lock.unlock)).start()
    waiter = holders()
    assert waiter.call(lambda: lock.try_lock(wait_time=5)) is True
    waits = [d["wait"] for d in of(seen, "acquired", "ev-wait")]
    assert len(waits) == 2 and waits[1] >= 0.2
    held = of(seen, "released", "ev-wait")[0]["held"]
    assert held >= 0.2
    waiter.call(lock.unlock)


def test_an_ended_thread_lost_hold_and_force_unlock(r, seen):
    t = threading.Thread(target=RLock(r, "ev-dead", watchdog_timeout=3.0).lock)
    t.start()
    t.join()
    deadline = time.monotonic() + 5  # released within a period (1 s), never by its 3 s lease
    while not of(seen, "released", "ev-dead") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert of(seen, "released", "ev-dead")[0]["reason"] == "owner ended"

    lost = RLock(r, "ev-lost", watchdog_timeout=0.6)
    lost.lock()
    r.delete("ev-lost")
    deadline = time.monotonic() + 3
    while not of(seen, "lost", "ev-lost") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert of(seen, "lost", "ev-lost")[0]["how"]

    forced = RLock(r, "ev-forced")
    assert forced.force_unlock() is False
    assert of(seen, "force_unlocked", "ev-forced") == [
        {"name": "ev-forced", "key": "ev-forced", "label": None, "deleted": False}]


def test_a_raising_listener_is_logged_and_the_lock_still_works(r, caplog, seen):
    def bad(event: str, data: dict) -> None:
        raise RuntimeError("boom")

    events.add_listener(bad)
    try:
        caplog.set_level(logging.ERROR, logger="django_rlock")
        lock = RLock(r, "ev-bad")
        with lock:
            assert lock.is_held_by_current_thread()
    finally:
        events.remove_listener(bad)
    assert not r.exists("ev-bad")
    assert any("listener" in rec.getMessage() for rec in caplog.records)
    assert of(seen, "released", "ev-bad")  # the other listener still got it
    with pytest.raises(TypeError):
        events.add_listener("not callable")  # type: ignore[arg-type]


def test_removed_listeners_hear_nothing(r):
    got: list = []
    listener = lambda event, data: got.append(event)  # noqa: E731
    events.add_listener(listener)
    events.add_listener(listener)  # once only
    with RLock(r, "ev-once"):
        pass
    events.remove_listener(listener)
    with RLock(r, "ev-once"):
        pass
    assert got == ["acquired", "released"]


def test_async_locks_emit_the_same(redis_server, seen):
    async def main():
        ar = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ar, "ev-async", label="async")
        async with lock:
            async with lock:
                pass

        async def ends_holding():
            await AsyncRLock(ar, "ev-async-dead").lock()

        await asyncio.create_task(ends_holding())
        await asyncio.sleep(0.2)
        await ar.aclose()

    asyncio.run(main())
    assert len(of(seen, "acquired", "ev-async")) == 1
    assert [d["label"] for d in of(seen, "released", "ev-async")] == ["async"]
    assert of(seen, "released", "ev-async-dead")[0]["reason"] == "owner ended"
