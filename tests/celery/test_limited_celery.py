"""@limited and @locked(kind=...) Celery tasks on the in-process threads worker (4 threads)."""

from __future__ import annotations

import time

import pytest

from tests.celery.conftest import entries, wait_for

pytestmark = pytest.mark.usefixtures("threads_worker")

def test_permits_two_four_concurrent_calls_at_most_two_run_at_once(locks, log):
    from tests.celery.tasks import limited_wait

    results = [limited_wait.delay("a", 5.0) for _ in range(4)]
    assert sorted(r.get(timeout=60) for r in results)[-1] == 2
    assert len(entries(log, "ran", "a")) == 4  # the two that found no permit waited, then ran
    assert int(log.get("lim:peak:a")) == 2  # never three at once, and two did overlap
    assert int(log.get("lim:now:a")) == 0
    assert int(locks.get("ct:rlock:limw:a")) == 2  # both permits came back
    assert locks.zcard("{ct:rlock:limw:a}:timeout") == 0


def test_busy_tasks_skip_by_default(locks, log, caplog):
    from tests.celery.tasks import limited_skip

    results = [limited_skip.delay("s") for _ in range(4)]
    # Two hold a permit behind the gate; the other two find none and skip at once.
    wait_for(lambda: sum(r.ready() for r in results) == 2, timeout=30)
    assert [r.get(timeout=1) for r in results if r.ready()] == [None, None]
    assert int(log.get("lim:now:s")) == 2
    log.set("lim:go:s", 1)
    assert sorted(map(str, (r.get(timeout=30) for r in results))) == ["None", "None", "ran", "ran"]
    assert int(log.get("lim:peak:s")) == 2
    assert int(locks.get("ct:rlock:lims:s")) == 2


def test_retry_until_a_permit_is_free(locks, log):
    from django_rlock.factory import get_semaphore
    from tests.celery.tasks import limited_retry

    sem = get_semaphore("limr:r", permits=1)
    assert sem.try_acquire(lease_time=1.5) is not None  # the only permit, for 1.5 s
    result = limited_retry.delay("r")
    time.sleep(0.5)
    assert entries(log, "ran", "r") == []  # busy: retried after the permit's expiry (2 s)
    assert result.get(timeout=30) >= 1
    assert len(entries(log, "ran", "r")) == 1
    assert sem.available_permits() == 1  # the expired permit was reclaimed, the task's returned


def test_fenced_task_receives_growing_tokens(locks):
    from tests.celery.tasks import fenced_task

    tokens = [fenced_task.delay("f").get(timeout=30) for _ in range(3)]
    assert None not in tokens and tokens[0] < tokens[1] < tokens[2]  # from the clock, not 1, 2, 3
    assert locks.get("redisson_lock_token:{ct:rlock:fenced:f}") == str(tokens[2]).encode()
    assert not locks.exists("ct:rlock:fenced:f")


def test_limited_under_the_task_decorator_is_refused():
    from django_rlock.limits import limited
    from tests.celery.tasks import limited_skip

    with pytest.raises(TypeError, match=r"@limited was applied to the Celery task .*"
                                        r"put the task decorator outermost"):
        limited("x", permits=1)(limited_skip)
