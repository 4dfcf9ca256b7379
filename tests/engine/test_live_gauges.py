"""django_rlock_held / django_rlock_waiting: what this process holds and waits for right now,
per label, counted from events (never a scan), back to zero when it is all over."""

from __future__ import annotations

import threading
import time

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from django_rlock import RLock, prometheus  # noqa: E402


def value(registry, name: str, lock: str) -> float:
    return registry.get_sample_value(name, {"lock": lock}) or 0.0


def until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never reached"
        time.sleep(0.01)


@pytest.fixture
def registry():
    reg = prometheus_client.CollectorRegistry()
    prometheus.install(reg)
    yield reg
    prometheus.uninstall(reg)


def test_holds_and_waiters_are_counted_while_they_last(r, registry, holders):
    held = lambda: value(registry, "django_rlock_held", "g:{n}")  # noqa: E731
    waiting = lambda: value(registry, "django_rlock_waiting", "g:{n}")  # noqa: E731
    a, b = RLock(r, "g:1", label="g:{n}"), RLock(r, "g:2", label="g:{n}")
    a.lock()
    a.lock()  # reentry: still one hold
    b.lock()
    assert held() == 2 and waiting() == 0
    # Four threads wait for g:1; each takes it in turn once it is let go, then lets it go.
    waiters = [holders() for _ in range(4)]
    done = [w.submit(lambda: (a.lock(), time.sleep(0.01), a.unlock())) for w in waiters]
    until(lambda: waiting() == 4)
    assert held() == 2
    a.unlock()
    a.unlock()
    for result in done:
        result(30)
    assert waiting() == 0 and held() == 1
    b.unlock()
    assert held() == 0
    # A wait that runs out, and a one-shot refusal, leave nothing behind.
    h = holders()
    h.call(a.lock)
    assert held() == 1
    assert a.try_lock(wait_time=0.1) is False and a.try_lock() is False
    assert waiting() == 0
    h.call(a.unlock)
    assert held() == 0


def test_a_hold_lost_or_ended_with_its_thread_is_no_longer_counted(r, registry):
    lock = RLock(r, "g-lost", label="lost")
    lock.lock()
    assert value(registry, "django_rlock_held", "lost") == 1
    RLock(r, "g-lost").force_unlock()
    assert value(registry, "django_rlock_held", "lost") == 0
    t = threading.Thread(target=RLock(r, "g-dies", label="dies", watchdog_timeout=3.0).lock)
    t.start()
    t.join()
    assert value(registry, "django_rlock_held", "dies") == 1
    until(lambda: value(registry, "django_rlock_held", "dies") == 0)  # the watchdog's release


def test_a_lease_that_runs_out_unreleased_is_no_longer_counted(r, registry):
    lock = RLock(r, "g-lease", label="lease")
    lock.lock(lease_time=0.3)
    assert value(registry, "django_rlock_held", "lease") == 1
    until(lambda: value(registry, "django_rlock_held", "lease") == 0)
