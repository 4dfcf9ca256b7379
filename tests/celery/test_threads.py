"""@locked Celery tasks on a real in-process worker (threads pool) with a Redis broker."""

from __future__ import annotations

import os
import time

import pytest

from django_rlock import locked
from tests.celery.conftest import assert_no_overlap, entries, wait_for

pytestmark = pytest.mark.usefixtures("threads_worker")


def test_twenty_duplicates_never_overlap(locks, log):
    from tests.celery.tasks import critical

    results = [critical.delay("a", 0.05) for _ in range(20)]
    assert [res.get(timeout=60) for res in results] == ["ran"] * 20
    intervals = entries(log, "interval", "a")
    assert len(intervals) == 20
    assert_no_overlap(intervals)
    assert not locks.exists("ct:rlock:crit:a")


def test_skip_is_the_default_for_tasks(locks, log, caplog):
    from tests.celery.tasks import skipper

    first = skipper.delay("s", 1.5)
    wait_for(lambda: entries(log, "start", "s"))
    caplog.set_level("INFO", logger="django_rlock")
    assert skipper.delay("s", 0).get(timeout=20) is None  # busy: skipped, returns None
    assert first.get(timeout=20) == "ran"
    assert len(entries(log, "start", "s")) == 1
    # The log line says who holds it: this process (the in-process worker), and its thread.
    assert any("skip:s" in rec.getMessage() and "held by" in rec.getMessage()
               and f"pid {os.getpid()}" in rec.getMessage() and "thread " in rec.getMessage()
               for rec in caplog.records)
    assert skipper.delay("s", 0).get(timeout=20) == "ran"  # free again: runs


def test_retry_until_the_lock_is_free(locks, log):
    from django_rlock import get_lock
    from tests.celery.tasks import retrier
    from tests.conftest import Holder

    lock = get_lock("retry:r")
    holder = Holder()
    try:
        holder.call(lambda: lock.lock(lease_time=1.5))
        result = retrier.delay("r")
        # Busy at first: self.retry(countdown=<TTL rounded up>) reschedules it, no run is logged.
        time.sleep(0.5)
        assert entries(log, "ran", "r") == []
        assert result.get(timeout=30) >= 1  # ran on a retry, once the lease had expired
        assert len(entries(log, "ran", "r")) == 1
    finally:
        holder.close()


def test_wait_then_skip(locks, log):
    from tests.celery.tasks import brief_wait, critical

    # critical waits up to 120 s: a duplicate queued behind a running one runs after it.
    first = critical.delay("w", 1.5)
    second = critical.delay("w", 0.0)
    wait_for(lambda: locks.exists("ct:rlock:crit:w"))
    # brief_wait shares the lock but waits only 0.5 s, then skips.
    start = time.monotonic()
    assert brief_wait.delay("w").get(timeout=20) is None
    assert time.monotonic() - start >= 0.5
    assert first.get(timeout=20) == "ran" and second.get(timeout=20) == "ran"
    assert_no_overlap(entries(log, "interval", "w"))
    assert brief_wait.delay("w").get(timeout=20) == "ran"


def test_long_task_stays_locked_past_the_watchdog_timeout(locks, log):
    from tests.celery.tasks import long_task

    result = long_task.delay("l", 3.5)  # 3.5 x the 1 s watchdog timeout
    wait_for(lambda: entries(log, "start", "l"))
    for _ in range(12):
        assert locks.pttl("ct:rlock:long:l") > 0
        time.sleep(0.25)
    assert result.get(timeout=20) == "done"
    assert not locks.exists("ct:rlock:long:l")


def test_dedupe_positional_and_keyword_calls_are_one_task(locks, log):
    from tests.celery.tasks import deduped

    first = deduped.delay(1, b=2, hold=1.0)
    second = deduped.delay(a=1, b=2, hold=1.0)     # same call, bound canonically
    third = deduped.apply_async((1,), {"hold": 1.0})  # b defaults to 2: same call again
    assert second.id == first.id and third.id == first.id
    # The mark is listed (from the index) as the task it stands for (tests/celery/test_marks.py).
    from django_rlock.engine.listing import Locks

    marks = [i for i in Locks(locks, "ct:rlock:").read(Locks(locks, "ct:rlock:").names("dedupe:*"))]
    assert [(i.kind, i.details["task_id"]) for i in marks] == [("task", first.id)]
    assert marks[0].details["by"]["pid"] is not None
    other = deduped.delay(1, b=3, hold=0.1)         # different arguments: enqueued...
    assert other.id != first.id
    assert first.get(timeout=20) == 3
    assert other.get(timeout=20) is None  # ...but its execution lock dd:1 was busy: skipped
    assert [e[0] for e in entries(log, "dd", "1")].count(first.id) == 1
    # Finished: the mark is gone and the same call enqueues anew.
    again = deduped.delay(1, b=2, hold=0)
    assert again.id != first.id and again.get(timeout=20) == 3


def test_dedupe_mark_released_after_failure(locks, log):
    from tests.celery.tasks import deduped

    failing = deduped.delay(5, hold=0.2, fail=True)
    with pytest.raises(ValueError):
        failing.get(timeout=20)
    assert not [k for k in locks.scan_iter("ct:rlock:dedupe:*")]
    assert not locks.exists("ct:rlock:dd:5")  # the execution lock too
    retry = deduped.delay(5, hold=0.2, fail=True)
    assert retry.id != failing.id
    with pytest.raises(ValueError):
        retry.get(timeout=20)


def test_dedupe_mark_expires_if_no_worker_ever_starts_the_task(locks):
    from tests.celery.tasks import deduped_short

    # A queue nobody consumes stands for a worker that died before starting the task.
    lost = deduped_short.apply_async((1,), queue="nobody-listens")
    assert deduped_short.apply_async((1,), queue="nobody-listens").id == lost.id
    time.sleep(1.3)  # dedupe_ttl=1.0
    assert deduped_short.apply_async((1,), queue="nobody-listens").id != lost.id


def test_dedupe_mark_is_held_while_running_and_shows_the_task(locks, log):
    from tests.celery.tasks import deduped

    first = deduped.delay(7, hold=2.5)  # longer than the 1 s watchdog timeout
    wait_for(lambda: entries(log, "dd", "7"))
    time.sleep(1.5)
    (key,) = list(locks.scan_iter("ct:rlock:dedupe:*"))
    assert locks.hkeys(key) == [f"{first.id}:0".encode()]  # renewed while it runs
    assert deduped.delay(7, hold=2.5).id == first.id
    assert first.get(timeout=20) == 9
    assert not locks.exists(key)


def test_dedupe_retries_reuse_their_own_mark(locks, log):
    from tests.celery.tasks import deduped_retry

    first = deduped_retry.delay(3)
    wait_for(lambda: len(entries(log, "ddr", "3")) >= 1)
    assert deduped_retry.delay(3).id == first.id  # queued for its retry: still a duplicate
    assert first.get(timeout=30) == 2
    runs = entries(log, "ddr", "3")
    assert [r[0] for r in runs] == [first.id] * 3 and [r[1] for r in runs] == ["0", "1", "2"]
    assert not list(locks.scan_iter("ct:rlock:dedupe:*"))


def test_wrong_arguments_are_rejected_at_delay(locks):
    from tests.celery.tasks import deduped, skipper

    with pytest.raises(TypeError):
        skipper.delay("k", 1, 2, 3)
    with pytest.raises(TypeError):
        deduped.delay()  # a is required; nothing is marked or enqueued
    assert not list(locks.scan_iter("ct:rlock:dedupe:*"))


def test_decorator_order_is_enforced(celery_app):
    with pytest.raises(TypeError, match="outermost"):
        @locked("x:{a}")
        @celery_app.task(bind=True)
        def wrong(self, a):
            return a
