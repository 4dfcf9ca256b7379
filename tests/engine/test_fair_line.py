"""FairLock's line (``redisson_lock_queue:{k}``, ``redisson_lock_timeout:{k}``) never outlives its
last deadline: with one fair lock per object, a line whose waiters died must not stay in Redis
for ever (a user audit found one per dead waiter, with no TTL)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio

from django_rlock import LockNotOwnedError
from django_rlock.engine.fair import LINE_SLACK_MS, AsyncFairLock, FairLock
from django_rlock.engine.naming import waiting_key
from tests.conftest import inner_commands
from tests.engine.test_fair import server_ms, sigkill_queued_waiter, until

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def qkey(name: str) -> str:
    return f"redisson_lock_queue:{{{name}}}"


def tkey(name: str) -> str:
    return f"redisson_lock_timeout:{{{name}}}"


def line_problem(r: redis.Redis, name: str) -> str | None:
    """What is wrong with the line's expiry, read in one MULTI (so between two scripts): both
    keys expire at the last deadline plus the slack (a deadline already passed: within the
    slack); a line that is gone has neither key."""
    pipe = r.pipeline(transaction=True)
    pipe.time()
    pipe.zrange(tkey(name), -1, -1, withscores=True)
    pipe.pttl(qkey(name))
    pipe.pttl(tkey(name))
    pipe.llen(qkey(name))
    (s, us), last, pq, pt, n = pipe.execute()
    now = s * 1000 + us / 1000
    if not last:
        return None if (n, pq, pt) == (0, -2, -2) else f"no deadline; llen {n}, pttl {pq}/{pt}"
    if pq == -1 or pt == -1:
        return f"no expiry: pttl {pq}/{pt}, llen {n}"
    score = last[0][1]
    if math.ceil(score) > now:
        want = math.ceil(score) + LINE_SLACK_MS - now
        ok = all(abs(p - want) <= 2 for p in (pq, pt))
    else:
        ok = all(0 <= p <= LINE_SLACK_MS for p in (pq, pt))
    return None if ok else f"pttl {pq}/{pt}, last deadline in {score - now:.0f} ms"


def no_key_without_expiry(r: redis.Redis) -> list[bytes]:
    return [k for k in r.keys("*") if r.ttl(k) == -1]


def test_a_sigkilled_waiters_line_goes_once_its_deadline_has_passed(r, redis_server, holders):
    # The audit's run: a holder, a waiter SIGKILLed in line, a live waiter whose budget runs
    # out behind it, then the holder releases and nobody takes the lock again.
    name = "gone"
    holder = holders()
    lock = FairLock(r, name, watchdog_timeout=1.0, thread_wait_time=4.0)
    holder.call(lock.lock)
    sigkill_queued_waiter(r, redis_server.socket, name, "4.0", qkey(name))
    r.delete("dead-owner")
    dead = r.lindex(qkey(name), 0)
    deadline = r.zscore(tkey(name), dead)
    assert holders().call(lambda: lock.try_lock(wait_time=0.3)) is False  # gave up behind it
    holder.call(lock.unlock)  # wakes the dead one, which never comes
    assert r.lrange(qkey(name), 0, -1) == [dead]
    assert line_problem(r, name) is None  # its keys expire at its deadline plus the slack
    assert server_ms(r) < deadline  # (so the release could not prune it)
    until(lambda: server_ms(r) > deadline + LINE_SLACK_MS + 50, 30, "the deadline and slack")
    assert not r.exists(qkey(name), tkey(name), name)
    assert no_key_without_expiry(r) == []
    # The name is as new: taken at once.
    again = FairLock(r, name)
    assert again.try_lock(0) is True
    again.unlock()  # no hold left for the watchdog to renew in later tests


def test_no_fair_key_is_ever_left_without_its_expiry_in_a_mixed_run(r, ar, holders):
    """Acquire, wait, give up, no-wait, reentry, release, force unlock, an asyncio waiter
    cancelled: a sampler reads the line between scripts all along, and every time both keys
    expire at the last deadline plus the slack (so they move with the deadlines' shifts)."""
    name = "mx"
    lock = FairLock(r, name, thread_wait_time=20)
    problems: list[str] = []
    samples = [0]
    stop = threading.Event()

    def sample() -> None:
        s = redis.Redis(connection_pool=r.connection_pool)
        while not stop.is_set():
            p = line_problem(s, name)
            samples[0] += 1
            if p:
                problems.append(p)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    h = holders()
    h.call(lock.lock)
    w1, w2, w3, w4 = (holders() for _ in range(4))
    got1 = w1.submit(lambda: lock.lock())  # no budget: allowance thread_wait_time
    until(lambda: r.llen(qkey(name)) == 1)
    gave_up = w2.submit(lambda: lock.try_lock(wait_time=1.0))  # allowance 1 s, gives up
    until(lambda: r.llen(qkey(name)) == 2)
    got3 = w3.submit(lambda: lock.try_lock(wait_time=60))
    until(lambda: r.llen(qkey(name)) == 3)
    assert w4.call(lambda: lock.try_lock(0)) is False  # no-wait: never queues
    assert gave_up() is False
    assert r.llen(qkey(name)) == 2
    h.call(lock.lock)  # reentry while others wait
    h.call(lock.unlock)
    h.call(lock.unlock)  # w1 takes it: the deadline behind moves up by w1's allowance
    got1()
    assert r.llen(qkey(name)) == 1

    async def cancelled_waiter() -> None:
        alock = AsyncFairLock(ar, name, thread_wait_time=20)
        others = set(await ar.hkeys(waiting_key(name)))
        task = asyncio.create_task(alock.lock())
        while not (mine := set(await ar.hkeys(waiting_key(name))) - others):
            await asyncio.sleep(0.01)  # in line and recorded (invariant 41)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        token = mine.pop()
        while await ar.hexists(waiting_key(name), token):
            await asyncio.sleep(0.01)  # its record out: nothing of it left in flight
        await ar.aclose()

    asyncio.run(cancelled_waiter())
    assert r.llen(qkey(name)) == 1
    assert FairLock(r, name).force_unlock() is True  # w3, head, is woken and takes it
    assert got3() is True
    assert not r.exists(qkey(name), tkey(name))
    w3.call(lock.unlock)
    with pytest.raises(LockNotOwnedError):  # w1's hold, forced: forgotten, not renewed later
        w1.call(lock.unlock)
    stop.set()
    sampler.join(10)
    assert samples[0] > 50
    assert problems == []
    assert no_key_without_expiry(r) == []


def test_a_line_another_client_left_without_expiry_gets_one_from_our_next_script(r, holders):
    """Redisson's scripts (Java, Node, our versions before this one) never set an expiry on
    the line. Our next script on that lock gives it one; a Redisson waiter that joins later,
    with a later deadline, is covered again by our next script after it."""
    name = "java"
    now = server_ms(r)
    r.zadd(tkey(name), {"java-a:1": now + 5_000})
    r.rpush(qkey(name), "java-a:1")
    lock = FairLock(r, name)
    assert lock.try_lock(0) is False  # someone waits: a no-wait attempt never barges
    assert line_problem(r, name) is None
    r.zadd(tkey(name), {"java-b:1": now + 60_000})  # Redisson's enqueue: no expiry set
    r.rpush(qkey(name), "java-b:1")
    assert r.pttl(qkey(name)) < 10_000  # would go before java-b's deadline...
    assert lock.try_lock(0) is False
    assert line_problem(r, name) is None  # ...until our next script runs
    assert r.pttl(qkey(name)) > 55_000


def test_an_uncontended_fair_pair_spends_nothing_on_the_line(r):
    """With nobody in line the line costs one LINDEX per script (the head read by the prune is
    the one the rest of the script uses): no expiry is set, read or kept."""
    lock = FairLock(r, "cheap")
    lock.lock()
    lock.unlock()  # scripts loaded, replica count probed
    r.config_resetstat()
    lock.lock()
    lock.unlock()
    assert inner_commands(r) == {"time": 2, "lindex": 2, "exists": 2, "hincrby": 2, "pexpire": 1,
                     "hset": 1, "hexists": 1, "del": 1, "hdel": 1}
