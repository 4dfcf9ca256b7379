"""Where the beat schedulers find Redis and their group, the ticks they reckon, and the error
when django-celery-beat is missing (no beat process here: ``test_beat.py`` runs them)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured
from celery.schedules import crontab, schedule

from django_rlock.beat import beat_config, redis_url_of_broker
from django_rlock.beatticks import from_us, latest_tick, next_after, server_clock, to_us

ROOT = Path(__file__).parents[2]
S = 1_000_000


@pytest.mark.parametrize(("broker", "url"), [
    ("redis://h:6380/2", "redis://h:6380/2"),
    ("rediss://:pw@h:6380/0?ssl_cert_reqs=required", "rediss://:pw@h:6380/0?ssl_cert_reqs=required"),
    ("redis://h?virtual_host=3", "redis://h/3"),
    ("redis+socket:///run/r.sock?virtual_host=3", "unix:///run/r.sock?db=3"),
    ("socket:///run/r.sock", "unix:///run/r.sock?db=0"),
    ("redis://a:6379/1;redis://b:6379/1", "redis://a:6379/1"),
    ("amqp://guest@h//", None),
    ("sentinel://h:26379", None),
])
def test_a_redis_broker_url_becomes_a_redis_py_url(broker: str, url: str | None) -> None:
    assert redis_url_of_broker(broker) == url


def plain_app(monkeypatch: pytest.MonkeyPatch, **conf: object) -> Celery:
    """An app outside Django (pytest-django's settings module unset for the call)."""
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    monkeypatch.setattr("django_rlock.beat._django", lambda: None)
    app = Celery("proj", set_as_current=False)
    app.conf.update(conf)
    return app


def test_the_broker_is_the_default_redis_and_the_group_is_the_app_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = beat_config(plain_app(monkeypatch, broker_url="redis://h:6380/4"))
    kwargs = config.client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("h", 6380, 4)
    assert (config.group, config.prefix, config.watchdog_timeout, config.source) == (
        "celery-beat:proj", "rlock:", 30.0, "broker_url")


def test_rlock_beat_url_and_the_other_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    config = beat_config(plain_app(
        monkeypatch, broker_url="amqp://guest@h//", rlock_beat_url="redis://other:7000/1",
        rlock_beat_group="beat", rlock_beat_prefix="p:", rlock_beat_watchdog_timeout=5))
    kwargs = config.client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["db"]) == ("other", 1)
    assert (config.group, config.prefix, config.watchdog_timeout, config.source) == (
        "beat", "p:", 5.0, "rlock_beat_url")


@pytest.mark.parametrize(("conf", "message"), [
    ({"broker_url": "amqp://guest@h//"}, "set rlock_beat_url"),
    ({"rlock_beat_url": "redis://h", "rlock_beat_watchdog_timeout": 0}, "> 0"),
    ({"rlock_beat_url": "redis://h", "rlock_beat_watchdog_timeout": "3"}, "number of seconds"),
    ({"rlock_beat_url": "redis://h", "rlock_beat_prefix": 3}, "rlock_beat_prefix"),
    ({"rlock_beat_url": 42}, "rlock_beat_url must be a Redis URL"),
])
def test_bad_settings_are_refused_before_any_redis_command(
        monkeypatch: pytest.MonkeyPatch, conf: dict[str, object], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        beat_config(plain_app(monkeypatch, **conf))


def test_with_django_the_rlock_cache_its_prefix_and_watchdog_are_used(settings) -> None:
    from django_rlock.connection import get_client, get_prefix

    settings.RLOCK = {"WATCHDOG_TIMEOUT": 7.0}
    app = Celery("proj", set_as_current=False)
    app.conf.broker_url = "redis://broker:6379/0"
    config = beat_config(app)
    assert config.source == "RLOCK"
    assert config.client.connection_pool is get_client().connection_pool
    assert (config.prefix, config.watchdog_timeout) == (get_prefix(), 7.0)


def test_interval_ticks_keep_their_grid_and_a_gap_is_one_tick() -> None:
    every = schedule(timedelta(seconds=10))
    base = to_us(datetime(2026, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC))
    assert next_after(every, base) == base + 10 * S
    assert latest_tick(every, base, base + 9 * S) is None
    assert latest_tick(every, base, base + 10 * S) == base + 10 * S
    assert latest_tick(every, base, base + 95 * S) == base + 90 * S  # 9 due: one send, the last


def test_crontab_ticks_are_pure_functions_of_the_last_one() -> None:
    app = Celery("proj", set_as_current=False)
    app.conf.timezone = "UTC"
    minutely = crontab(minute="*", app=app)
    base = to_us(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC))
    first = next_after(minutely, base)
    assert from_us(first) == datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    now = to_us(datetime(2026, 1, 1, 12, 10, 5, tzinfo=UTC))
    assert from_us(latest_tick(minutely, base, now)) == datetime(2026, 1, 1, 12, 10, tzinfo=UTC)
    assert minutely.nowfun is None  # the probe's "now" was put back


def test_crontab_ticks_are_at_the_app_s_hour_across_a_dst_change() -> None:
    """``hour=9`` in an app on Europe/Paris is 08:00 UTC in winter, 07:00 UTC in summer (on
    Celery 5.5 too, which reads the hour of the datetime it is given as it is: CI runs this
    file on 5.5 as well)."""
    app = Celery("proj", set_as_current=False)
    app.conf.timezone = "Europe/Paris"
    nine = crontab(hour=9, minute=0, app=app)
    winter = to_us(datetime(2026, 11, 27, 7, 0, tzinfo=UTC))  # 08:00 in Paris
    assert from_us(next_after(nine, winter)) == datetime(2026, 11, 27, 8, 0, tzinfo=UTC)
    saturday = to_us(datetime(2026, 3, 28, 8, 0, tzinfo=UTC))  # the day before summer time
    assert from_us(next_after(nine, saturday)) == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)
    now = to_us(datetime(2026, 11, 27, 8, 0, 5, tzinfo=UTC))
    assert from_us(latest_tick(nine, winter - 2 * 86400 * S, now)) == datetime(
        2026, 11, 27, 8, 0, tzinfo=UTC)
    # "Due" as the scheduler sees it, with the server's clock (in the schedule's timezone).
    server_clock(nine, lambda: now)
    due, _ = nine.is_due(from_us(winter).astimezone(nine.tz))
    assert due
    server_clock(nine, lambda: now)  # (set once: a second call keeps the first)
    assert nine.now().utcoffset() == timedelta(hours=1)


@pytest.mark.parametrize(("spec", "gap_days", "latest"), [
    ({"minute": "*"}, 7, datetime(2026, 11, 27, 5, 20, tzinfo=UTC)),            # 10,080 ticks
    ({"minute": "*/5", "hour": "3"}, 400, datetime(2026, 11, 27, 3, 55, tzinfo=UTC)),
    ({"minute": 0, "hour": 9, "day_of_month": 1, "month_of_year": 1}, 3000,
     datetime(2026, 1, 1, 9, 0, tzinfo=UTC)),
])
def test_a_gap_of_any_length_is_one_tick_the_latest_on_the_grid(
        spec: dict[str, object], gap_days: int, latest: datetime) -> None:
    app = Celery("proj", set_as_current=False)
    app.conf.timezone = "UTC"
    sched = crontab(app=app, **spec)  # type: ignore[arg-type]
    now = to_us(datetime(2026, 11, 27, 5, 20, 30, tzinfo=UTC))
    base = now - gap_days * 86400 * S + 7 * S
    assert from_us(latest_tick(sched, base, now)) == latest
    assert next_after(sched, to_us(latest)) > now


def test_without_django_celery_beat_the_database_scheduler_names_the_package() -> None:
    code = ("import sys; sys.modules['django_celery_beat'] = None\n"
            "import django_rlock.beat as b\n"
            "from django_rlock.beat import LeaderScheduler\n"
            "try:\n    b.LeaderDatabaseScheduler\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert "pip install django-celery-beat" in out.stdout, out.stderr
