"""``@locked(hold_at_least=...)`` on Celery workers whose clocks disagree (issue #21, section 3).

Two worker processes (solo pool), one with ``time.time()`` 3 s ahead, run a 10 ms task under
``hold_at_least=5`` sent every 0.5 s for 20 s: it must run once per 5 s window, judged by
the server's clock, whatever each worker's own clock says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.celery.conftest import ROOT, wait_for


def start_worker(env: dict[str, str], logfile: Path, skew: float, name: str) -> Any:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.celery.skewed_app", "worker", "-P", "solo",
         "-Q", "windows", "-n", f"{name}@%h", "-l", "warning", "--without-mingle",
         "--without-gossip", "--without-heartbeat"],
        cwd=ROOT, env={**env, "RLOCK_TEST_CLOCK_SKEW": str(skew)}, stdout=logfile.open("w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    return proc


@pytest.fixture(scope="module")
def skewed_workers(celery_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Any:
    env = {**os.environ, **celery_env, "DJANGO_SETTINGS_MODULE": "tests.celery.settings"}
    tmp_path = tmp_path_factory.mktemp("windows")
    procs = [start_worker(env, tmp_path / "w0.log", 0.0, "w0"),
             start_worker(env, tmp_path / "w3.log", 3.0, "w3")]
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 15)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()


def test_hold_at_least_runs_once_per_window_on_workers_with_skewed_clocks(
        celery_app, skewed_workers, locks, log):
    # Both workers up: each answers a ping (they consume the same queue).
    wait_for(lambda: len(celery_app.control.ping(timeout=0.5) or []) >= 2, timeout=60, step=0.2)
    sent = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20.0:
        celery_app.send_task("tests.window", ("k",), queue="windows")
        sent += 1
        time.sleep(0.5)
    time.sleep(1.0)  # the last ones run (and are turned away)
    runs = [e.decode().split(",") for e in log.lrange("log:window:k", 0, -1)]
    server = [float(r[0]) for r in runs]
    gaps = [b - a for a, b in zip(server, server[1:], strict=False)]
    pids = {r[2] for r in runs}
    skews = sorted({round(float(r[1]) - float(r[0])) for r in runs})
    print(f"{sent} sent, {len(runs)} ran, gaps {[round(g, 3) for g in gaps]} s (server "
          f"clock), worker clock - server clock {skews} s, {len(pids)} worker(s)")
    assert 4 <= len(runs) <= 5
    # Once per window: never two runs within 5 s of each other, and the next one as soon as
    # the window is over (a task comes every 0.5 s).
    assert all(5.0 <= g <= 6.5 for g in gaps), gaps


def test_a_deduped_task_s_mark_goes_but_its_window_stays(celery_app, skewed_workers, locks, log):
    """``dedupe=True`` with ``hold_at_least``: the mark is released when the run ends (an
    identical task may be enqueued again), the lock stays for the window (that task is
    turned away: skipped)."""
    from tests.celery.window_tasks import windowed_dedupe

    wait_for(lambda: len(celery_app.control.ping(timeout=0.5) or []) >= 2, timeout=60, step=0.2)
    send = windowed_dedupe.apply_async  # LockedTask's: the mark is taken when enqueueing
    assert send(("a",), queue="windows").get(timeout=30) == "ran"
    assert not [k for k in locks.keys("ct:rlock:dedupe:*")]  # the mark is gone
    assert 0 < locks.pttl("ct:rlock:wdd:a") <= 3000  # the window is not
    again = send(("a",), queue="windows")
    assert again.get(timeout=30) is None  # enqueued (no mark), run, turned away by the lock
    assert log.llen("log:wdd:a") == 1
