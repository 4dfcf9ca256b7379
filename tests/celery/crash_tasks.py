"""Tasks for test_redelivery.py and test_dedupe_calls.py (the audit's Celery glue defects)."""

from __future__ import annotations

import os
import time

from django_rlock import locked
from django_rlock.celery import LockedTask
from tests.celery.app import app
from tests.celery.tasks import record


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
@locked("crash:{key}")
def crashy(self, key: str, seconds: float) -> str:
    """Killed mid-run by the test; its redelivered copy must run once the dead lock expires."""
    again = (self.request.delivery_info or {}).get("redelivered")
    record("start", key, self.request.id, os.getpid(), again, time.time())
    time.sleep(0.1 if again or self.request.retries else seconds)  # copies are quick
    record("end", key, self.request.id, os.getpid(), time.time())
    return "done"


def _retry_soon(busy: Exception, task: object, *args: object, **kwargs: object) -> object:
    """on_busy: retry after 0.5 s (not the holder's whole lease), whoever holds the lock."""
    raise task.retry(countdown=0.5, exc=busy)  # type: ignore[attr-defined]


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=100)
@locked("crash:{key}", on_busy=_retry_soon)
def crashy_retry(self, key: str, seconds: float) -> str:
    again = (self.request.delivery_info or {}).get("redelivered")
    record("start", key, self.request.id, os.getpid(), again, time.time())
    time.sleep(0.1 if again or self.request.retries else seconds)  # copies are quick
    record("end", key, self.request.id, os.getpid(), time.time())
    return "done"


@app.task(bind=True, base=LockedTask)
@locked("blk:{a}", dedupe=True)
def block(self, a: int, hold: float = 0.0) -> int:
    record("block", str(a), self.request.id, time.time())
    time.sleep(hold)
    return a


@app.task
def after(value: int) -> int:
    record("after", str(value), time.time())
    return value + 1


@app.task
def collect(values: list[int]) -> int:
    record("chord", ",".join(str(v) for v in values), time.time())
    return sum(values)


@app.task(base=LockedTask, dedupe_ttl=2.0)
@locked("exp:{a}", dedupe=True)
def short_mark(a: int, when: object = None) -> int:
    record("short", str(a), time.time())
    return a


@app.task(bind=True, base=LockedTask, dedupe_ttl=1.0, max_retries=1)
@locked("rtc:{a}", dedupe=True)
def retry_later(self, a: int) -> int:
    record("rtc", str(a), self.request.id, self.request.retries, time.time())
    if not self.request.retries:
        raise self.retry(countdown=3)
    return a
