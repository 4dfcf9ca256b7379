"""RLOCK["PROMETHEUS"]: the app installs the exporter; @locked's template is the only label."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps

from django_rlock import LockBusy, get_lock, limited, locked
from django_rlock.checks import check_settings
from django_rlock.engine import events

prometheus_client = pytest.importorskip("prometheus_client")

from django_rlock import prometheus  # noqa: E402


def value(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def installed_by_setting(settings: Any) -> Iterator[prometheus.LockMetrics]:
    """The app's ready() with RLOCK["PROMETHEUS"] = True, into the default registry."""
    settings.RLOCK = {"PROMETHEUS": True}
    apps.get_app_config("django_rlock").ready()
    [metrics] = [x for x in events.listeners if isinstance(x, prometheus.LockMetrics)]
    yield metrics
    prometheus.uninstall()


def test_the_setting_installs_the_exporter_and_locked_counts_by_template(installed_by_setting,
                                                                         hold):
    assert installed_by_setting is prometheus.install()  # the default registry's, once
    before = {m: value(f"django_rlock_{m}", lock="report:{pk}")
              for m in ("acquisitions_total", "busy_total", "held_seconds_count",
                        "wait_seconds_count")}

    @locked("report:{pk}", on_busy="skip")
    def report(pk: int) -> int:
        return pk

    assert [report(pk) for pk in range(50)] == list(range(50))
    hold(get_lock("report:7"))
    assert report(7) is None
    after = {m: value(f"django_rlock_{m}", lock="report:{pk}") - v for m, v in before.items()}
    assert after == {"acquisitions_total": 50, "busy_total": 1, "held_seconds_count": 50,
                     "wait_seconds_count": 50}
    names = {s.labels.get("lock") for m in prometheus_client.REGISTRY.collect()
             if m.name.startswith("django_rlock_") for s in m.samples}
    assert not any(n and n.startswith("report:") and n != "report:{pk}" for n in names)


def test_limited_permits_count_as_acquisitions_by_template(installed_by_setting):
    """@limited: each permit taken counts as an acquisition with its hold time, under the
    template, beside the busy calls (a busy ratio is busy / (busy + acquisitions)); sync and
    async alike, and none stays counted as held."""
    t = "export:{u}"
    metrics = ("acquisitions_total", "busy_total", "held_seconds_count", "wait_seconds_count")
    before = {m: value(f"django_rlock_{m}", lock=t) for m in metrics}

    @limited(t, permits=1, on_busy="raise")
    def export(u: int, inner: bool = False) -> int:
        if inner:
            with pytest.raises(LockBusy):
                export(u)
        return u

    @limited(t, permits=1, on_busy="raise")
    async def aexport(u: int) -> int:
        return u

    import asyncio

    assert [export(1), export(2), export(3, inner=True), asyncio.run(aexport(4))] == [1, 2, 3, 4]
    after = {m: value(f"django_rlock_{m}", lock=t) - v for m, v in before.items()}
    assert after == {"acquisitions_total": 4, "busy_total": 1, "held_seconds_count": 4,
                     "wait_seconds_count": 4}
    assert value("django_rlock_held", lock=t) == 0


def test_a_limited_call_waiting_for_a_permit_counts_under_its_template(installed_by_setting):
    import threading

    t = "slot:{u}"
    inside, go = threading.Event(), threading.Event()

    @limited(t, permits=1, wait=10)
    def slot(u: int) -> int:
        inside.set()
        go.wait(10)
        return u

    first = threading.Thread(target=slot, args=(1,))
    first.start()
    assert inside.wait(10)
    inside.clear()
    second = threading.Thread(target=slot, args=(1,))
    second.start()
    deadline = time.monotonic() + 10
    while value("django_rlock_waiting", lock=t) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert value("django_rlock_waiting", lock=t) == 1 and value("django_rlock_held", lock=t) == 1
    go.set()
    first.join(10)
    second.join(10)
    assert value("django_rlock_waiting", lock=t) == 0 and value("django_rlock_held", lock=t) == 0


def test_without_the_setting_nothing_is_installed(settings: Any):
    settings.RLOCK = {"PROMETHEUS": False}
    apps.get_app_config("django_rlock").ready()
    assert not any(isinstance(x, prometheus.LockMetrics) for x in events.listeners)


def test_the_checks_want_a_bool_and_prometheus_client(settings: Any, monkeypatch):
    settings.RLOCK = {"PROMETHEUS": "yes"}
    assert [m.id for m in check_settings()] == ["django_rlock.E003"]
    settings.RLOCK = {"PROMETHEUS": True}
    assert check_settings() == []
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    [error] = check_settings()
    assert error.id == "django_rlock.E005" and "django-rlock[prometheus]" in error.hint
    apps.get_app_config("django_rlock").ready()  # and the app does not try to install it
    assert not any(isinstance(x, prometheus.LockMetrics) for x in events.listeners)
