"""Django signals for lock events, forwarded from the engine; receivers never hurt a lock."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from django_rlock import get_lock, locked
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
    events = [(e, d["name"], d["label"]) for e, d in received]
    assert ("acquired", "sig:1", "sig:{n}") in events
    assert ("released", "sig:1", "sig:{n}") in events
    assert ("busy", "sig:2", "sig:{n}") in events
    [busy] = [d for e, d in received if e == "busy"]
    assert busy["key"] == "demo:rlock:sig:2" and 29 < busy["ttl"] <= 30


def test_force_unlocked_names_the_user_or_none(received, hold, db1):
    hold(get_lock("cleared"))
    call_command("locks", "clear", "cleared", interactive=False)
    hold(get_lock("by-admin"))
    with force_unlocked_by("alice"):
        assert get_lock("by-admin").force_unlock() is True
    forced = {d["name"]: d["user"] for e, d in received if e == "force_unlocked"}
    assert forced == {"cleared": None, "by-admin": "alice"}
    lost = [d["name"] for e, d in received if e == "lost"]
    assert sorted(lost) == ["by-admin", "cleared"]  # their holders in this process were told


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
