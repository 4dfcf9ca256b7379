"""@locked tasks on a prefork worker started as a subprocess (-c 2): crashes, terminate, redelivery."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.celery.conftest import WATCHDOG, assert_no_overlap, entries, start_prefork, wait_for


def test_duplicates_across_prefork_children_never_overlap(prefork_worker, locks, log):
    from tests.celery.tasks import critical

    results = [critical.apply_async(("p", 0.05), queue="prefork") for _ in range(20)]
    assert [res.get(timeout=60) for res in results] == ["ran"] * 20
    intervals = entries(log, "interval", "p")
    assert len({i[3] for i in intervals}) == 2  # both children took part: distinct owners
    assert_no_overlap(intervals)


def test_sigkilled_child_frees_the_lock_within_the_watchdog_timeout(prefork_worker, locks, log):
    from tests.celery.tasks import long_task

    long_task.apply_async(("k", 30), queue="prefork")
    (_, pid) = wait_for(lambda: entries(log, "start", "k"))[0]
    assert locks.exists("ct:rlock:long:k")
    time.sleep(2 * WATCHDOG)  # it is being renewed past its lease
    assert locks.exists("ct:rlock:long:k")
    os.kill(int(pid), signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: not locks.exists("ct:rlock:long:k"), timeout=10, step=0.02)
    assert time.monotonic() - killed <= WATCHDOG + 0.3
    again = long_task.apply_async(("k", 0.1), queue="prefork")  # the same task can run again
    assert again.get(timeout=30) == "done"


def test_revoke_with_terminate_releases_the_lock_at_once(prefork_worker, locks, log, celery_app):
    from tests.celery.tasks import leased_long

    # A 120 s lease and no watchdog: only a real release frees it quickly.
    result = leased_long.apply_async(("t", 60), queue="prefork")
    wait_for(lambda: entries(log, "start", "t"))
    assert locks.pttl("ct:rlock:leased:t") > 100_000
    celery_app.control.revoke(result.id, terminate=True)
    wait_for(lambda: not locks.exists("ct:rlock:leased:t"), timeout=5, step=0.02)
    again = leased_long.apply_async(("t", 0.1), queue="prefork")
    assert again.get(timeout=30) == "done"


def test_revoking_a_queued_deduped_task_frees_its_mark(prefork_worker, locks, log, celery_app):
    from tests.celery.tasks import deduped

    blocker = deduped.apply_async((20,), {"hold": 3.0}, queue="prefork")
    blocker2 = deduped.apply_async((21,), {"hold": 3.0}, queue="prefork")
    wait_for(lambda: entries(log, "dd", "20") and entries(log, "dd", "21"))
    queued = deduped.apply_async((22,), {"hold": 0}, queue="prefork")  # both children busy
    assert len(list(locks.scan_iter("ct:rlock:dedupe:*"))) == 3
    celery_app.control.revoke(queued.id)
    assert blocker.get(timeout=30) == 22 and blocker2.get(timeout=30) == 23
    wait_for(lambda: not list(locks.scan_iter("ct:rlock:dedupe:*")), timeout=10)
    assert entries(log, "dd", "22") == []  # it never ran


def test_redelivered_message_does_not_run_beside_its_first_delivery(celery_env, locks, log,
                                                                    tmp_path):
    """acks_late with a visibility timeout shorter than the task: the broker hands the same
    message to the other child while the first still runs (celery-singleton #38)."""
    from tests.celery.tasks import redelivered

    worker = start_prefork(celery_env, tmp_path, "redeliver", RLOCK_TEST_VISIBILITY="2")
    try:
        result = redelivered.apply_async(("r", 7.0), queue="redeliver")
        assert result.get(timeout=60) == "done"
        wait_for(lambda: "dropped this copy: its first delivery still runs" in worker.logfile.read_text(),
                 timeout=20)
        intervals = entries(log, "interval", "r")
        assert len(intervals) == 1  # the redelivered copy never ran its body
    finally:
        worker.stop()


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_other_pools(celery_env, locks, log, tmp_path, pool):
    import subprocess
    import sys

    from tests.celery.conftest import ROOT
    from tests.celery.tasks import critical

    env = {**os.environ, **celery_env, "DJANGO_SETTINGS_MODULE": "tests.celery.settings"}
    logfile = tmp_path / f"{pool}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.celery.app", "worker", "-P", pool, "-c", "3",
         "-Q", pool, "-n", f"{pool}@%h", "-l", "info", "--without-mingle", "--without-gossip",
         "--without-heartbeat"], cwd=ROOT, env=env, stdout=logfile.open("w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "ready." in logfile.read_text(), 60)
        results = [critical.apply_async((pool, 0.02), queue=pool) for _ in range(8)]
        assert [r.get(timeout=60) for r in results] == ["ran"] * 8
        assert_no_overlap(entries(log, "interval", pool))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
