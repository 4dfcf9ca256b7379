"""A FairLock waiter of ours that dies (or freezes) in line costs the waiters behind it its turn,
``fair.TURN_MS`` after the lock became free with it first, not its allowance (300 s by
default): invariant 50. Live waiters keep their place and order behind a hold longer than
the turn; a waiter frozen past its turn loses its place and is never told it holds a lock
someone else holds; a Redisson client's waiter keeps Redisson's deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from django_rlock.engine.fair import TURN_MS, FairLock
from django_rlock.engine.naming import fair_ours, lock_channel
from tests.engine.test_fair import (
    Counter,
    acquire,
    give_up,
    release,
    scores,
    server_ms,
    sigkill_queued_waiter,
    until,
)

ROOT = Path(__file__).parents[2]
#: What the tests allow a dead waiter's turn to cost at most (s): TURN_MS and a loaded CI.
BOUND_S = 20.0


def start(redis_server, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.engine._fair_proc", args[0],
                             redis_server.socket, *args[1:]], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)


def line(r: redis.Redis, lock: FairLock) -> list[bytes]:
    return r.lrange(lock.queue_key, 0, -1)


def gone(r: redis.Redis, lock: FairLock) -> bool:
    return not r.exists(lock.queue_key, lock.timeout_key, lock.ours_key)


def test_a_sigkilled_waiter_costs_its_turn_not_its_allowance_and_live_ones_keep_order(
        r, redis_server, holders):
    """thread_wait_time at its default (300 s): a waiter SIGKILLed in line holds the free lock
    from the two live waiters behind it for its turn (5 s), not 300 s; and those two, queued
    behind a hold longer than the turn, keep their place and their order."""
    lock = FairLock(r, "turn")  # thread_wait_time 300 s, watchdog_timeout 30 s
    holder = holders()
    holder.call(lock.lock)
    held_since = time.monotonic()
    dead = sigkill_queued_waiter(r, redis_server.socket, "turn", "300", lock.queue_key)

    def work(label: str) -> float:
        assert lock.try_lock(wait_time=60) is True
        got = server_ms(r)
        r.rpush("order", label)
        time.sleep(0.1)
        lock.unlock()
        return got

    got1 = holders().submit(lambda: work("w1"))
    until(lambda: r.llen(lock.queue_key) == 2, what="w1 in line")
    got2 = holders().submit(lambda: work("w2"))
    until(lambda: r.llen(lock.queue_key) == 3, what="w2 in line")
    time.sleep(max(0.0, held_since + TURN_MS / 1000 + 0.5 - time.monotonic()))
    assert line(r, lock)[0] == dead and len(line(r, lock)) == 3  # a long hold drops nobody
    assert r.hget(lock.ours_key, dead) == b"0"  # ours; its turn not begun while held
    released = server_ms(r)
    holder.call(lock.unlock)  # the dead one's turn begins; w1 (another process) is woken
    t1, t2 = got1(BOUND_S + 10), got2(30)
    assert r.lrange("order", 0, -1) == [b"w1", b"w2"]
    assert t1 >= released + TURN_MS  # FIFO: the dead one had its whole turn
    assert t1 - released < BOUND_S * 1000, t1 - released  # and no more (not 300 s)
    assert t2 > t1
    assert gone(r, lock)


def test_a_frozen_head_loses_its_turn_and_is_never_told_it_holds_anothers_lock(
        r, redis_server, holders):
    """A holder SIGKILLed (its lock expires: no release, no message) with a waiter of ours
    SIGSTOPped first in line and a live one behind: the live one's attempt at the expiry
    begins the frozen one's turn and takes the lock at its end. Resumed, the frozen one joins
    again at the back and gets the lock only once the live one released it."""
    name = "frozen"
    lock = FairLock(r, name, watchdog_timeout=2.0)  # the live waiter parks 2 s at most
    holder = start(redis_server, "hold", name, "2.0")
    child = None
    try:
        until(lambda: r.exists("holder-up"), 60, "the holder")
        child = start(redis_server, "wait", name, "300")
        until(lambda: r.exists("dead-owner") and r.llen(lock.queue_key) == 1, 60, "child queued")
        frozen = r.get("dead-owner")

        def work() -> float:
            assert lock.try_lock(wait_time=60) is True
            got = server_ms(r)
            r.rpush("order", "w1")
            os.kill(child.pid, signal.SIGCONT)
            until(lambda: line(r, lock) == [frozen], what="the resumed one back in line")
            time.sleep(0.5)  # time to take a lock it believed its own
            r.rpush("order", "w1-out")
            lock.unlock()
            return got

        got1 = holders().submit(work)
        until(lambda: r.llen(lock.queue_key) == 2, what="w1 in line")
        os.kill(child.pid, signal.SIGSTOP)
        stopped = server_ms(r)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        t1 = got1(BOUND_S + 10)
        assert t1 >= stopped + TURN_MS  # the frozen one had its whole turn
        assert t1 - stopped < BOUND_S * 1000, t1 - stopped
        out, _ = child.communicate(timeout=30)
        assert "acquired" in out
        assert r.lrange("order", 0, -1) == [b"w1", b"w1-out", b"dead"]
        assert json.loads(r.lindex("dead-saw", 0)) == {frozen.decode(): "1"}
        assert gone(r, lock)
    finally:
        for p in (holder, child):
            if p is not None:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                    p.wait(30)
                p.stdout.close()


def test_a_redisson_waiter_keeps_its_deadline_and_a_turn_moves_no_score(r):
    """Direct script calls. A Redisson client's waiter (no mark) first in line keeps its
    allowance: ours behind it parks until its deadline. A head of ours gets a turn: the waiter
    behind parks until the turn's end, which drops the head once it has passed; the timeout
    zset's scores (Redisson's chain) are untouched by turns."""
    name, lease, wait = "mixed", 1_000_000, 300_000
    qkey, tkey, okey = (f"redisson_lock_queue:{{{name}}}", f"redisson_lock_timeout:{{{name}}}",
                        fair_ours(name))
    assert acquire(r, name, "holder:1", wait, lease) is None
    now = server_ms(r)
    r.zadd(tkey, {"java:1": now + lease + wait})  # Redisson's enqueue: no mark
    r.rpush(qkey, "java:1")
    assert acquire(r, name, "a:1", wait, lease) > 0  # ours: marked, its turn not begun
    assert acquire(r, name, "b:1", wait, lease) > 0
    assert r.hgetall(okey) == {b"a:1": b"0", b"b:1": b"0"}
    assert release(r, name, "holder:1", lease) == 1
    before = scores(r, name)
    assert acquire(r, name, "b:1", wait, lease) > lease - 1_000  # java's deadline, not a turn
    assert r.hgetall(okey) == {b"a:1": b"0", b"b:1": b"0"}
    # java gives up (its acquireFailed): a:1 is first, the lock free: its turn begins.
    r.lrem(qkey, 0, "java:1")
    r.zrem(tkey, "java:1")
    park = acquire(r, name, "b:1", wait, lease)
    assert TURN_MS - 200 <= park <= TURN_MS
    turn_end = int(r.hget(okey, "a:1"))
    assert turn_end == pytest.approx(server_ms(r) + TURN_MS, abs=200)
    assert {k: v for k, v in scores(r, name).items() if k != "java:1"} == {
        k: v for k, v in before.items() if k != "java:1"}
    assert 0 < acquire(r, name, "b:1", wait, lease) <= TURN_MS  # asking again: same turn
    assert int(r.hget(okey, "a:1")) == turn_end
    r.hset(okey, "a:1", int(server_ms(r)) - 1)  # its turn is over (as TURN_MS later)
    assert acquire(r, name, "b:1", wait, lease) is None  # a:1 dropped; b:1 takes the lock
    assert not r.exists(qkey, tkey, okey)


def test_a_lapsed_turn_drops_the_waiters_of_its_process_right_behind_it(r):
    """Direct script calls: a process dies with its waiters (threads of it, in a row). The
    attempt that drops the head whose turn lapsed drops them too, not one turn each; a waiter
    of another process behind them, and Redisson's, stay."""
    name, lease, wait = "proc", 1_000_000, 300_000
    okey = fair_ours(name)
    assert acquire(r, name, "holder:1", wait, lease) is None
    for owner in ("p:1", "p:2", "p:3", "q:1", "r:1"):
        assert acquire(r, name, owner, wait, lease) > 0
    assert release(r, name, "holder:1", lease) == 1  # p:1's turn begins
    assert int(r.hget(okey, "p:1")) > 0 and r.hget(okey, "p:2") == b"0"
    r.hset(okey, "p:1", int(server_ms(r)) - 1)  # its turn is over
    assert 0 < acquire(r, name, "r:1", wait, lease) <= TURN_MS  # p:1-3 gone, q:1's turn
    assert r.lrange(f"redisson_lock_queue:{{{name}}}", 0, -1) == [b"q:1", b"r:1"]
    assert set(r.hgetall(okey)) == {b"q:1", b"r:1"}
    assert int(r.hget(okey, "q:1")) > server_ms(r)
    assert acquire(r, name, "q:1", wait, lease) is None  # alive: it takes the lock


def test_no_turn_begins_or_ends_while_the_lock_is_held(r):
    """Direct script calls: waiters asking again and again behind a held lock never begin the
    head's turn, and a head whose turn lapsed (the lock taken by someone else meanwhile, a
    non-fair RLock of the same name) is not dropped while it is held; the release begins its
    turn anew."""
    name, lease, wait = "held", 1_000_000, 300_000
    qkey, okey = f"redisson_lock_queue:{{{name}}}", fair_ours(name)
    assert acquire(r, name, "holder:1", wait, lease) is None
    for owner in ("a:1", "b:1", "c:1"):
        assert acquire(r, name, owner, wait, lease) > 0
    for _ in range(3):
        for owner in ("c:1", "b:1"):
            assert acquire(r, name, owner, wait, lease) > lease - 1_000  # the holder's PTTL
    assert r.hgetall(okey) == {b"a:1": b"0", b"b:1": b"0", b"c:1": b"0"}
    r.hset(okey, "a:1", int(server_ms(r)) - 1)  # a turn of its that lapsed
    assert acquire(r, name, "b:1", wait, lease) > lease - 1_000
    assert r.lrange(qkey, 0, -1) == [b"a:1", b"b:1", b"c:1"]
    assert release(r, name, "holder:1", lease) == 1
    assert int(r.hget(okey, "a:1")) == pytest.approx(server_ms(r) + TURN_MS, abs=200)
    assert acquire(r, name, "a:1", wait, lease) is None


def test_a_turn_wakes_a_watcher_behind_a_long_run_of_its_process(r):
    """Direct script calls: 40 waiters of one process (a worker's threads, all killed with it)
    first in line, one of another process behind: the turn's start wakes that one, so the
    whole run costs one turn, not the live waiter's park bound (a lease)."""
    name, lease, wait = "run", 1_000_000, 300_000
    assert acquire(r, name, "holder:1", wait, lease) is None
    for n in range(1, 41):
        assert acquire(r, name, f"p:{n}", wait, lease) > 0
    assert acquire(r, name, "q:1", wait, lease) > 0
    counter = Counter(r, name)
    assert release(r, name, "holder:1", lease) == 1  # p:1's turn begins
    counts = counter.close()
    assert counts.get(f"{lock_channel(name)}:q:1") == 1, counts
    assert counts.get(f"{lock_channel(name)}:p:1") == 1, counts


def test_a_watcher_that_gives_up_hands_the_watch_on(r):
    """Direct script calls: the waiter woken to watch a head's turn gives up (its budget was
    short): the next waiter of another process is woken to watch in its place."""
    name, lease, wait = "watch", 1_000_000, 300_000
    assert acquire(r, name, "holder:1", wait, lease) is None
    for owner in ("d:1", "w:1", "x:1"):
        assert acquire(r, name, owner, wait, lease) > 0
    assert release(r, name, "holder:1", lease) == 1  # d:1's turn; w:1 watches
    counter = Counter(r, name)
    assert give_up(r, name, "w:1", wait) == 1
    counts = counter.close()
    assert counts.get(f"{lock_channel(name)}:x:1") == 1, counts


def test_a_live_waiter_dropped_with_its_process_head_is_told(r):
    """Direct script calls: the head's turn lapsed (its event loop blocked) and a live thread
    of its process right behind it is dropped with it: both are told, so the thread asks again
    at once and queues at the back rather than sleeping to its park bound."""
    name, lease, wait = "along", 1_000_000, 300_000
    assert acquire(r, name, "holder:1", wait, lease) is None
    for owner in ("a:1", "a:2", "b:1"):
        assert acquire(r, name, owner, wait, lease) > 0
    assert release(r, name, "holder:1", lease) == 1
    r.hset(fair_ours(name), "a:1", int(server_ms(r)) - 1)  # its turn is over
    counter = Counter(r, name)
    assert acquire(r, name, "b:1", wait, lease) is None  # a:1 and a:2 dropped; b:1 takes it
    counts = counter.close()
    assert counts.get(f"{lock_channel(name)}:a:2") == 1, counts
    assert acquire(r, name, "a:2", wait, lease) > 0  # alive: it queues again
    assert r.lrange(f"redisson_lock_queue:{{{name}}}", 0, -1) == [b"a:2"]
