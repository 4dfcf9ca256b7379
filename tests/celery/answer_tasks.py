"""Tasks of tests/celery/test_unavailable.py: what a task does while its lock's Redis is down."""

from __future__ import annotations

from django_rlock import locked
from django_rlock.celery import LockedTask
from tests.celery.app import app
from tests.celery.tasks import record


@app.task(bind=True, max_retries=50, default_retry_delay=0.2)
@locked("down:{key}")
def down_task(self, key: str) -> int:
    record("ran", key, self.request.retries)
    return self.request.retries


@app.task(bind=True, max_retries=1, default_retry_delay=0.1)
@locked("down-once:{key}")
def down_task_gives_up(self, key: str) -> int:
    return self.request.retries


@app.task(bind=True, base=LockedTask, max_retries=50, default_retry_delay=0.2)
@locked("down-dedupe:{key}", dedupe=True)
def down_dedupe(self, key: str) -> int:
    record("ran", key, self.request.retries)
    return self.request.retries
