"""A redelivered message whose first delivery's worker died runs (audit 5, item 1).

acks_late + reject_on_worker_lost: the SIGKILLed child's message is requeued at once and the
other child gets it while the dead child's lock still lives (up to the watchdog timeout). The
copy must wait for that lock to expire and run, not be dropped as the copy of a live first
delivery (that case: test_prefork.test_redelivered_message_does_not_run_beside_its_first_delivery).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from django_rlock.redelivery import record_key
from tests.celery.conftest import entries, start_prefork, wait_for

DEAD_LEASE = 10.0


@pytest.fixture(scope="module")
def crash_worker(celery_env, celery_app, tmp_path_factory):
    # A 10 s watchdog: the requeued copy arrives while the dead child's lock still lives (a
    # worker was seen to notice its lost child 3-5 s late).
    worker = start_prefork(celery_env, tmp_path_factory.mktemp("crash"), "crash",
                           RLOCK_TEST_WATCHDOG=str(DEAD_LEASE))
    yield worker
    worker.stop()


def test_copy_of_a_killed_first_delivery_runs_once_its_lock_expires(crash_worker, locks, log):
    from tests.celery.crash_tasks import crashy

    result = crashy.apply_async(("a", 60), queue="crash")
    first = wait_for(lambda: entries(log, "start", "a"))[0]
    os.kill(crash_worker.proc.pid, signal.SIGSTOP)  # (the main process notices the death
    try:                                              # at once when it goes on)
        os.kill(int(first[1]), signal.SIGKILL)
        killed = time.time()
        # The dead child's lock lives a whole lease from now (as if renewed just before).
        assert locks.pexpire("ct:rlock:crash:a", int(DEAD_LEASE * 1000))
    finally:
        os.kill(crash_worker.proc.pid, signal.SIGCONT)
    assert result.get(timeout=30) == "done"
    starts = entries(log, "start", "a")
    assert len(starts) == 2 and starts[1][2] == "True"  # the copy, redelivered
    assert float(starts[1][3]) >= killed + DEAD_LEASE - 0.1  # after the dead lock expired
    ends = entries(log, "end", "a")
    assert len(ends) == 1 and ends[0][1] != first[1]  # run once, by the other child
    text = crash_worker.logfile.read_text()
    assert "running it now: its first delivery's worker died: its lock expired" in text
    # The dead delivery's booking is cleared; the copy's run is marked done (before its release).
    assert locks.hvals(record_key("ct:rlock:", "crash:a")) == [f"{result.id} done".encode()]


@pytest.mark.parametrize("key, why", [
    ("b", "its first delivery's worker died and its lock expired; another call holds the "
          "lock now"),
    # As if its first delivery never started (prefetched by a worker that died): no booking.
    ("c", "its first delivery never held the lock (it never started): another call holds it"),
])
def test_copy_finding_another_holder_answers_on_busy(crash_worker, locks, log, lock_settings,
                                                     key, why):
    """The first delivery dies, then another call takes the lock: the copy retries (its
    on_busy) and runs after that holder, not dropped."""
    from django_rlock import get_lock
    from tests.celery.crash_tasks import crashy_retry

    result = crashy_retry.apply_async((key, 60), queue="crash")
    first = wait_for(lambda: entries(log, "start", key))[0]
    # Freeze the worker's main process so the requeued copy arrives only after the web call
    # below holds the lock (as if the dead child's lock had expired and it got it then).
    os.kill(crash_worker.proc.pid, signal.SIGSTOP)
    try:
        os.kill(int(first[1]), signal.SIGKILL)
        locks.delete(f"ct:rlock:crash:{key}")  # the dead child's lock, expired
        if key == "c":
            locks.delete(record_key("ct:rlock:", f"crash:{key}"))
        web = get_lock(f"crash:{key}")
        assert web.try_lock(0, 60)  # (a lost child may be noticed seconds late)
    finally:
        os.kill(crash_worker.proc.pid, signal.SIGCONT)
    try:
        line = (f"crash_tasks.crashy_retry[{result.id}] redelivered, lock 'crash:{key}' busy: "
                f"answered as a busy call (on_busy): {why}")
        wait_for(lambda: line in crash_worker.logfile.read_text(), timeout=20)
        assert entries(log, "end", key) == []
    finally:
        web.unlock()
    freed = time.time()
    assert result.get(timeout=60) == "done"
    ends = entries(log, "end", key)
    assert len(ends) == 1 and float(ends[0][2]) >= freed


# -- the verdict itself (redelivery.decide), on locks held in this process --------------------
def _held(r, name: str):
    from django_rlock.engine.lock import RLock

    lock = RLock(r, name, watchdog_timeout=3.0)
    assert lock.try_lock()
    return lock


def test_a_finished_first_delivery_is_never_taken_for_a_dead_one(r):
    """Its run was marked done before its release: whether the copy then finds the lock
    still held (releasing), gone, or taken by another call, the copy is dropped, not run."""
    from django_rlock import redelivery
    from django_rlock.engine.identity import thread_owner

    booking = redelivery.Run(r, "rd:", "job", "t-1")
    booking.begin()
    booking.end()
    assert redelivery.decide(r, "rd:", "job", "rd:job", "t-1", 3.0).action == redelivery.DROP
    other = _held(r, "rd:job")  # another call (this thread) holds it now
    try:
        verdict = redelivery.decide(r, "rd:", "job", "rd:job", "t-1", 3.0)
        assert verdict.action == redelivery.DROP, verdict
    finally:
        other.unlock()
    # Booked, not done, and its lock gone at its deadline: a dead first delivery (run).
    r.hset(redelivery.record_key("rd:", "job"), thread_owner(), "t-2")
    verdict = redelivery.decide(r, "rd:", "job", "rd:job", "t-2", 3.0)
    assert verdict.action == redelivery.RUN, verdict


def test_read_write_locks_and_fixed_leases_are_not_watched(r):
    """A write lock's field is ``<owner>:write`` and a fixed lease runs out beside a live
    holder: the copy is dropped as before, never judged by a watch that would misread it."""
    from types import SimpleNamespace

    from django_rlock.celery import watchable
    from django_rlock.engine.lock import RLock
    from django_rlock.engine.rwlock import ReadWriteLock

    renewed, leased = SimpleNamespace(lease=None), SimpleNamespace(lease=60.0)
    rw = ReadWriteLock(r, "n")
    assert watchable(renewed, RLock(r, "n"))
    assert not watchable(renewed, rw.write_lock()) and not watchable(renewed, rw.read_lock())
    assert not watchable(leased, RLock(r, "n"))


def test_the_run_record_is_never_a_locks_key_and_is_not_listed():
    """A lock named ``taskrun:<name>`` must not share its key with ``<name>``'s run record,
    and listings skip the record as an auxiliary key."""
    from django_rlock.engine.listing import is_auxiliary

    assert record_key("p:", "job") != "p:taskrun:job"
    assert is_auxiliary(record_key("p:", "job")) and not is_auxiliary("p:taskrun:job")
