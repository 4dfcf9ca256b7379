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
    threading.Timer(0.2, lambda: h.call(lock.unlock)).start()
    waiter = holders()
    assert waiter.call(lambda: lock.try_lock(wait_time=5)) is True
    waits = [d["wait"] for d in of(seen, "acquired", "ev-wait")]
    assert len(waits) == 2 and waits[1] >= 0.15
    held = of(seen, "released", "ev-wait")[0]["held"]
    assert held >= 0.15
    waiter.call(lock.unlock)


def wait_for(seen, event: str, name: str, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not of(seen, event, name) and time.monotonic() < deadline:
        time.sleep(0.02)
    return of(seen, event, name)


def test_a_thread_that_ends_holding_is_released_as_owner_ended(r, seen):
    # A 3 s lease, renewed (and ended owners looked for) every 1 s: a release within 2.5 s is
    # the watchdog's, never the key expiring (which would be no event at all).
    t = threading.Thread(target=RLock(r, "ev-dead", watchdog_timeout=3.0, label="dead").lock)
    t0 = time.monotonic()
    t.start()
    t.join()
    [rel] = wait_for(seen, "released", "ev-dead", 2.5)
    assert time.monotonic() - t0 < 2.5 and not r.exists("ev-dead")
    assert rel["reason"] == "owner ended" and rel["label"] == "dead" and rel["held"] >= 0
    assert not of(seen, "lost", "ev-dead")


def test_a_key_deleted_behind_the_holders_back_is_lost(r, seen):
    lock = RLock(r, "ev-lost", watchdog_timeout=0.6, label="lost")
    lock.lock()
    r.delete("ev-lost")
    [lost] = wait_for(seen, "lost", "ev-lost", 3)
    [acq] = of(seen, "acquired", "ev-lost")
    assert lost["how"] and lost["label"] == "lost" and lost["owner"] == acq["owner"]
    assert lost["held"] > 0 and lock.is_lost()
    assert not of(seen, "released", "ev-lost")


def test_force_unlock_reports_the_delete_and_the_holder_it_cut_off(r, seen, holders):
    assert RLock(r, "ev-forced").force_unlock() is False
    assert of(seen, "force_unlocked", "ev-forced") == [
        {"name": "ev-forced", "key": "ev-forced", "label": None, "deleted": False}]

    h = holders()
    h.call(RLock(r, "ev-held", label="held:{n}").lock)
    assert RLock(r, "ev-held", label="held:{n}").force_unlock() is True
    [forced] = of(seen, "force_unlocked", "ev-held")
    assert forced["deleted"] is True and forced["label"] == "held:{n}"
    [lost] = of(seen, "lost", "ev-held")  # the holder, in this process, is told at once
    assert lost["how"] == "force-unlocked"
    assert lost["owner"] == of(seen, "acquired", "ev-held")[0]["owner"]


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
        await lock.lock(lease_time=5)
        await lock.unlock()

        async def ends_holding():
            await AsyncRLock(ar, "ev-async-dead").lock()

        await asyncio.create_task(ends_holding())
        await asyncio.sleep(0.2)

        # A contended acquire: the holder task lets go after 0.2 s.
        other = AsyncRLock(ar, "ev-async-wait")
        held = asyncio.Event()

        async def holder():
            await other.lock()
            held.set()
            await asyncio.sleep(0.2)
            await other.unlock()

        task = asyncio.create_task(holder())
        await held.wait()
        assert await other.try_lock(wait_time=5) is True
        await other.unlock()
        await task
        assert await AsyncRLock(ar, "ev-async-wait").force_unlock() is False
        await ar.aclose()

    asyncio.run(main())
    acquired = of(seen, "acquired", "ev-async")
    assert [d["lease"] for d in acquired] == [None, 5.0]  # one per hold, not per reentry
    assert all(d["label"] == "async" and 0 <= d["wait"] < 1 for d in acquired)
    released = of(seen, "released", "ev-async")
    assert [(d["label"], d["reason"]) for d in released] == [("async", "unlock")] * 2
    assert of(seen, "released", "ev-async-dead")[0]["reason"] == "owner ended"
    waits = [d["wait"] for d in of(seen, "acquired", "ev-async-wait")]
    assert len(waits) == 2 and waits[1] >= 0.15
    assert of(seen, "force_unlocked", "ev-async-wait")[0]["deleted"] is False
