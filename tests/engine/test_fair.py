"""FairLock / AsyncFairLock: Redisson's RFairLock (queue list, timeout zset, a channel per waiter)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine.fair import (
    FAIR_ACQUIRE_SCRIPT,
    FAIR_GIVE_UP_SCRIPT,
    FAIR_RELEASE_SCRIPT,
    AsyncFairLock,
    FairLock,
)
from django_rlock.engine.identity import thread_owner
from django_rlock.engine.lockinfo import describes, parse_entry
from django_rlock.engine.naming import (
    fair_ours,
    fair_waiter_channel,
    index_key,
    lock_channel,
    waiting_key,
)
from django_rlock.engine.scripts import call
from tests.conftest import script_calls

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def queue(r: redis.Redis, name: str) -> list[str]:
    return [o.decode() for o in r.lrange(f"redisson_lock_queue:{{{name}}}", 0, -1)]


def scores(r: redis.Redis, name: str) -> dict[str, float]:
    return {m.decode(): s for m, s in
            r.zrange(f"redisson_lock_timeout:{{{name}}}", 0, -1, withscores=True)}


def server_ms(r: redis.Redis) -> float:
    s, us = r.time()
    return s * 1000 + us / 1000


def until(check: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def sigkill_queued_waiter(r: redis.Redis, socket: str, name: str, budget: str,
                          queue_key: str) -> bytes:
    """A waiter in a process of its own (``_fair_proc wait``) queues behind the held lock
    ``name`` and is SIGKILLed there: returns its owner field, left in the line."""
    child = subprocess.Popen([sys.executable, "-m", "tests.engine._fair_proc", "wait", socket,
                              name, budget], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        until(lambda: r.exists("dead-owner") and r.llen(queue_key) == 1, 60, "child queued")
        dead = r.get("dead-owner")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
    return dead


# Direct script calls (Redisson's "Descrete" tests call its scripts the same way).
def _keys(name: str) -> tuple[Any, ...]:
    return (name, lock_channel(name), index_key(""), f"redisson_lock_queue:{{{name}}}",
            f"redisson_lock_timeout:{{{name}}}", fair_ours(name))


def acquire(r: redis.Redis, name: str, owner: str, wait_ms: int, lease_ms: int) -> Any:
    return call(r, FAIR_ACQUIRE_SCRIPT, _keys(name), (lease_ms, owner, "{}", wait_ms, "0"))


def give_up(r: redis.Redis, name: str, owner: str, wait_ms: int) -> Any:
    return call(r, FAIR_GIVE_UP_SCRIPT, _keys(name), (owner, wait_ms, "0"))


def release(r: redis.Redis, name: str, owner: str, lease_ms: int) -> Any:
    return call(r, FAIR_RELEASE_SCRIPT, _keys(name), (owner, lease_ms, "0"))


class Counter:
    """Counts the messages on every channel of a lock (a plain PSUBSCRIBE, not the engine's)."""

    def __init__(self, r: redis.Redis, name: str) -> None:
        self.ps = r.pubsub()
        self.ps.psubscribe(lock_channel(name) + "*")
        until(lambda: self.ps.get_message(timeout=0.1) is not None, what="psubscribe")
        self.counts: dict[str, int] = {}
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                m = self.ps.get_message(timeout=0.05)
            except redis.ConnectionError:  # the server went away at teardown
                return
            if m and m["type"] == "pmessage":
                ch = m["channel"].decode()
                assert m["data"] == b"0"
                self.counts[ch] = self.counts.get(ch, 0) + 1

    def close(self) -> dict[str, int]:
        time.sleep(0.2)  # messages published just before are read
        self._stop = True
        self._t.join(5)
        self.ps.close()
        return self.counts


# -- layout -------------------------------------------------------------------------------
def test_layout_redisson_names_and_kind_in_the_index(r, holders):
    lock = FairLock(r, "fl", prefix="p:")
    lock.lock()
    ((field, count),) = r.hgetall("p:fl").items()
    assert field.decode() == thread_owner() and count == b"1"
    entry = parse_entry(r.hget(index_key("p:"), "p:fl"))[1]
    assert entry["kind"] == "fair" and describes(entry, thread_owner())
    waiter = holders()
    res = waiter.submit(lambda: lock.try_lock(wait_time=30))
    until(lambda: len(queue(r, "p:fl")) == 1, what="the waiter in line")
    (owner,) = queue(r, "p:fl")
    assert list(scores(r, "p:fl")) == [owner]
    # Its own channel, Redisson's name: redisson_lock__channel:{p:fl}:<uuid>:<n>.
    ch = fair_waiter_channel("p:fl", owner)
    assert ch == f"redisson_lock__channel:{{p:fl}}:{owner}"
    until(lambda: r.pubsub_numsub(ch)[0][1] == 1, what="its subscription")
    assert r.pubsub_numsub(lock_channel("p:fl"))[0][1] == 0  # nobody on the shared channel
    lock.unlock()
    assert res() is True
    assert queue(r, "p:fl") == [] and scores(r, "p:fl") == {}
    waiter.call(lock.unlock)
    assert not r.exists("p:fl") and not r.hexists(index_key("p:"), "p:fl")
    # A name with a hash tag keeps it (Redisson's prefixName).
    tagged = FairLock(r, "{tag}x")
    assert tagged.queue_key == "redisson_lock_queue:{tag}x"
    assert tagged.timeout_key == "redisson_lock_timeout:{tag}x"


def test_hold_count_reentrancy_is_held_and_unlock_fail(r, holders):
    # RedissonFairLockTest: testGetHoldCount, testReentrancy, testIsHeldByCurrentThread*,
    # testIsLocked*, testUnlockFail, testLockUnlock.
    lock = FairLock(r, "rc")
    assert lock.hold_count() == 0 and not lock.is_locked()
    lock.lock()
    assert lock.hold_count() == 1
    lock.unlock()
    assert lock.hold_count() == 0
    assert lock.try_lock() and lock.try_lock()
    assert lock.hold_count() == 2 and lock.is_held_by_current_thread()
    other = holders()
    assert other.call(lock.is_locked) is True
    assert other.call(lock.is_held_by_current_thread) is False
    assert other.call(lock.try_lock) is False
    with pytest.raises(LockNotOwnedError):
        other.call(lock.unlock)
    lock.unlock()
    assert lock.hold_count() == 1
    assert other.call(lock.try_lock) is False
    lock.unlock()
    assert lock.hold_count() == 0 and not lock.is_locked()
    with pytest.raises(LockNotOwnedError):
        lock.unlock()
    for _ in range(2):
        with lock:
            assert lock.is_held_by_current_thread()
    assert lock.acquire(blocking=False) and lock.acquire(timeout=1)
    lock.release()
    lock.release()
    assert queue(r, "rc") == [] and not r.exists("rc")


def test_bad_input_raises_before_any_redis_command():
    dead = redis.Redis(unix_socket_path="/nonexistent/redis.sock")  # any command would fail
    for bad, exc in ((0, ValueError), (-1, ValueError), ("1", TypeError), (True, TypeError),
                     (float("inf"), ValueError)):
        with pytest.raises(exc, match="thread_wait_time.*'bad'"):
            FairLock(dead, "bad", thread_wait_time=bad)
    lock = FairLock(dead, "bad")
    with pytest.raises(ValueError, match="lease_time"):
        lock.lock(lease_time=0)
    with pytest.raises(ValueError, match="wait_time"):
        lock.try_lock(wait_time=-1)
    with pytest.raises(ValueError, match="name"):
        FairLock(dead, "")


# -- order ----------------------------------------------------------------------------------
def test_lease_timeout_8_threads_100ms_apart_acquire_in_fifo_order(r):
    # RedissonFairLockTest.testLeaseTimeout: tryLock(10 s, lease 1 s), nobody unlocks.
    got: list[int] = []

    def work(i: int) -> None:
        if FairLock(r, "lease").try_lock(wait_time=10, lease_time=1):
            got.append(i)

    threads = []
    t0 = time.monotonic()
    for i in range(8):
        time.sleep(0.1)
        t = threading.Thread(target=work, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(30)
    assert got == list(range(8))
    assert time.monotonic() - t0 < 20  # Redisson: < 11 s; generous on a shared machine


def test_strict_fifo_8_threads_in_4_processes_re_queueing(r, redis_server):
    """Acquisition order is queue entry order, across processes: the first round's entry
    order is set by the test (interleaving the processes); after that, each holder records
    the line behind it, and the next holders must be exactly that line, in that order (one
    that unlocks and asks again queues behind everyone already waiting: nobody barges)."""
    holder = FairLock(r, "fifo")
    holder.lock()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine._fair_proc", "fifo",
                               redis_server.socket, "fifo", str(p), "2", "3"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) for p in range(4)]
    try:
        until(lambda: r.hlen("owners") == 8, 60, "8 threads ready")
        owners = {k.decode(): v.decode() for k, v in r.hgetall("owners").items()}
        arrival = [f"{p}-{t}" for t in (1, 0) for p in (2, 0, 3, 1)]  # interleaved
        for n, label in enumerate(arrival, 1):
            r.rpush(f"go:{label}", 1)
            until(lambda n=n: len(queue(r, "fifo")) == n, 60, f"{label} in line")
        assert queue(r, "fifo") == [owners[label] for label in arrival]
        holder.unlock()
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0 and "done" in out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    label_of = {o: label for label, o in owners.items()}
    order = [o.decode() for o in r.lrange("order", 0, -1)]
    lines = [[label_of[o] for o in json.loads(x)] for x in r.lrange("lines", 0, -1)]
    assert len(order) == 24 and sorted(order) == sorted(arrival * 3)
    assert order[:8] == arrival
    assert lines[0] == arrival[1:]
    for i, line in enumerate(lines):
        assert order[i + 1:i + 1 + len(line)] == line, (i, order, line)
    assert sum(map(len, lines)) > 24  # the lines were long: the check had teeth
    assert not r.exists("fifo") and queue(r, "fifo") == [] and scores(r, "fifo") == {}


def test_a_release_wakes_exactly_the_next_waiter_on_its_own_channel(r, holders):
    holder = holders()
    name = "one"
    lock = FairLock(r, name)
    holder.call(lambda: lock.lock(lease_time=60))  # leases: no renewal scripts to count
    got: list[int] = []

    def work(i: int) -> None:
        lock.lock(lease_time=60)
        got.append(i)
        lock.unlock()

    waiters = [holders() for _ in range(4)]
    results = []
    for i, w in enumerate(waiters):
        results.append(w.submit(lambda i=i: work(i)))
        until(lambda i=i: len(queue(r, name)) == i + 1, what=f"waiter {i} in line")
    owners = queue(r, name)
    channels = [fair_waiter_channel(name, o) for o in owners]
    until(lambda: all(n == 1 for _, n in r.pubsub_numsub(*channels)), what="subscriptions")
    # Every waiter's retry after subscribing has landed once it is recorded (invariant 41);
    # then count from a quiet state, the scripts loaded (a first use is NOSCRIPT + EVAL).
    until(lambda: r.hlen(waiting_key(name)) == 4, what="every waiter's retry")
    for script in (FAIR_ACQUIRE_SCRIPT, FAIR_RELEASE_SCRIPT):
        r.script_load(script.source)
    before = -1
    while before != script_calls(r):
        before = script_calls(r)
        time.sleep(0.3)
    counter = Counter(r, name)
    r.config_resetstat()
    holder.call(lock.unlock)
    for res in results:
        res()
    counts = counter.close()
    assert got == [0, 1, 2, 3]
    # One message per hand-off, each on the next waiter's channel; none on the lock channel.
    assert counts == {ch: 1 for ch in channels}
    # Nobody else woke: 5 releases (the last wakes nobody) and 4 acquires, nothing more.
    assert script_calls(r) == 9


def test_try_lock_non_delayed_and_no_wait_never_queues(r, holders):
    # RedissonFairLockTest.testTryLockNonDelayed.
    lock = FairLock(r, "nd")
    other = holders()
    assert lock.try_lock(0)
    t0 = time.monotonic()
    assert other.call(lambda: lock.try_lock(wait_time=0.2)) is False
    assert time.monotonic() - t0 >= 0.2
    assert queue(r, "nd") == [] and scores(r, "nd") == {}  # gave up: left the line
    assert other.call(lambda: lock.try_lock(0)) is False
    assert other.call(lambda: lock.acquire(blocking=False)) is False
    assert queue(r, "nd") == []  # the no-wait variant never queues
    lock.unlock()
    assert other.call(lambda: lock.try_lock(0)) is True
    other.call(lock.unlock)


def test_no_wait_is_refused_while_someone_waits_even_if_the_lock_is_free(r):
    # testLockAcquiredBooleanTimeoutDrift_Descrete: a free lock with a live waiter first in
    # line is that waiter's; a dead waiter stops blocking once its allowance is spent.
    assert acquire(r, "b", "holder", 100, 500) is None
    assert acquire(r, "b", "ghost", 300, 500) >= 0
    assert release(r, "b", "holder", 500) == 1
    lock = FairLock(r, "b")
    assert lock.try_lock(0) is False
    assert lock.try_lock(0) is False
    assert queue(r, "b") == ["ghost"]
    t0 = time.monotonic()
    assert lock.try_lock(wait_time=5) is True  # the ghost's 500 + 300 ms run out; pruned
    assert 0.2 < time.monotonic() - t0 < 4
    assert queue(r, "b") == [] and scores(r, "b") == {}
    lock.unlock()


# -- timeout drift (Redisson #1104 / #2099 / #5019) --------------------------------------------
def test_acquire_failed_timeout_drift_descrete(r):
    # testAcquireFailedTimeoutDrift_Descrete: lease 30 s, wait 5 s, 4 waiters.
    lease, wait = 30_000, 5_000
    assert acquire(r, "d", "holder", wait, lease) is None
    now = server_ms(r)
    for i in (1, 2, 3, 4):
        ttl = acquire(r, "d", f"w{i}", wait, lease)
        assert 29_900 <= ttl <= 30_000  # queued: the holder's PTTL
    s = scores(r, "d")
    for i in (1, 2, 3, 4):
        assert s[f"w{i}"] == pytest.approx(now + lease + wait * i, abs=100)
    assert acquire(r, "d", "w3", wait, lease) <= 30_000  # asking again changes nothing
    assert scores(r, "d") == s
    give_up(r, "d", "w2", wait)
    s = scores(r, "d")
    assert queue(r, "d") == ["w1", "w3", "w4"]
    assert s["w1"] == pytest.approx(now + lease + wait, abs=100)
    assert s["w3"] == pytest.approx(now + lease + wait * 2, abs=100)
    assert s["w4"] == pytest.approx(now + lease + wait * 3, abs=100)
    assert release(r, "d", "holder", lease) == 1
    assert acquire(r, "d", "w3", wait, lease) >= 0  # not first in line: refused, still queued
    assert acquire(r, "d", "w1", wait, lease) is None
    s = scores(r, "d")
    assert queue(r, "d") == ["w3", "w4"]
    assert s["w3"] == pytest.approx(now + lease + wait, abs=100)
    assert s["w4"] == pytest.approx(now + lease + wait * 2, abs=100)


def test_abandoned_timeout_drift_descrete(r):
    # testAbandonedTimeoutDrift_Descrete: wait 100 ms, lease 500 ms; the 2nd waiter never
    # comes back; the 3rd gets the lock once the holder's lease and both allowances are spent.
    assert acquire(r, "ab", "first", 100, 500) is None
    acquire(r, "ab", "second", 100, 500)
    acquire(r, "ab", "third", 100, 500)
    s = scores(r, "ab")
    assert s["third"] - s["second"] == pytest.approx(100, abs=10)
    until(lambda: acquire(r, "ab", "third", 100, 500) is None, 5, "the third's turn")
    assert server_ms(r) >= s["second"]  # not before the abandoned one's time ran out
    assert queue(r, "ab") == [] and scores(r, "ab") == {}


def test_waiters_giving_up_leave_no_drift(r, holders):
    # testWaitTimeoutDrift: 20 waiters give up while the lock is held. The line is clean, and
    # the live waiter behind them moved up by each one's allowance: its deadline stays within
    # now + lease + thread_wait_time (without the shift it would carry their 20 x 2 s).
    lock = FairLock(r, "wd", thread_wait_time=10)
    lock.lock(lease_time=30)
    failed: list[bool] = []
    threads = [threading.Thread(target=lambda: failed.append(lock.try_lock(wait_time=2.0)))
               for _ in range(20)]
    for t in threads:
        t.start()
    until(lambda: len(queue(r, "wd")) == 20, what="20 in line")
    live = holders()
    res = live.submit(lambda: lock.try_lock(wait_time=60))
    until(lambda: len(queue(r, "wd")) == 21)
    owner = queue(r, "wd")[-1]
    assert scores(r, "wd")[owner] > server_ms(r) + 30_000 + 10_000 + 20_000
    for t in threads:
        t.join(30)
    assert failed == [False] * 20
    assert queue(r, "wd") == [owner]
    assert scores(r, "wd")[owner] <= server_ms(r) + 30_000 + 10_000
    lock.unlock()
    assert res() is True
    live.call(lock.unlock)
    assert queue(r, "wd") == [] and scores(r, "wd") == {}


def test_deadlines_shift_as_the_line_moves(r, holders):
    # testLockAcquiredTimeoutDrift: as each waiter takes the lock, the deadlines behind it
    # move up by its allowance: the k-th in line never has more than now + lease + k * wait.
    lock = FairLock(r, "mv", thread_wait_time=20)
    lock.lock(lease_time=10)
    gates = [threading.Event() for _ in range(4)]

    def work(i: int) -> None:
        lock.lock(lease_time=10)
        gates[i].wait(30)
        lock.unlock()

    results = []
    for i in range(4):
        results.append(holders().submit(lambda i=i: work(i)))
        until(lambda i=i: len(queue(r, "mv")) == i + 1)
    lock.unlock()
    for k in range(4):
        until(lambda k=k: len(queue(r, "mv")) == 3 - k and r.exists("mv"), what="next holder")
        now = server_ms(r)
        for pos, owner in enumerate(queue(r, "mv"), 1):
            assert scores(r, "mv")[owner] <= now + 10_000 + pos * 20_000 + 200
        gates[k].set()
        results[k]()
    assert queue(r, "mv") == [] and scores(r, "mv") == {}


def test_a_sigkilled_waiter_is_pruned_within_thread_wait_time(r, redis_server, holders):
    # testFirstThreadDeathTimeoutDrift, with a real process killed in the line.
    holder = holders()
    # Renewed every 1/3 s: its PTTL (part of the child's deadline) stays under 1 s.
    lock = FairLock(r, "dead", watchdog_timeout=1.0, thread_wait_time=1.0)
    holder.call(lock.lock)
    child = subprocess.Popen([sys.executable, "-m", "tests.engine._fair_proc", "wait",
                              redis_server.socket, "dead", "1.0"], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        until(lambda: r.exists("dead-owner") and len(queue(r, "dead")) == 1, 60, "child queued")
        dead = r.get("dead-owner").decode()
        assert queue(r, "dead") == [dead]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    deadline = scores(r, "dead")[dead]
    assert deadline <= server_ms(r) + 1_000 + 1_000  # lease + thread_wait_time
    waiter = holders()
    res = waiter.submit(lambda: lock.try_lock(wait_time=30))
    until(lambda: len(queue(r, "dead")) == 2)
    now = server_ms(r)
    assert scores(r, "dead")[queue(r, "dead")[1]] <= now + 1_000 + 2 * 1_000
    holder.call(lock.unlock)  # wakes the dead one, which never comes
    assert res(30) is True
    assert server_ms(r) >= deadline  # FIFO: it waited for the dead one's time to run out
    assert server_ms(r) <= deadline + 3_000  # and not much longer (its bound: that deadline)
    assert queue(r, "dead") == [] and scores(r, "dead") == {}
    waiter.call(lock.unlock)


# -- expiry, force unlock, watchdog ---------------------------------------------------------------
def test_expire_then_the_old_owners_unlock_raises_and_wakes_the_head(r, holders):
    # testExpire (RLock's rule here: a late unlock raises).
    lock = FairLock(r, "ex")
    lock.lock(lease_time=0.5)
    t0 = time.monotonic()
    other = holders()
    assert other.call(lambda: lock.try_lock(wait_time=10, lease_time=10)) is True
    assert time.monotonic() - t0 < 3
    with pytest.raises(LockNotOwnedError):
        lock.unlock()
    other.call(lock.unlock)
    # A missing key: the late unlock still wakes the waiter first in line.
    assert acquire(r, "ex", "h", 1000, 30_000) is None
    acquire(r, "ex", "w", 1000, 30_000)
    r.delete("ex")
    counter = Counter(r, "ex")
    with pytest.raises(LockNotOwnedError):
        lock.unlock()
    assert counter.close() == {fair_waiter_channel("ex", "w"): 1}


def test_force_unlock_deletes_keeps_the_line_and_wakes_the_head(r, holders):
    lock = FairLock(r, "fu")
    lock.lock()
    waiters = [holders() for _ in range(2)]
    res = []
    for i, w in enumerate(waiters):
        res.append(w.submit(lambda: lock.try_lock(wait_time=30)))
        until(lambda i=i: len(queue(r, "fu")) == i + 1)
    first, second = queue(r, "fu")
    until(lambda: r.pubsub_numsub(fair_waiter_channel("fu", first))[0][1] == 1)
    counter = Counter(r, "fu")
    assert FairLock(r, "fu").force_unlock() is True
    assert res[0]() is True  # woken at once, not at the lease's end
    assert queue(r, "fu") == [second]
    assert waiters[0].call(lock.force_unlock) is True
    assert res[1]() is True
    assert counter.close() == {fair_waiter_channel("fu", first): 1,
                               fair_waiter_channel("fu", second): 1}
    assert lock.is_lost()
    with pytest.raises(LockNotOwnedError):
        lock.unlock()
    waiters[1].call(lock.unlock)
    assert FairLock(r, "fu").force_unlock() is False


def test_watchdog_renews_and_releases_for_an_ended_owner(r):
    lock = FairLock(r, "wdog", watchdog_timeout=0.6)
    lock.lock()
    time.sleep(1.5)
    assert lock.is_held_by_current_thread() and not lock.is_lost()
    lock.unlock()
    # A thread that ends holding: the watchdog releases it (fair end script) and the head,
    # woken on its channel, takes the lock.
    t = threading.Thread(target=lock.lock)
    t.start()
    t.join()
    t0 = time.monotonic()
    assert lock.try_lock(wait_time=30) is True
    assert time.monotonic() - t0 < 10
    lock.unlock()
    assert queue(r, "wdog") == []


def test_excludes_an_rlock_of_the_same_name(r, holders):
    fair = FairLock(r, "mix")
    fair.lock()
    assert holders().call(RLock(r, "mix").try_lock) is False
    fair.unlock()


# -- asyncio ----------------------------------------------------------------------------------
def test_async_fifo_and_a_cancelled_waiter_leaves_the_line(ar, r):
    async def main() -> list[int]:
        lock = AsyncFairLock(ar, "af", thread_wait_time=60)
        await lock.lock()
        assert await lock.hold_count() == 1
        got: list[int] = []

        async def work(i: int) -> None:
            await lock.lock()
            got.append(i)
            await asyncio.sleep(0.01)
            await lock.unlock()

        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(work(i)))
            while len(await ar.lrange("redisson_lock_queue:{af}", 0, -1)) != i + 1:
                await asyncio.sleep(0.01)
        line = queue(r, "af")
        before = scores(r, "af")
        tasks[1].cancel()  # second in line
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        assert queue(r, "af") == [line[0], line[2], line[3]]
        after = scores(r, "af")
        assert after[line[0]] == before[line[0]]
        for o in line[2:]:
            assert after[o] == pytest.approx(before[o] - 60_000, abs=1)  # shifted up
        # A timed-out task leaves the line too.
        assert await asyncio.create_task(lock.try_lock(wait_time=0.2)) is False
        assert len(queue(r, "af")) == 3
        await lock.unlock()
        await asyncio.gather(tasks[0], tasks[2], tasks[3])
        await ar.aclose()
        return got

    assert asyncio.run(main()) == [0, 2, 3]
    assert queue(r, "af") == [] and scores(r, "af") == {} and not r.exists("af")


def test_async_cancelled_head_hands_on_to_the_next(ar, r, holders):
    """The head is woken by a release and cancelled before it runs: leaving the line, it wakes
    the next waiter at once (the lock is free), instead of leaving it to its PTTL bound."""
    async def main() -> None:
        sync_lock = FairLock(r, "ah")
        h = holders()
        h.call(sync_lock.lock)  # watchdog mode: a 30 s PTTL
        lock = AsyncFairLock(ar, "ah")
        first = asyncio.create_task(lock.lock())
        while len(queue(r, "ah")) != 1:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(lock.try_lock(wait_time=30))
        while len(queue(r, "ah")) != 2:
            await asyncio.sleep(0.01)
        head = queue(r, "ah")[0]
        while r.pubsub_numsub(fair_waiter_channel("ah", head))[0][1] != 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # its post-subscribe retry done: parked
        # Blocking the loop: the release wakes `first`, cancelled before it can run.
        h.call(sync_lock.unlock)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        t0 = time.monotonic()
        assert await asyncio.wait_for(second, 10) is True  # not the 30 s bound: the hand-on
        assert time.monotonic() - t0 < 5
        assert queue(r, "ah") == []
        await ar.aclose()

    asyncio.run(main())


def test_async_and_sync_share_one_line(ar, r, holders):
    async def main() -> None:
        sync_lock = FairLock(r, "as")
        h = holders()
        h.call(sync_lock.lock)
        alock = AsyncFairLock(ar, "as")
        assert await alock.try_lock() is False

        async def waiter() -> None:
            assert await alock.try_lock(wait_time=30) is True
            assert await alock.is_held_by_current_task() and await alock.hold_count() == 1
            entry = parse_entry(await ar.hget(index_key(""), "as"))[1]
            assert entry["kind"] == "fair"
            await alock.unlock()

        waiting = asyncio.create_task(waiter())
        while len(queue(r, "as")) != 1:
            await asyncio.sleep(0.01)
        assert await alock.is_held_by_current_task() is False
        h.call(sync_lock.unlock)
        await waiting
        assert not await alock.is_locked()
        await ar.aclose()

    asyncio.run(main())
