"""The E006 check in a standard Django + Celery layout (tests/celery/stdproj).

There ``app.autodiscover_tasks()`` is the only way to the task modules, and Celery's Django
fixup runs the system checks from inside the ``import_modules`` signal that imports them. The
check used to send that signal again, recursing until RecursionError: ``manage.py check``
missed E006 (W003 instead) and a worker could end with no registered task at all (where the
RecursionError lands decides that, so the tests also count the check runs: the project's own
check, stdshop/apps.py, writes a line per run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.celery.conftest import wait_for

ROOT = Path(__file__).parents[2]
PROJECT = Path(__file__).parent / "stdproj"
TASKS = {"stdshop.tasks.add", "stdshop.tasks.send_invoice", "stdshop.tasks.export",
         "stdshop.tasks.nobase"}


@pytest.fixture(scope="module")
def std_env(redis_server: Any) -> dict[str, str]:
    """The project's own databases (12 broker, 13 results, 14 cache): no other test's queue."""
    socket = redis_server.socket
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CELERY_"))}
    return {**env, "DJANGO_SETTINGS_MODULE": "stdsite.settings", "PYTHONPATH": str(ROOT),
            "STDPROJ_BROKER": f"redis+socket://{socket}?virtual_host=12",
            "STDPROJ_BACKEND": f"redis+socket://{socket}?virtual_host=13",
            "STDPROJ_CACHE": f"unix://{socket}?db=14"}


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_manage_py_check_reports_e006_for_an_autodiscovered_task(std_env: dict[str, str],
                                                                  tmp_path: Path):
    counted = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=PROJECT,
                          env={**std_env, "STDPROJ_CHECK_RUNS": str(counted)},
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # an Error: SystemCheckError
    assert "stdshop.tasks.nobase: (django_rlock.E006)" in out, out
    assert out.count("django_rlock.E006") == 1, out  # export has its LockedTask base
    assert "W003" not in out and "RecursionError" not in out, out
    # manage.py's run, and the one Celery's fixup runs inside the import E006 makes: no more.
    assert runs(counted) == 2


@pytest.fixture(scope="module")
def std_worker(std_env: dict[str, str], redis_server: Any,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    for db in (12, 13, 14):
        flushed = redis_server.client(db=db)
        flushed.flushdb()
        flushed.close()
    tmp = tmp_path_factory.mktemp("stdproj")
    logfile = tmp / "worker.log"
    with logfile.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "stdsite", "worker", "-P", "solo", "-l",
             "info", "--without-mingle", "--without-gossip", "--without-heartbeat"],
            cwd=PROJECT, env={**std_env, "STDPROJ_CHECK_RUNS": str(tmp / "runs")},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "ready." in logfile.read_text() or proc.poll() is not None, 60)
        assert proc.poll() is None, logfile.read_text()
        yield logfile
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def client(std_env: dict[str, str]) -> Iterator[Any]:
    """A producer of the test's own: no fixup, never the current app of this process."""
    from celery import Celery

    app = Celery("stdclient", broker=std_env["STDPROJ_BROKER"],
                 backend=std_env["STDPROJ_BACKEND"], fixups=[], set_as_current=False)
    yield app
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.stop()
    app.close()


def test_a_worker_registers_and_runs_every_autodiscovered_task(std_worker: Path, client: Any):
    banner = std_worker.read_text()
    listed = {line.strip(" .") for line in banner.splitlines() if "stdshop.tasks." in line}
    assert listed >= TASKS, banner
    assert "RecursionError" not in banner, banner
    assert runs(std_worker.parent / "runs") == 1  # the fixup's run, which imports nothing
    assert client.send_task("stdshop.tasks.add", (2, 3)).get(timeout=30) == 5
    assert client.send_task("stdshop.tasks.send_invoice", (7,)).get(timeout=30) == "sent 7"
    assert client.send_task("stdshop.tasks.export", (9,)).get(timeout=30) == "export 9"
    assert "unregistered" not in std_worker.read_text()
