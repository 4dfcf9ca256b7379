"""What a hand-off between threads does before the heir runs, made shorter (invariants 1, 40):
a final release drops its hold while the server runs the script, and the heir's hold is still
its own. Each test fails if the shortcut is taken where it must not."""

from __future__ import annotations

import threading
import time

from django_rlock import RLock
from django_rlock.engine import identity
from django_rlock.engine.holds import server_id
from django_rlock.engine.watchdog import watchdog


def test_a_partial_release_keeps_its_hold_and_its_renewal(r):
    """Only a final release drops its hold before the reply: a reentrant hold released once
    is still renewed past its timeout."""
    lock = RLock(r, "reentered", watchdog_timeout=1.0)
    lock.lock()
    lock.lock()
    k = (server_id(r), lock.key, identity.thread_owner())
    try:
        lock.unlock()
        hold = watchdog().get(k)
        assert hold is not None and hold.count == 1
        time.sleep(1.6)  # past the 1 s lease: only a renewal keeps it
        assert lock.hold_count() == 1 and r.pttl("reentered") > 0
    finally:
        lock.unlock()
    assert watchdog().get(k) is None and not r.exists("reentered")


def test_a_final_release_drops_its_hold_before_its_reply(own_server):
    """The hold of a final release is gone from the watchdog while the server has not yet
    answered (every outcome drops it, invariant 1): no renewal is sent for a lock being
    released, and the reply finds nothing left to book twice."""
    admin = own_server.client()
    c = own_server.client()
    lock = RLock(c, "dropped", watchdog_timeout=30.0)
    lock.lock()  # (this thread's hold: this thread releases it below)
    k = (server_id(c), lock.key, identity.thread_owner())
    assert watchdog().get(k) is not None
    saw: list[float] = []

    def watch() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if watchdog().get(k) is None:
                saw.append(time.monotonic())
                return
            time.sleep(0.002)

    admin.client_pause(600, all=True)  # the release is written, and answered 0.6 s later
    watcher = threading.Thread(target=watch)
    watcher.start()
    lock.unlock()
    returned = time.monotonic()
    watcher.join(10)
    assert saw and saw[0] < returned - 0.3, (saw, returned)
    assert watchdog().get(k) is None and not admin.exists("dropped")
    c.close()
    admin.close()


def test_a_heir_holds_with_its_own_thread_label_and_renewal(r):
    """A hold booked by the releasing thread for its heir is the heir's: its thread (a thread
    that ends holding is released for), its label, renewed; the releaser's own is gone."""
    threads, rounds = 3, 6
    errors: list[BaseException] = []
    checked: list[int] = []

    def contend() -> None:
        lock = RLock(r, "heirs", label="heirs-label")
        k = (server_id(r), lock.key, identity.thread_owner())
        try:
            for _ in range(rounds):
                assert lock.try_lock(wait_time=30)
                hold = watchdog().get(k)
                assert hold is not None and hold.count == 1
                assert hold.thread is threading.current_thread()
                assert hold.label == "heirs-label" and hold.renew and hold.name == "heirs"
                checked.append(1)
                time.sleep(0.01)  # the others queue meanwhile
                lock.unlock()
                assert watchdog().get(k) is None
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=contend) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not errors, errors
    assert len(checked) == threads * rounds and not r.exists("heirs")
