"""The Celery app run by the beat tests (``tests/celery/test_beat.py``) as three ``celery beat``
processes: a Redis broker of the test's own, one entry every second, no worker.

``RLOCK_BEAT_HOUR=H`` (with ``RLOCK_BEAT_TZ``, the app's timezone): the one entry is
``crontab(minute="*", hour=H)``, named ``minutely``.

``RLOCK_BEAT_DJANGO=1``: Django with django-celery-beat (``beat_settings``), the entry a row of
its database; else the entry is the app's ``beat_schedule``. ``python -m tests.celery.beat_app
setup-db`` migrates that database and adds the row (run once, before the beats start).
"""

from __future__ import annotations

import os
import sys

DJANGO = os.environ.get("RLOCK_BEAT_DJANGO") == "1"

if DJANGO:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery.beat_settings")
    import django

    django.setup()

from celery import Celery  # noqa: E402

app = Celery("beattests", broker=os.environ["RLOCK_BEAT_BROKER"])
if os.environ.get("RLOCK_BEAT_HOUR"):  # a crontab: every minute of that hour, in the app's tz
    from celery.schedules import crontab

    schedule = {"minutely": {"task": "beat.tick", "schedule": crontab(
        minute="*", hour=int(os.environ["RLOCK_BEAT_HOUR"]))}}
else:
    schedule = {} if DJANGO else {"every-second": {"task": "beat.tick", "schedule": 1.0}}
app.conf.update(
    timezone=os.environ.get("RLOCK_BEAT_TZ", "UTC"),
    beat_schedule=schedule,
    result_expires=None,  # no celery.backend_cleanup entry: the one entry is the test's
    broker_connection_retry_on_startup=True,
)
if not DJANGO:
    # With Django, the RLOCK settings give the watchdog timeout and the Redis (the cache).
    app.conf.rlock_beat_watchdog_timeout = float(os.environ["RLOCK_BEAT_WATCHDOG"])


def setup_db() -> None:
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0)
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.update_or_create(name="every-second",
                                          defaults={"task": "beat.tick", "interval": every})


if __name__ == "__main__" and sys.argv[1:] == ["setup-db"]:
    setup_db()
