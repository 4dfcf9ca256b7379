"""A @locked task whose lock Redis is down retries on the task's own policy (#23 section 4),
on the in-process threads worker; the broker stays up (another server)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from tests.celery.conftest import WATCHDOG, entries, wait_for

pytestmark = pytest.mark.usefixtures("threads_worker")


@pytest.fixture
def lock_server_down(own_server: Any, lock_settings: None) -> Iterator[Any]:
    """The locks' cache on a server of the test's own, stopped (the broker is the suite's)."""
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                          "LOCATION": f"unix://{own_server.socket}?db=5", "KEY_PREFIX": "ct"}}
    with override_settings(CACHES=caches, RLOCK={"WATCHDOG_TIMEOUT": WATCHDOG}):
        own_server.stop()
        yield own_server


def test_task_retries_while_the_lock_backend_is_down_then_runs(lock_server_down, log):
    from tests.celery.answer_tasks import down_task

    result = down_task.delay("a")
    wait_for(lambda: result.state == "RETRY", timeout=30)
    time.sleep(1.0)  # a few retries at 0.2 s, none of them ran the body
    assert entries(log, "ran", "a") == []
    assert result.state in ("RETRY", "PENDING", "STARTED")  # between retries: neither done
    lock_server_down.start()
    retries = result.get(timeout=30)
    assert retries >= 2  # retried (not failed) while Redis was down
    assert [int(e[0]) for e in entries(log, "ran", "a")] == [retries]  # the body ran once


def test_past_max_retries_the_task_fails_with_the_connection_error(lock_server_down):
    from tests.celery.answer_tasks import down_task_gives_up

    result = down_task_gives_up.delay("b")
    with pytest.raises(redis.ConnectionError):
        result.get(timeout=30)


def test_dedupe_task_is_enqueued_without_a_mark_and_retries(lock_server_down, log):
    from tests.celery.answer_tasks import down_dedupe

    result = down_dedupe.delay("c")  # no mark can be written: enqueued anyway
    wait_for(lambda: result.state == "RETRY", timeout=30)
    lock_server_down.start()
    assert result.get(timeout=30) >= 1
    assert len(entries(log, "ran", "c")) == 1


def test_dedupe_without_the_locked_task_base_fails_manage_py_check(celery_app, lock_settings):
    from django.core import checks

    from django_rlock import locked

    @celery_app.task(bind=True, name="tests.bad_dedupe")
    @locked("bad:{key}", dedupe=True)
    def bad_dedupe(self: Any, key: str) -> None: ...

    try:
        errors = [m for m in checks.run_checks() if m.id == "django_rlock.E006"]
        assert [m.obj for m in errors] == ["tests.bad_dedupe"]
        assert "LockedTask" in errors[0].hint
    finally:
        celery_app.tasks.unregister("tests.bad_dedupe")
    assert not [m for m in checks.run_checks() if m.id == "django_rlock.E006"]


def test_on_busy_retry_counts_down_the_hold_estimate_not_the_holders_lease(locks, log):
    from django_rlock import get_lock
    from tests.celery.tasks import retrier

    assert retrier.delay("est").get(timeout=30) == 0  # one quick run: the estimate is ~0 s
    lock = get_lock("retry:est")
    assert lock.try_lock(lease_time=30)  # a holder whose lease says 30 s
    started = time.monotonic()
    result = retrier.delay("est")
    wait_for(lambda: result.state == "RETRY", timeout=30)
    lock.unlock()  # done after ~1 s, as its template's holds usually are
    assert result.get(timeout=20) >= 1
    # Retried after the estimate (1 s, rounded up), not after the 30 s lease.
    assert time.monotonic() - started < 20
