"""Across processes: exclusion, crash recovery and fork safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine.watchdog import watchdog

ROOT = Path(__file__).parents[2]


def run_proc(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.engine._proc", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)


def test_mutual_exclusion_across_4_processes_x_4_threads(r, redis_server):
    procs = [run_proc("count", redis_server.socket, "ctr", "4", "25") for _ in range(4)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "done" in out
    assert int(r.get("counter")) == 4 * 4 * 25
    assert not r.exists("ctr")


def test_sigkilled_holder_frees_the_lock_within_the_watchdog_timeout(r, redis_server):
    proc = run_proc("hold", redis_server.socket, "crash", "1.5")
    assert proc.stdout.readline().strip() == "locked"
    time.sleep(2.5)  # longer than the 1.5 s lease: its watchdog has been renewing it
    assert r.exists("crash")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    lock = RLock(r, "crash")
    assert lock.try_lock(wait_time=10)
    assert time.monotonic() - killed <= 1.5 + 0.5
    lock.unlock()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_is_a_new_owner(r, redis_server):
    parent_lock = RLock(r, "parent", watchdog_timeout=1.5)
    parent_lock.lock()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report each check as a character, exit without pytest cleanup
        code = 0
        try:
            import redis

            c = redis.Redis(unix_socket_path=redis_server.socket)
            lock = RLock(c, "parent", watchdog_timeout=1.5)
            checks = [
                watchdog().renewing() == 0,            # the parent's hold is not ours to renew
                lock.hold_count() == 0,
                not lock.is_held_by_current_thread(),
                lock.try_lock() is False,              # not reentrant: we are a new owner
            ]
            try:
                lock.unlock()
                checks.append(False)
            except LockNotOwnedError:
                checks.append(True)
            own = RLock(c, "child", watchdog_timeout=1.0)
            own.lock()
            time.sleep(2.5)                            # > 2x the lease: our own watchdog runs
            checks.append(c.pttl("child") > 0)
            own.unlock()
            os.write(write_end, "".join("1" if ok else "0" for ok in checks).encode())
        except BaseException as exc:  # pragma: no cover
            os.write(write_end, repr(exc).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    report = os.read(read_end, 1000).decode()
    os.close(read_end)
    assert report == "1" * 6, report
    assert os.WEXITSTATUS(status) == 0
    # The parent still holds its lock, renewed by its own watchdog past the 1.5 s lease.
    assert parent_lock.hold_count() == 1 and r.pttl("parent") > 0
    parent_lock.unlock()


_FORKS_AND_DIES = """
import os, sys, time
import redis
from django_rlock import RLock
c = redis.Redis(unix_socket_path=sys.argv[1])
for _ in range(2):  # (its subscription is made, then its thread's wake line)
    assert not RLock(c, "forked-sub").try_lock(wait_time=0.3)
pid = os.fork()
if pid == 0:
    time.sleep(30)  # a worker that outlives its parent
    os._exit(0)
from django_rlock.engine import identity
print(pid, identity.process_id(), flush=True)
os._exit(0)  # the parent dies without closing anything
"""


def test_a_subscription_does_not_outlive_its_process_in_a_forked_child(r, redis_server):
    """A release skips a waiter whose process is gone because its subscription (and its
    threads' wake lines) went with it (invariants 25, 44). A child forked by that process
    inherits their sockets: it must close its copies, or the dead parent's waiters would look
    alive for as long as the child lives."""
    r.hset("forked-sub", "another-process:1", 1)
    r.pexpire("forked-sub", 30_000)
    parent = subprocess.Popen([sys.executable, "-c", _FORKS_AND_DIES, redis_server.socket],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid, uuid = parent.stdout.readline().split()
    child = int(pid)
    try:
        assert parent.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while subs := [c["name"] for c in r.client_list()  # (not this process's own)
                       if c.get("name", "").startswith((f"rlock-pubsub:{uuid}",
                                                        f"rlock-wake:{uuid}"))]:
            assert time.monotonic() < deadline, f"the dead parent's {subs} are still there"
            time.sleep(0.05)
        os.kill(child, 0)  # (the child is still alive: it was not the child's exit)
    finally:
        os.kill(child, signal.SIGKILL)
