"""The Celery app of the Celery tests; its broker is the test redis-server."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery.settings")
django.setup()

from celery import Celery  # noqa: E402

app = Celery("rlocktests", broker=os.environ["RLOCK_TEST_BROKER"],
             backend=os.environ["RLOCK_TEST_BACKEND"],
             include=["tests.celery.tasks", "tests.celery.rate_tasks", "tests.celery.answer_tasks",
                      "tests.celery.crash_tasks"])
app.conf.update(
    worker_prefetch_multiplier=1,
    task_track_started=True,
    result_extended=True,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("RLOCK_TEST_VISIBILITY", "3600")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    worker_hijack_root_logger=False,
)
