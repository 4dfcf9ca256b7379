"""The watchdog's lateness WARNING names the cause the numbers show (``engine.lateness``): a
process that was stopped (a real SIGSTOP of a process holding one lock) is told it was paused,
not to spread its holds; a server that held the renewals (CLIENT PAUSE WRITE) is named as
such; many holds with renewals queued keep the capacity advice."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_rlock.engine.lateness import Lateness

ROOT = Path(__file__).parents[2]

#: Holds one lock at a 2 s watchdog (renewed every 0.67 s), logs to stderr, exits on a line.
CHILD = """
import logging, sys, redis
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
from django_rlock import RLock
lock = RLock(redis.Redis(unix_socket_path=sys.argv[1]), "late-one", watchdog_timeout=2.0)
lock.lock()
print("held", flush=True)
sys.stdin.readline()
"""


def _holder(socket: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", CHILD, socket], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _finish(p: subprocess.Popen) -> str:
    time.sleep(1.5)  # renewals resume and the late ones are reported
    _, err = p.communicate("\n", timeout=30)
    return err


@pytest.mark.timeout(60)
def test_a_sigstopped_holder_is_told_it_was_paused_not_to_spread_its_holds(own_server):
    p = _holder(own_server.socket)
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGSTOP)
    time.sleep(3.0)  # longer than the lease: its one lock runs out while it cannot run
    os.kill(p.pid, signal.SIGCONT)
    err = _finish(p)
    (warning,) = [line for line in err.splitlines() if "went out late" in line]
    assert "holds 1 lock(s) and 0 renewal(s) are queued" in warning, err
    assert "This process was paused or starved for at least" in warning, err
    stopped = float(warning.split("for at least ")[1].split(" s")[0])
    assert 1.0 <= stopped <= 3.5, warning  # how late its sweep woke: a bound of the stop
    assert "spread the holds" not in warning and "server or the network" not in warning


@pytest.mark.timeout(60)
def test_renewals_held_by_the_server_are_blamed_on_it_not_on_the_process(own_server):
    p = _holder(own_server.socket)
    admin = own_server.client()
    time.sleep(0.2)
    admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
    time.sleep(3.0)
    err = _finish(p)
    admin.close()
    (warning,) = [line for line in err.splitlines() if "went out late" in line]
    assert "The server or the network held the renewals" in warning, err
    assert "paused or starved" not in warning and "spread the holds" not in warning


def test_many_holds_with_renewals_queued_keep_the_capacity_advice(caplog):
    caplog.set_level(logging.WARNING, logger="django_rlock")
    Lateness().note(40, 0, 0.2, 100_000, 75_000, "a server")
    (record,) = caplog.records
    assert "holds more than it can renew in time" in record.getMessage()
    assert "raise watchdog_timeout, or spread the holds" in record.getMessage()
