"""Time windows in Django (issue #21, section 3): ``RLOCK["MAX_HOLD"]`` / ``["WARN_HELD_AFTER"]``,
``get_lock``'s and ``@locked``'s options, ``hold_at_least``, the signals, the admin's marked
rows and the oldest-hold gauge."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command  # noqa: F401
from django.test import Client, RequestFactory
from django.urls import reverse

from django_rlock import LockBusy, get_lock, locked
from django_rlock.checks import check_settings
from django_rlock.signals import lock_held_long, lock_lost
from tests.django.conftest import write_lock

PREFIX = "demo:rlock:"


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []

    def on_long(sender: Any, **kw: Any) -> None:
        got.append(("held_long", kw))

    def on_lost(sender: Any, **kw: Any) -> None:
        got.append(("lost", kw))

    lock_held_long.connect(on_long, weak=False)
    lock_lost.connect(on_lost, weak=False)
    yield got
    lock_held_long.disconnect(on_long)
    lock_lost.disconnect(on_lost)


def commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(stats.get(k, {}).get("calls", 0) for k in ("cmdstat_evalsha", "cmdstat_eval"))


def test_warn_held_after_one_warning_and_one_signal_per_hold(settings, received, caplog):
    caplog.set_level(logging.WARNING, logger="django_rlock")
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 1.5, "WARN_HELD_AFTER": 1.0}

    @locked("report:{pk}")
    def report(pk: int) -> None:
        time.sleep(3.0)

    report(7)
    time.sleep(0.1)
    long = [kw for what, kw in received if what == "held_long"]
    assert len(long) == 1
    assert long[0]["name"] == "report:7" and long[0]["label"] == "report:{pk}"
    assert long[0]["threshold"] == 1.0 and 1.0 <= long[0]["held"] < 2.5
    warnings = [r for r in caplog.records if "warn_held_after" in r.getMessage()]
    assert len(warnings) == 1 and "'report:7'" in warnings[0].getMessage()


def test_max_hold_from_the_settings_and_get_lock_s_own(settings, received, db1):
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 3.0, "MAX_HOLD": 1.0}
    lock = get_lock("stuck")
    assert lock.max_hold == 1.0 and get_lock("free", max_hold=5).max_hold == 5.0
    lock.lock()
    assert db1.pttl(PREFIX + "stuck") <= 1000  # the first lease never outlives max_hold
    time.sleep(1.3)
    assert lock.is_lost() and lock.lost_reason() == "max_hold"
    assert not db1.exists(PREFIX + "stuck")
    lost = [kw for what, kw in received if what == "lost"]
    assert len(lost) == 1 and lost[0]["reason"] == "max_hold" and lost[0]["name"] == "stuck"


def test_the_checks_want_seconds_or_none(settings):
    settings.RLOCK = {"MAX_HOLD": -1, "WARN_HELD_AFTER": "soon"}
    messages = " ".join(e.msg for e in check_settings(None))
    assert "MAX_HOLD" in messages and "WARN_HELD_AFTER" in messages


def test_hold_at_least_turns_away_every_run_in_the_window(db1):
    runs: list[int] = []

    @locked("nightly", hold_at_least=1.5)
    def nightly() -> None:
        runs.append(1)

    nightly()
    assert 1000 <= db1.pttl(PREFIX + "nightly") <= 1500
    with pytest.raises(LockBusy):  # the same thread too
        nightly()
    time.sleep(1.6)
    nightly()
    assert runs == [1, 1]


def test_a_raising_call_releases_at_once_unless_told_to_keep_its_window(db1):
    @locked("fails", hold_at_least=5)
    def fails() -> None:
        raise RuntimeError("boom")

    @locked("kept", hold_at_least=5, hold_at_least_on_error=True)
    def kept() -> None:
        raise RuntimeError("boom")

    for func in (fails, kept):
        with pytest.raises(RuntimeError):
            func()
    assert not db1.exists(PREFIX + "fails")
    assert 4000 < db1.pttl(PREFIX + "kept") <= 5000


def test_a_call_inside_an_outer_hold_leaves_no_lease(db1):
    @locked("outer", hold_at_least=5)
    def inner() -> None:
        pass

    with get_lock("outer"):
        inner()
        assert db1.pttl(PREFIX + "outer") > 5000  # still the outer hold, watchdog lease
    assert not db1.exists(PREFIX + "outer")


def test_an_async_view_keeps_its_window(db1):
    @locked("av:{pk}", hold_at_least=2)
    async def view(request: Any, pk: int) -> str:
        return "ok"

    request = RequestFactory().get("/")
    assert asyncio.run(view(request, 1)) == "ok"
    busy = asyncio.run(view(request, 1))
    assert busy.status_code == 423 and int(busy["Retry-After"]) == 2
    assert 1000 < db1.pttl(PREFIX + "av:1") <= 2000


@pytest.mark.django_db(transaction=True)
def test_in_a_transaction_the_window_counts_from_the_acquire(db1):
    from django.db import transaction

    @locked("tx", hold_at_least=2)
    def job() -> None:
        pass

    with transaction.atomic():
        job()
        assert db1.pttl(PREFIX + "tx") > 2000  # held (watchdog) until the commit
        time.sleep(0.5)
    assert 1000 < db1.pttl(PREFIX + "tx") <= 1500  # what is left of the 2 s


@pytest.mark.parametrize("options, error", [
    ({"hold_at_least": -1}, ValueError), ({"hold_at_least": "5"}, TypeError),
    ({"max_hold": 0}, ValueError), ({"warn_held_after": float("nan")}, ValueError),
    ({"hold_at_least": 5, "kind": "read"}, ValueError),
    ({"hold_at_least": 5, "cache": ["default", "builtin"]}, ValueError),
    ({"hold_at_least_on_error": True}, ValueError),
    ({"hold_at_least": 5, "hold_at_least_on_error": 1}, TypeError),
    ({"hold_at_least": 10, "max_hold": 5}, ValueError),
])
def test_bad_options_fail_when_decorating(options, error, db1):
    db1.config_resetstat()
    with pytest.raises(error, match="'bad'"):
        locked("bad", **options)
    assert commands(db1) == 0


@pytest.mark.parametrize("option", ["max_hold", "warn_held_after"])
@pytest.mark.parametrize("bad, error", [(-1, ValueError), (0, ValueError), ("3", TypeError),
                                        (float("inf"), ValueError)])
def test_get_lock_refuses_bad_windows_before_any_command(option, bad, error, db1):
    db1.config_resetstat()
    with pytest.raises(error, match="'bad'"):
        get_lock("bad", **{option: bad})
    assert commands(db1) == 0


@pytest.mark.django_db
def test_the_admin_marks_rows_held_longer_than_warn_held_after(settings, admin_client: Client,
                                                               db1):
    settings.RLOCK = {"WARN_HELD_AFTER": 60}
    write_lock(db1, PREFIX + "old", indexed=PREFIX, since=time.time() - 120, host="h", pid=1,
               process="p", thread="t")
    write_lock(db1, PREFIX + "new", indexed=PREFIX, host="h", pid=1, process="p", thread="t")
    page = admin_client.get(reverse("admin:django_rlock_lock_changelist")).content.decode()
    rows = {row.split('data-name="')[1].split('"')[0]: row for row in page.split("<tr class=")
            if 'data-name="' in row}
    assert "held-long" in rows["old"] and "held-long" not in rows["new"]


def test_the_oldest_hold_gauge(settings):
    prometheus_client = pytest.importorskip("prometheus_client")
    from django_rlock import prometheus

    registry = prometheus_client.CollectorRegistry()
    prometheus.install(registry)
    try:
        lock = get_lock("aged", label="aged:{n}")
        lock.lock()
        time.sleep(0.3)
        age = registry.get_sample_value("django_rlock_oldest_hold_seconds", {"lock": "aged:{n}"})
        assert age is not None and 0.3 <= age < 2
        lock.unlock()
        assert registry.get_sample_value("django_rlock_oldest_hold_seconds",
                                         {"lock": "aged:{n}"}) is None
    finally:
        prometheus.uninstall(registry)


def test_every_member_of_a_multi_lock_gets_the_windows(settings):
    settings.RLOCK = {"MAX_HOLD": 60}
    multi = get_lock("m", cache=["default", "builtin"], warn_held_after=5)
    assert [(m.max_hold, m.warn_held_after) for m in multi.locks] == [(60, 5), (60, 5)]
