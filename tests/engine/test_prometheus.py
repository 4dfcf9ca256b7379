"""The Prometheus exporter counts real lock events, labelled by template, never by name."""

from __future__ import annotations

import threading
import time

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from django_rlock import RLock, prometheus  # noqa: E402
from django_rlock.engine import events  # noqa: E402


def value(registry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_metrics_follow_real_locks_with_bounded_labels(r, holders):
    registry = prometheus_client.CollectorRegistry()
    metrics = prometheus.install(registry)
    assert prometheus.install(registry) is metrics  # idempotent
    try:
        for i in range(100):
            with RLock(r, f"x:{i}", label="x:{i}"):
                pass
        with RLock(r, "plain"):
            pass
        h = holders()
        busy_lock = RLock(r, "held", label="held")
        h.call(busy_lock.lock)
        assert RLock(r, "held", label="held").force_unlock() is True
        t = threading.Thread(target=RLock(r, "dies", label="dies", watchdog_timeout=3.0).lock)
        t.start()
        t.join()
        deadline = time.monotonic() + 5  # released within a period (1 s), not by its lease
        while r.exists("dies") and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        prometheus.uninstall(registry)
    assert value(registry, "django_rlock_acquisitions_total", lock="x:{i}") == 100
    assert value(registry, "django_rlock_acquisitions_total", lock="unlabelled") == 1
    assert value(registry, "django_rlock_held_seconds_count", lock="x:{i}") == 100
    assert value(registry, "django_rlock_wait_seconds_count", lock="x:{i}") == 100
    assert value(registry, "django_rlock_force_unlocks_total", lock="held") == 1
    assert value(registry, "django_rlock_lost_total", lock="held") == 1  # its holder was told
    assert value(registry, "django_rlock_owner_ended_total", lock="dies") == 1
    # One series per template, not per name.
    series = {s.labels["lock"] for m in registry.collect() for s in m.samples if "lock" in s.labels}
    assert series == {"x:{i}", "unlabelled", "held", "dies"}
    # Uninstalled: nothing moves any more.
    with RLock(r, "x:0", label="x:{i}"):
        pass
    assert value(registry, "django_rlock_acquisitions_total", lock="x:{i}") == 100
    assert metrics not in events.listeners


def test_installed_again_the_same_metrics_resume(r):
    registry = prometheus_client.CollectorRegistry()
    first = prometheus.install(registry)
    prometheus.uninstall(registry)
    prometheus.uninstall(registry)  # harmless
    try:
        assert prometheus.install(registry) is first  # not registered twice (that would raise)
        with RLock(r, "again", label="again"):
            pass
    finally:
        prometheus.uninstall(registry)
    assert value(registry, "django_rlock_acquisitions_total", lock="again") == 1
    other = prometheus_client.CollectorRegistry()
    try:
        assert prometheus.install(other) is not first  # each registry has its own
    finally:
        prometheus.uninstall(other)
