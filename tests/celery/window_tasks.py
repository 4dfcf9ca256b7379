"""The ``hold_at_least`` task of tests/celery/test_windows.py: 10 ms of work, at most once per
5 s window on any worker. Each run records the server's time (TIME) and its worker's skewed
``time.time()`` and pid."""

from __future__ import annotations

import os
import time

import redis

from django_rlock import locked
from django_rlock.celery import LockedTask
from tests.celery.app import app

_log = redis.Redis.from_url(os.environ["RLOCK_TEST_LOG"])


@app.task(bind=True, name="tests.window")
@locked("window:{key}", hold_at_least=5)
def windowed(self, key: str) -> str:
    seconds, micros = _log.time()
    time.sleep(0.01)
    _log.rpush(f"log:window:{key}", f"{seconds + micros / 1e6},{time.time()},{os.getpid()}")
    return "ran"


@app.task(bind=True, base=LockedTask, name="tests.window_dedupe")
@locked("wdd:{key}", dedupe=True, hold_at_least=3)
def windowed_dedupe(self, key: str) -> str:
    seconds, micros = _log.time()
    _log.rpush(f"log:wdd:{key}", f"{seconds + micros / 1e6}")
    return "ran"
