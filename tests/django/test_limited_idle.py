"""@limited's semaphores expire once idle (#23 section 7): a per-user template leaves no key
per user behind, and a semaphore in use never expires under its holders."""

from __future__ import annotations

import threading
import time

import pytest

from django_rlock import LockBusy, limited


def test_idle_semaphores_expire_and_one_in_use_never_does(db1):
    @limited("export:{user_id}", permits=1, client=db1, prefix="t:", idle_expiry=1.0)
    def export(user_id: int, hold: float = 0.0) -> int:
        time.sleep(hold)
        return user_id

    for user in range(20):
        assert export(user) == user
    keys = [k for k in db1.keys("t:export:*")]
    assert len(keys) == 20
    assert all(0 < db1.pttl(k) <= 1000 for k in keys)  # idle: all permits back, expiring

    # A permit taken makes it persistent again: held past the idle expiry, it stays.
    inside = threading.Event()
    t = threading.Thread(target=lambda: (inside.set(), export(0, hold=2.0)))
    t.start()
    inside.wait(5)
    deadline = time.monotonic() + 5
    while db1.pttl("t:export:0") != -1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert db1.pttl("t:export:0") == -1
    time.sleep(1.3)  # past the idle expiry
    assert db1.get("t:export:0") == b"0"  # still there: one permit, taken
    with pytest.raises(LockBusy):
        export(0)  # never a second holder
    t.join(10)
    assert 0 < db1.pttl("t:export:0") <= 1000  # idle again

    time.sleep(1.3)
    assert db1.keys("t:export:*") == []  # nothing left per user
    assert export(5) == 5  # an expired semaphore is set up again on its next use


def test_idle_expiry_none_keeps_redissons_persistent_semaphore(db1):
    @limited("keep:{n}", permits=2, client=db1, prefix="t:", idle_expiry=None)
    def keep(n: int) -> int:
        return n

    keep(1)
    assert db1.pttl("t:keep:1") == -1
