"""Tasks of tests/celery/test_rate_limited_celery.py (issue #21): @rate_limited tasks."""

from __future__ import annotations

import os
import time

import redis

from django_rlock import rate_limited
from tests.celery.app import app
from tests.celery.tasks import record

_log = redis.Redis.from_url(os.environ["RLOCK_TEST_LOG"])


@app.task(bind=True, max_retries=10)
@rate_limited("rr:{key}", rate="1/2s", on_busy="retry")
def rate_retry(self, key: str) -> int:
    s, us = _log.time()
    record("ran", key, self.request.retries, s + us / 1e6)
    return self.request.retries


@app.task(bind=True)
@rate_limited("rs:{key}", rate="2/m", on_busy="skip")
def rate_skip(self, key: str) -> str:
    record("ran", key, time.time())
    return "ran"


@app.task
@rate_limited("rd:{key}", rate="1/m")
def rate_default(key: str) -> str:
    record("ran", key, time.time())
    return "ran"


@app.task(bind=True)
@rate_limited("rb:{key}", rate="10/m", permits=3)
def rate_bulk(self, key: str) -> str:
    record("ran", key, time.time())
    return "ran"
