"""Who waits (invariant 41): every kind's waiter, in a process of its own, is listed with its
owner, host, pid, process, thread and since when (server time) while it waits, and is gone
once it acquires, gives up or dies (within its wait bound)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_rlock.engine.fair import FairLock
from django_rlock.engine.fenced import FencedLock
from django_rlock.engine.latch import CountDownLatch
from django_rlock.engine.leader import Leader
from django_rlock.engine.listing import Locks
from django_rlock.engine.lock import RLock
from django_rlock.engine.naming import leader_name, waiting_key
from django_rlock.engine.permits import PermitExpirableSemaphore
from django_rlock.engine.ratelimit import RateLimiter
from django_rlock.engine.rwlock import ReadWriteLock
from django_rlock.engine.semaphore import Semaphore
from django_rlock.engine.waiters import Waiter
from tests.engine._waiter_proc import PREFIX

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Proc:
    """A waiter process (``_waiter_proc``) driven line by line."""

    def __init__(self, kind: str, sock: str, name: str, mode: str = "sync") -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "tests.engine._waiter_proc", kind, sock,
                                   name, mode], cwd=ROOT, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.p.pid
        self.send("ping")
        self.expect("pong")

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def expect(self, what: str) -> None:
        assert self.p.stdout is not None
        got = self.p.stdout.readline().strip()
        assert got == what, f"expected {what!r}, got {got!r}"

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


@pytest.fixture
def procs() -> Iterator[Callable[..., Proc]]:
    made: list[Proc] = []

    def make(*args: Any) -> Proc:
        made.append(Proc(*args))
        return made[-1]

    yield make
    for p in made:
        p.close()


class Blocker:
    """What keeps a kind's waiter waiting (``block``) and lets it through (``unblock``)."""

    def __init__(self, r: redis.Redis, kind: str, name: str) -> None:
        self.kind, self.listed = kind, name
        self.permit: str | None = None
        if kind in ("lock", "fair", "fenced"):
            self.obj: Any = {"lock": RLock, "fair": FairLock, "fenced": FencedLock}[kind](
                r, name, PREFIX)
        elif kind == "read":
            self.obj = ReadWriteLock(r, name, PREFIX).write_lock()
        elif kind == "semaphore":
            self.obj = Semaphore(r, name, PREFIX)
            self.obj.try_set_permits(0)
        elif kind == "permits":
            self.obj = PermitExpirableSemaphore(r, name, PREFIX)
            self.obj.try_set_permits(1)
        elif kind == "latch":
            self.obj = CountDownLatch(r, name, PREFIX)
        elif kind == "rate":
            self.obj = RateLimiter(r, name, PREFIX)
            self.obj.try_set_rate(1, 3.0)
        elif kind == "leader":
            self.obj = Leader(r, name, PREFIX, watchdog_timeout=1.0)
            self.listed = leader_name(name)

    def block(self) -> None:
        o = self.obj
        if self.kind in ("lock", "fair", "fenced", "read"):
            o.lock()
        elif self.kind == "semaphore":
            o.drain_permits()
        elif self.kind == "permits":
            self.permit = o.acquire()
        elif self.kind == "latch":
            assert o.try_set_count(1)
        elif self.kind == "rate":
            o.acquire()  # the window's one permit: the next comes 3 s later
        elif self.kind == "leader":
            o.start()
            assert o.wait_elected(10)

    def unblock(self) -> None:
        o = self.obj
        if self.kind in ("lock", "fair", "fenced", "read"):
            o.unlock()
        elif self.kind == "semaphore":
            o.release(1)
        elif self.kind == "permits":
            o.release(self.permit)
        elif self.kind == "latch":
            o.count_down()
        elif self.kind == "leader":
            o.stop()
        # a rate limiter lets its waiter through when the window has room again


KINDS = ["lock", "fair", "read", "fenced", "semaphore", "permits", "latch", "leader", "rate"]


def waiters_of(r: redis.Redis, name: str) -> tuple[Waiter, ...]:
    info = Locks(r, PREFIX).show(name)
    return () if info is None else info.waiters


def until_listed(r: redis.Redis, name: str, n: int = 1, timeout: float = 15.0
                 ) -> tuple[Waiter, ...]:
    end = time.monotonic() + timeout
    while True:
        found = waiters_of(r, name)
        if len(found) >= n or time.monotonic() > end:
            return found
        time.sleep(0.02)


def server_now(r: redis.Redis) -> float:
    s, us = r.time()
    return s + us / 1e6


@pytest.mark.parametrize("kind", KINDS)
def test_a_waiter_is_listed_while_it_waits_and_gone_once_it_acquires_or_gives_up(
        r: redis.Redis, redis_server: Any, procs: Callable[..., Proc], kind: str) -> None:
    b = Blocker(r, kind, f"{kind}-1")
    p = procs(kind, redis_server.socket, f"{kind}-1")
    b.block()
    before = server_now(r)
    p.send("wait 60")
    p.expect("waiting")
    found = until_listed(r, b.listed)
    assert len(found) == 1, found
    w = found[0]
    assert (w.pid, w.host) == (p.pid, socket.gethostname())
    assert w.process == "_waiter_proc.py"
    assert w.thread == ("django-rlock leader leader-1" if kind == "leader" else f"waiter-{kind}")
    assert len(w.client_id) == 36 and w.thread_id is not None  # a full owner id
    assert before - 0.5 <= w.since <= server_now(r) and w.waiting_for >= 0
    d = w.as_dict()
    assert set(d) >= {"client_id", "thread_id", "host", "pid", "process", "thread",
                      "waiting_for", "since"}
    b.unblock()
    p.expect("acquired")
    assert waiters_of(r, b.listed) == ()
    if kind in ("rate", "leader"):
        return  # a limiter refuses a wait it cannot serve in time; a standby waits on
    b.block()
    p.send("wait 1.5")
    p.expect("waiting")
    assert len(until_listed(r, b.listed)) == 1
    p.expect("timeout")
    assert waiters_of(r, b.listed) == ()
    b.unblock()


@pytest.mark.parametrize("kind", ["semaphore", "fair"])
def test_a_waiter_that_timed_out_is_not_listed_beside_one_still_waiting(
        r: redis.Redis, redis_server: Any, procs: Callable[..., Proc], kind: str) -> None:
    # Nothing takes its record out (no round trip on a timeout): its deadline, the end of
    # its budget, does, while the hash lives on for the other waiter.
    b = Blocker(r, kind, "two")
    patient, hasty = (procs(kind, redis_server.socket, "two") for _ in range(2))
    b.block()
    patient.send("wait 60")
    patient.expect("waiting")
    hasty.send("wait 1.5")
    hasty.expect("waiting")
    assert len(until_listed(r, "two", 2)) == 2
    hasty.expect("timeout")
    assert [w.pid for w in waiters_of(r, "two")] == [patient.pid]
    assert r.hlen(waiting_key(PREFIX + "two")) == 2  # there, but past its deadline
    b.unblock()
    patient.expect("acquired")


def test_a_standby_that_stands_down_is_gone_at_once(r: redis.Redis) -> None:
    holder = Leader(r, "g", PREFIX).start()
    standby = Leader(redis.Redis(unix_socket_path=r.connection_pool.connection_kwargs["path"]),
                     "g", PREFIX)
    try:
        assert holder.wait_elected(10)
        standby.start()
        assert len(until_listed(r, leader_name("g"))) == 1
        standby.stop(10)
        assert waiters_of(r, leader_name("g")) == ()
    finally:
        standby.stop(10)
        holder.stop(10)


@pytest.mark.parametrize("kind", ["lock", "fair"])
def test_waiters_queued_behind_a_waiter_of_their_own_process_are_listed_too(
        r: redis.Redis, kind: str) -> None:
    # The process's first waiter attempts; the others park in its queue (the lock is handed
    # on in order inside the process) and send nothing: their record is written after
    # PARKED_AFTER, and taken out as each one's wait ends.
    b = Blocker(r, kind, "queued")
    b.block()
    done: list[str] = []

    def wait_one() -> None:
        lk = type(b.obj)(r, "queued", PREFIX)
        if lk.try_lock(30):
            done.append(threading.current_thread().name)
            lk.unlock()

    threads = [threading.Thread(target=wait_one, name=f"queued-{i}", daemon=True)
               for i in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    found = until_listed(r, "queued", 3)
    assert sorted(w.thread or "" for w in found) == ["queued-0", "queued-1", "queued-2"]
    assert all(w.pid == os.getpid() for w in found)
    b.unblock()
    for t in threads:
        t.join(30)
    assert sorted(done) == ["queued-0", "queued-1", "queued-2"]
    assert waiters_of(r, "queued") == ()


def test_since_is_the_first_attempt_and_stays_across_retries(
        r: redis.Redis, redis_server: Any, procs: Callable[..., Proc]) -> None:
    # A holder with a 1 s lease (renewed): the waiter tries again about every second.
    holder = RLock(r, "since", PREFIX, watchdog_timeout=1.0)
    holder.lock()
    p = procs("lock", redis_server.socket, "since")
    p.send("wait 60")
    p.expect("waiting")
    first = until_listed(r, "since")[0]
    calls = r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    time.sleep(2.5)
    assert r.info("commandstats")["cmdstat_evalsha"]["calls"] >= calls + 2  # it did retry
    again = waiters_of(r, "since")[0]
    assert again.since == first.since
    assert again.waiting_for >= first.waiting_for + 2.0
    holder.unlock()
    p.expect("acquired")


def test_asyncio_waiters_show_their_task(r: redis.Redis, redis_server: Any,
                                         procs: Callable[..., Proc]) -> None:
    lk = RLock(r, "alock", PREFIX)
    lk.lock()
    sem = Semaphore(r, "asem", PREFIX)
    sem.try_set_permits(0)
    p1 = procs("lock", redis_server.socket, "alock", "async")
    p2 = procs("semaphore", redis_server.socket, "asem", "async")
    for p in (p1, p2):
        p.send("wait 60")
        p.expect("waiting")
    w1, w2 = until_listed(r, "alock")[0], until_listed(r, "asem")[0]
    assert (w1.thread, w1.pid) == ("task-lock", p1.pid)  # the task's name, not the thread's
    assert (w2.thread, w2.pid) == ("task-semaphore", p2.pid)
    lk.unlock()
    sem.release(1)
    p1.expect("acquired")
    p2.expect("acquired")
    assert waiters_of(r, "alock") == () and waiters_of(r, "asem") == ()
    lk.lock()
    p1.send("wait 1")
    p1.expect("waiting")
    p1.expect("timeout")
    assert waiters_of(r, "alock") == ()
    lk.unlock()


def test_a_killed_waiter_is_gone_within_its_wait_bound(
        r: redis.Redis, redis_server: Any, procs: Callable[..., Proc]) -> None:
    # (A rate limiter's bound is its retry time plus the slack: the same record, not repeated.)
    kinds = [k for k in KINDS if k not in ("leader", "rate")]
    blockers = {k: Blocker(r, k, f"{k}-k") for k in kinds}
    ps = {k: procs(k, redis_server.socket, f"{k}-k") for k in kinds}
    for b in blockers.values():
        b.block()
    t0 = time.monotonic()
    for p in ps.values():
        p.send("wait 6")  # its record's deadline: 6 s from now at the latest
    for k, p in ps.items():
        p.expect("waiting")
        assert len(until_listed(r, blockers[k].listed)) == 1, k
    for p in ps.values():
        os.kill(p.pid, signal.SIGKILL)
        p.p.wait(10)
    assert time.monotonic() - t0 < 5.5, "too slow to tell the records outlive their process"
    for k, b in blockers.items():  # the processes are gone, not their records
        assert len(waiters_of(r, b.listed)) == 1, k
    while any(waiters_of(r, b.listed) for b in blockers.values()):
        assert time.monotonic() - t0 < 6.0 + 1.0, "a dead waiter outlived its wait bound"
        time.sleep(0.05)


def test_a_killed_standby_with_no_budget_is_gone_within_the_holders_lease_and_the_slack(
        r: redis.Redis, redis_server: Any, procs: Callable[..., Proc]) -> None:
    b = Blocker(r, "leader", "kill")  # its leader's lease: 1 s, renewed
    b.block()
    try:
        p = procs("leader", redis_server.socket, "kill")
        p.send("wait inf")
        p.expect("waiting")
        assert len(until_listed(r, b.listed)) == 1
        os.kill(p.pid, signal.SIGKILL)
        p.p.wait(10)
        killed = time.monotonic()
        assert len(waiters_of(r, b.listed)) == 1
        while waiters_of(r, b.listed):
            assert time.monotonic() - killed < 1.0 + 5.0 + 1.5, "kept past its bound"
            time.sleep(0.1)
        assert r.hlen(waiting_key(PREFIX + b.listed)) <= 1  # expires with its last record
    finally:
        b.unblock()


def test_an_uncontended_acquire_sends_what_it_did(r: redis.Redis) -> None:
    lk = RLock(r, "plain", PREFIX)
    sem = Semaphore(r, "plain-sem", PREFIX)
    sem.try_set_permits(1)
    r.config_resetstat()
    lk.lock()
    lk.unlock()
    assert sem.try_acquire(1, 5)
    stats = {k[len("cmdstat_"):]: v["calls"] for k, v in r.info("commandstats").items()}
    # One script per call (acquire, release, the permit; each sent once as EVALSHA), and
    # inside them no waiter's record: the one HSET is the index entry, the one HDEL the
    # release's grant bookkeeping, as before waiters were recorded.
    assert stats["evalsha"] == 3
    assert (stats["hset"], stats["hdel"], stats.get("hlen", 0), stats.get("hgetall", 0)) == (
        1, 1, 0, 0)
    assert not r.exists(waiting_key(PREFIX + "plain"), waiting_key(PREFIX + "plain-sem"))
