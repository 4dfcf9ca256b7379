"""Celery fixtures: a Redis broker on the suite's redis-server, real workers.

Databases on the test server: 3 broker, 4 results, 5 the Django cache (locks), 6 the tasks'
own log. Tasks go to the "celery" queue for the in-process threads worker, and to "prefork"
for the worker started as a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_rlock.engine import records

ROOT = Path(__file__).parents[2]
WATCHDOG = 1.0  # seconds: the workers' lock watchdog timeout


def urls(socket: str) -> dict[str, str]:
    return {
        "RLOCK_TEST_BROKER": f"redis+socket://{socket}?virtual_host=3",
        "RLOCK_TEST_BACKEND": f"redis+socket://{socket}?virtual_host=4",
        "RLOCK_TEST_CACHE": f"unix://{socket}?db=5",
        "RLOCK_TEST_LOG": f"unix://{socket}?db=6",
        "RLOCK_TEST_WATCHDOG": str(WATCHDOG),
    }


@pytest.fixture(scope="session")
def celery_env(redis_server: Any) -> dict[str, str]:
    env = urls(redis_server.socket)
    os.environ.update(env)
    return env


@pytest.fixture(scope="session")
def celery_app(celery_env: dict[str, str]) -> Iterator[Any]:
    from tests.celery.app import app

    yield app
    import gc

    gc.collect()  # forget finished AsyncResults while the server can still answer
    # Stop listening for results before the server goes away (no reconnect noise at exit).
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None:
        try:
            consumer.stop()
        except Exception:
            pass
    app.close()


@pytest.fixture(scope="session")
def lock_settings(celery_env: dict[str, str]) -> Iterator[None]:
    with override_settings(
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache",
                            "LOCATION": celery_env["RLOCK_TEST_CACHE"], "KEY_PREFIX": "ct"}},
        RLOCK={"WATCHDOG_TIMEOUT": WATCHDOG},
    ):
        yield


@pytest.fixture
def locks(redis_server: Any, lock_settings: None) -> Iterator[redis.Redis]:
    """The lock database (keys are "ct:rlock:<name>"), emptied with the log before each test."""
    client = redis_server.client(db=5)
    client.flushdb()
    redis_server.client(db=6).flushdb()
    records.forget()  # an empty database: this process's record is written again
    yield client
    client.close()


@pytest.fixture
def log(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis_server.client(db=6)
    yield client
    client.close()


def entries(log: redis.Redis, kind: str, key: str) -> list[list[str]]:
    return [e.decode().split(",") for e in log.lrange(f"log:{kind}:{key}", 0, -1)]


def assert_no_overlap(intervals: list[list[str]]) -> None:
    spans = sorted((float(i[0]), float(i[1])) for i in intervals)
    for (s1, e1), (s2, e2) in zip(spans, spans[1:], strict=False):
        assert s2 >= e1, f"critical sections overlap: {s1}-{e1} and {s2}-{e2}"


def wait_for(predicate: Any, timeout: float = 20.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)


@pytest.fixture(scope="module")
def threads_worker(celery_app: Any, lock_settings: None) -> Iterator[Any]:
    """An in-process worker (threads pool) on the default queue."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(celery_app, pool="threads", concurrency=4, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=30) as worker:
        yield worker


class PreforkWorker:
    def __init__(self, env: dict[str, str], logfile: Path, queue: str) -> None:
        self.logfile = logfile
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.celery.app", "worker", "-P", "prefork",
             "-c", "2", "-Q", queue, "-n", f"{queue}@%h", "-l", "info", "--without-mingle",
             "--without-gossip", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=logfile.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        wait_for(lambda: "ready." in logfile.read_text() or self.proc.poll() is not None, 60)
        assert self.proc.poll() is None, logfile.read_text()

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_prefork(celery_env: dict[str, str], tmp: Path, queue: str,
                  **extra: str) -> PreforkWorker:
    env = {**os.environ, **celery_env, "DJANGO_SETTINGS_MODULE": "tests.celery.settings", **extra}
    return PreforkWorker(env, tmp / f"{queue}.log", queue)


@pytest.fixture(scope="module")
def prefork_worker(celery_env: dict[str, str], celery_app: Any,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[PreforkWorker]:
    worker = start_prefork(celery_env, tmp_path_factory.mktemp("prefork"), "prefork")
    yield worker
    worker.stop()
