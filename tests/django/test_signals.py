"""Django signals for lock events, forwarded from the engine; receivers never hurt a lock."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from django_rlock import get_lock, limited, locked
from django_rlock.signals import (
    force_unlocked_by,
    lock_acquired,
    lock_busy,
    lock_force_unlocked,
    lock_lost,
    lock_released,
)


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []
    signals = {"acquired": lock_acquired, "released": lock_released, "lost": lock_lost,
               "busy": lock_busy, "force_unlocked": lock_force_unlocked}
    receivers = {}
    for which, signal in signals.items():
        def receiver(sender: Any, _which: str = which, **kwargs: Any) -> None:
            got.append((_which, kwargs))
        receivers[which] = receiver
        signal.connect(receiver, weak=False)
    yield got
    for which, signal in signals.items():
        signal.disconnect(receivers[which])


def test_acquired_released_busy_with_name_key_and_label(received, hold):
    @locked("sig:{n}", on_busy="skip")
    def job(n: int) -> str:
        return "ran"

    assert job(1) == "ran"
    hold(get_lock("sig:2"))
    assert job(2) is None
    got = [(e, d["name"], d["key"], d["label"]) for e, d in received]
    assert got == [
        ("acquired", "sig:1", "demo:rlock:sig:1", "sig:{n}"),
        ("released", "sig:1", "demo:rlock:sig:1", "sig:{n}"),
        ("acquired", "sig:2", "demo:rlock:sig:2", None),  # get_lock without label=
        ("busy", "sig:2", "demo:rlock:sig:2", "sig:{n}"),
    ]
    acquired, released, _, busy = (d for _, d in received)
    assert acquired["owner"] == released["owner"] and acquired["lease"] is None
    assert 0 <= acquired["wait"] < 1 and released["held"] >= 0 and released["reason"] == "unlock"
    assert 29 < busy["ttl"] <= 30


def test_limited_permits_send_acquired_released_and_lost_with_the_template(received, db1):
    """A @limited permit is a hold: acquired and released with the template as label and the
    permit id as owner; force-unlocked while its call runs (``locks clear``), its lost signal
    carries the template too (an alert by lock sees it)."""
    import threading

    @limited("lim:{n}", permits=1)
    def job(n: int, started: threading.Event | None = None,
            go: threading.Event | None = None) -> str:
        if started is not None and go is not None:
            started.set()
            go.wait(10)
        return "ran"

    assert job(1) == "ran"
    (a, acquired), (r, released) = received
    assert (a, acquired["name"], acquired["label"]) == ("acquired", "lim:1", "lim:{n}")
    assert (r, released["label"], released["reason"]) == ("released", "lim:{n}", "unlock")
    assert acquired["owner"] == released["owner"] and len(acquired["owner"]) == 32
    assert acquired["lease"] is None and released["held"] >= 0
    received.clear()
    started, go = threading.Event(), threading.Event()
    t = threading.Thread(target=job, args=(2, started, go))
    t.start()
    assert started.wait(10)
    call_command("locks", "clear", "lim:2", "--no-input", stdout=io.StringIO())
    go.set()
    t.join(10)
    lost = [d for e, d in received if e == "lost"]
    assert [(d["name"], d["label"], d["reason"]) for d in lost] == [
        ("lim:2", "lim:{n}", "force_unlocked")]
    assert [e for e, _ in received if e == "released"] == []  # lost, not released


def test_force_unlocked_names_the_user_or_none(received, hold, db1):
    hold(get_lock("cleared", label="cleared"))
    call_command("locks", "clear", "cleared", interactive=False)
    hold(get_lock("by-admin"))
    with force_unlocked_by("alice"):
        assert get_lock("by-admin").force_unlock() is True
    assert get_lock("after").force_unlock() is False  # the block is over: no user any more
    forced = {d["name"]: (d["user"], d["deleted"], d["key"]) for e, d in received
              if e == "force_unlocked"}
    assert forced == {"cleared": (None, True, "demo:rlock:cleared"),
                      "by-admin": ("alice", True, "demo:rlock:by-admin"),
                      "after": (None, False, "demo:rlock:after")}
    lost = {d["name"]: (d["label"], d["how"]) for e, d in received if e == "lost"}
    # Their holders in this process were told.
    assert lost == {"cleared": ("cleared", "force-unlocked"), "by-admin": (None, "force-unlocked")}


def test_a_raising_receiver_is_logged_and_the_lock_still_works(caplog):
    def bad(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver failed")

    lock_acquired.connect(bad, weak=False)
    try:
        caplog.set_level(logging.ERROR, logger="django_rlock")
        lock = get_lock("robust")
        with lock:
            assert lock.is_held_by_current_thread()
    finally:
        lock_acquired.disconnect(bad)
    assert any("lock_acquired" in rec.getMessage() for rec in caplog.records)
    assert not lock.is_locked()


def test_async_receivers_are_awaited_also_when_an_asyncio_lock_sends(received):
    awaited: list[str] = []

    async def areceiver(sender: Any, name: str, **kwargs: Any) -> None:
        awaited.append(name)

    @locked("asig:{n}")
    async def job(n: int) -> int:
        return n

    lock_acquired.connect(areceiver, weak=False)
    try:
        async def main() -> None:
            assert await job(1) == 1
            for _ in range(1000):  # sent in a task on this loop, right after the event
                if awaited and len(received) == 2:
                    break
                await asyncio.sleep(0.01)

        asyncio.run(main())
        # And from a thread without a loop (as the watchdog's), through async_to_sync.
        with get_lock("sync-side"):
            pass
    finally:
        lock_acquired.disconnect(areceiver)
    assert awaited == ["asig:1", "sync-side"]
    assert [(e, d["name"], d["label"]) for e, d in received] == [
        ("acquired", "asig:1", "asig:{n}"), ("released", "asig:1", "asig:{n}"),
        ("acquired", "sync-side", None), ("released", "sync-side", None)]


def test_an_asyncio_locks_events_reach_sync_receivers_in_order_behind_a_slow_send():
    """"acquired" has an async receiver (so it is sent in a task, its sync receivers in a
    thread) and a slow sync one; "released" has sync receivers only. Its receivers must still
    hear it after "acquired", not while that send is under way."""
    import time

    order: list[str] = []

    async def areceiver(sender: Any, **kwargs: Any) -> None:
        pass

    def slow(sender: Any, **kwargs: Any) -> None:
        time.sleep(0.3)
        order.append("acquired")

    def on_release(sender: Any, **kwargs: Any) -> None:
        order.append("released")

    @locked("sig-order")
    async def job() -> None:
        pass

    lock_acquired.connect(areceiver, weak=False)
    lock_acquired.connect(slow, weak=False)
    lock_released.connect(on_release, weak=False)
    try:
        async def main() -> None:
            await job()
            for _ in range(500):
                if len(order) == 2:
                    break
                await asyncio.sleep(0.01)

        asyncio.run(main())
    finally:
        lock_acquired.disconnect(areceiver)
        lock_acquired.disconnect(slow)
        lock_released.disconnect(on_release)
    assert order == ["acquired", "released"]
