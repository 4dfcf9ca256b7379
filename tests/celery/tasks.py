"""Tasks for the Celery tests. Each records what it did in Redis (the test server's db 0)."""

from __future__ import annotations

import os
import time

import redis

from django_rlock import locked
from django_rlock.celery import LockedTask
from tests.celery.app import app

_log = redis.Redis.from_url(os.environ["RLOCK_TEST_LOG"])


def record(kind: str, key: str, *values: object) -> None:
    _log.rpush(f"log:{kind}:{key}", ",".join(str(v) for v in values))


@app.task(bind=True)
@locked("crit:{key}", on_busy="wait", wait=120)
def critical(self, key: str, hold: float = 0.05) -> str:
    start = time.time()
    time.sleep(hold)
    record("interval", key, start, time.time(), self.request.id, os.getpid())
    return "ran"


@app.task(bind=True)
@locked("skip:{key}")
def skipper(self, key: str, hold: float = 1.0) -> str:
    record("start", key, self.request.id, os.getpid())
    time.sleep(hold)
    return "ran"


@app.task(bind=True, max_retries=20)
@locked("retry:{key}", on_busy="retry")
def retrier(self, key: str) -> int:
    record("ran", key, self.request.retries)
    return self.request.retries


@app.task(bind=True)
@locked("long:{key}")
def long_task(self, key: str, seconds: float) -> str:
    record("start", key, self.request.id, os.getpid())
    time.sleep(seconds)
    record("end", key, self.request.id)
    return "done"


@app.task(bind=True)
@locked("leased:{key}", lease=120)
def leased_long(self, key: str, seconds: float) -> str:
    record("start", key, self.request.id, os.getpid())
    time.sleep(seconds)
    return "done"


@app.task(bind=True, base=LockedTask)
@locked("dd:{a}", dedupe=True)
def deduped(self, a: int, b: int = 2, hold: float = 1.0, fail: bool = False) -> int:
    record("dd", str(a), self.request.id)
    time.sleep(hold)
    if fail:
        raise ValueError("failed on purpose")
    return a + b


@app.task(bind=True, acks_late=True)
@locked("redeliver:{key}")
def redelivered(self, key: str, seconds: float) -> str:
    start = time.time()
    record("start", key, self.request.id, os.getpid(),
           (self.request.delivery_info or {}).get("redelivered"))
    time.sleep(seconds)
    record("interval", key, start, time.time(), self.request.id, os.getpid())
    return "done"


@app.task(bind=True)
@locked("crit:{key}", on_busy="wait", wait=0.5)
def brief_wait(self, key: str) -> str:
    return "ran"


@app.task(bind=True, base=LockedTask, max_retries=3)
@locked("ddr:{a}", dedupe=True)
def deduped_retry(self, a: int) -> int:
    record("ddr", str(a), self.request.id, self.request.retries)
    if self.request.retries < 2:
        raise self.retry(countdown=0.5)
    return self.request.retries


@app.task(bind=True, base=LockedTask, dedupe_ttl=1.0)
@locked("dds:{a}", dedupe=True)
def deduped_short(self, a: int) -> int:
    return a


# -- issue #9: @limited and @locked(kind=...) tasks -------------------------------------------
from django_rlock.limits import limited  # noqa: E402

_PEAK = """
local n = redis.call('incr', KEYS[1])
if n > tonumber(redis.call('get', KEYS[2]) or '0') then redis.call('set', KEYS[2], n) end
return n
"""


def _enter_limited(key: str) -> int:
    """Count this run in: ``lim:now:<key>`` runs now, ``lim:peak:<key>`` the most at once."""
    return int(_log.eval(_PEAK, 2, f"lim:now:{key}", f"lim:peak:{key}"))


def _until(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@app.task(bind=True)
@limited("limw:{key}", permits=2, on_busy="wait", wait=120)
def limited_wait(self, key: str, hold: float = 0.3) -> int:
    n = _enter_limited(key)
    record("ran", key, self.request.id, n)
    # Hold on until a second run is inside (or briefly): runs overlap whenever they can.
    _until(lambda: int(_log.get(f"lim:peak:{key}") or 0) >= 2, hold)
    time.sleep(0.05)
    _log.decr(f"lim:now:{key}")
    return n


@app.task(bind=True)
@limited("lims:{key}", permits=2)
def limited_skip(self, key: str) -> str:
    _enter_limited(key)
    try:
        _until(lambda: _log.exists(f"lim:go:{key}"), 30)  # the test opens the gate
    finally:
        _log.decr(f"lim:now:{key}")
    return "ran"


@app.task(bind=True, max_retries=20)
@limited("limr:{key}", permits=1, on_busy="retry")
def limited_retry(self, key: str) -> int:
    record("ran", key, self.request.retries)
    return self.request.retries


@app.task(bind=True)
@locked("fenced:{key}", kind="fenced")
def fenced_task(self, key: str, fence_token: int | None = None) -> int | None:
    return fence_token
