"""Owners that end: a thread (or task) that ends holding never passes its lock on.

Python reuses ``threading.get_ident()`` as soon as a thread ends, and Django's runserver starts
a thread per request: with the OS thread id in the hash field, the next request's thread would
see a dead thread's lock as its own, re-enter it and unlock it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis
import redis.asyncio

from django_rlock import AsyncRLock, LockNotOwnedError, RLock
from django_rlock.engine import identity, pubsub


def _run_in_thread(fn, name: str | None = None):
    out: dict = {}

    def body() -> None:
        out["ident"] = threading.get_ident()
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join(30)
    return out


def _wait_gone(r, key: str, limit: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if not r.exists(key):
            return time.monotonic() - start
        time.sleep(0.01)
    return None


def test_a_thread_that_ends_holding_passes_nothing_on_and_its_lock_is_freed(r, caplog):
    caplog.set_level(logging.WARNING, logger="django_rlock")
    # Renewal period 1 s: released by the watchdog well before its 3 s lease could run out
    # (a shorter lease could expire by itself on a slow machine, proving nothing).
    lock = RLock(r, "dead-thread", watchdog_timeout=3.0)
    first = _run_in_thread(lock.lock, name="doomed-request")
    assert "error" not in first and r.exists("dead-thread")

    def successor():
        return {"reused_ident": threading.get_ident() == first["ident"],
                "held": lock.is_held_by_current_thread(), "count": lock.hold_count(),
                "unlock": _raises(lock.unlock, LockNotOwnedError),
                "reenter": lock.try_lock()}

    seen = _run_in_thread(successor)["result"]
    # The new thread (very likely on the same OS thread id) holds nothing and cannot take it.
    assert seen["held"] is False and seen["count"] == 0
    assert seen["unlock"] is True and seen["reenter"] is False
    # Released at the watchdog's next due time: a period (1 s) plus a tick, not by its lease.
    freed = _wait_gone(r, "dead-thread", 5.0)
    assert freed is not None and freed < 2.5, freed

    def told() -> bool:
        return any("dead-thread" in rec.getMessage() and "doomed-request" in rec.getMessage()
                   and "ended without unlocking" in rec.getMessage() for rec in caplog.records)

    # The watchdog logs after its release script's reply: the key can be seen gone first.
    deadline = time.monotonic() + 5.0
    while not told() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert told()


def _raises(fn, exc_type) -> bool:
    try:
        fn()
    except exc_type:
        return True
    return False


def test_waiters_are_woken_when_a_dead_threads_hold_is_released(r, holders):
    lock = RLock(r, "dead-wakes", watchdog_timeout=3.0)  # lease 3 s, released within ~1 s
    assert "error" not in _run_in_thread(lock.lock, name="doomed")
    start = time.monotonic()
    # Without a wake-up the waiter would sleep on the 3 s PTTL, past its 2.5 s budget.
    got = holders().call(lambda: RLock(r, "dead-wakes").try_lock(wait_time=2.5))
    elapsed = time.monotonic() - start
    assert got is True and elapsed < 2.4, elapsed
    # The waiter (a live thread) holds it now; let go by force before its thread is closed.
    RLock(r, "dead-wakes").force_unlock()


def test_a_reused_pool_thread_is_still_the_same_owner(r):
    lock = RLock(r, "pool", watchdog_timeout=0.9)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lock.lock).result()
        time.sleep(1.2)  # four renewal periods: a live thread's hold is renewed, not released
        assert pool.submit(lock.is_held_by_current_thread).result() is True
        assert pool.submit(lock.hold_count).result() == 1
        pool.submit(lock.lock).result()  # reentrant across calls
        assert pool.submit(lock.hold_count).result() == 2
        pool.submit(lock.unlock).result()
        pool.submit(lock.unlock).result()
    assert not r.exists("pool")


def test_a_dead_threads_lease_hold_expires_and_is_never_inherited(r):
    lock = RLock(r, "dead-lease", watchdog_timeout=0.9)
    assert "error" not in _run_in_thread(lambda: lock.lock(lease_time=1.0))

    def successor():
        before = (lock.hold_count(), lock.try_lock())
        gone = _wait_gone(r, "dead-lease", 3.0)
        after = lock.try_lock()
        if after:
            lock.unlock()
        return before, gone, after

    before, gone, after = _run_in_thread(successor)["result"]
    assert before == (0, False)
    assert gone is not None and 0.3 < gone < 1.6  # by its lease, not earlier
    assert after is True


def test_serials_are_never_reused_and_tasks_never_clash_with_threads():
    owners = {_run_in_thread(identity.thread_owner)["result"] for _ in range(50)}
    assert len(owners) == 50

    async def tasks():
        return await asyncio.gather(*(asyncio.create_task(_task_owner()) for _ in range(20)))

    task_owners = set(asyncio.run(tasks()))
    assert len(task_owners) == 20 and not task_owners & owners
    assert identity.thread_owner() not in task_owners


async def _task_owner() -> str:
    return identity.task_owner()


def test_a_task_that_ends_holding_is_released_and_passes_nothing_on(redis_server, r, caplog):
    caplog.set_level(logging.WARNING, logger="django_rlock")

    async def main():
        ar = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ar, "dead-task", watchdog_timeout=3.0)

        async def request():
            await lock.lock()  # and the task ends without unlocking

        await asyncio.create_task(request(), name="doomed-task")
        dead = set(await ar.hkeys("dead-task"))  # the ended task's field, unless released yet

        async def successor():
            before = (await lock.hold_count(), await lock.is_held_by_current_task())
            got = await lock.try_lock()
            fields = await ar.hgetall("dead-task")
            if got:
                await lock.unlock()
            return before, got, fields

        seen = await asyncio.create_task(successor())
        await asyncio.sleep(0.3)
        gone = not await lock.is_locked()
        await ar.aclose()
        return dead, seen, gone

    dead, (before, got, fields), gone = asyncio.run(main())
    assert before == (0, False)  # a new task is a new owner: nothing was passed on
    if got:
        # The ended task's hold was released first; the successor's is a new hold of its own.
        assert len(fields) == 1 and not set(fields) & dead and list(fields.values()) == [b"1"]
    else:
        assert set(fields) == dead  # still the ended task's, until its release lands
    assert gone  # released at once, well before its 3 s lease
    assert any("dead-task" in rec.getMessage() and "finished without unlocking" in rec.getMessage()
               for rec in caplog.records)


def test_a_hand_off_whose_outcome_hangs_has_a_deadline(redis_server, r, holders, monkeypatch, caplog):
    """The releaser's reply is lost in the network for longer than the heir will wait for it.
    The heir stops waiting for that outcome after HANDOFF_TIMEOUT and claims the lock itself
    (the hand-off did land), without counting it twice; the late outcome changes nothing.

    The heir is a waiter that parked without an attempt (another of its process's threads
    was already waiting), so it is not in the hand-off queue in Redis: only the in-process
    hand-off can reach it."""
    from tests.faultproxy import FaultProxy

    monkeypatch.setattr(pubsub, "HANDOFF_TIMEOUT", 0.5)
    caplog.set_level(logging.WARNING, logger="django_rlock")
    proxy = FaultProxy(redis_server.socket)
    # Database 3: this client's pub/sub connection (named per database) never counts as one of
    # the db-0 subscriptions other tests count, even if the proxy leaves it half-open.
    slow = redis.Redis(port=proxy.port, db=3)
    # One client (one server id): the releaser hands over only to waiters of its own manager.
    first_lock, releaser_lock, heir_lock = (RLock(slow, "hangs") for _ in range(3))
    first, releaser, heir = holders(), holders(), holders()
    first.call(first_lock.lock)
    got_releaser = releaser.submit(lambda: releaser_lock.try_lock(wait_time=10))
    time.sleep(0.4)  # in line in Redis, parked
    start = time.monotonic()
    got = heir.submit(lambda: (heir_lock.try_lock(wait_time=10), time.monotonic()))
    time.sleep(0.3)  # parked behind it, without an attempt
    first.call(first_lock.unlock)  # granted to the one in line
    assert got_releaser(5) is True
    time.sleep(0.3)  # the grant's message has come and gone: the delay hits the release reply
    proxy.delay_next_reply = 3.0
    released = releaser.submit(releaser_lock.unlock)
    ok, when = got(10)
    assert ok is True and when - start < 0.6 + 2.0, when - start
    db3 = redis.Redis(unix_socket_path=redis_server.socket, db=3)
    assert db3.hget("hangs", heir.call(identity.thread_owner)) == b"1"  # claimed, not counted twice
    released(10)  # the late reply arrives: the hand-off is settled behind the heir's back
    assert db3.hexists("hangs", heir.call(identity.thread_owner))
    heir.call(heir_lock.unlock)
    assert not db3.exists("hangs")
    db3.close()
    assert any("still unsettled" in rec.getMessage() for rec in caplog.records)
    proxy.close()
    slow.close()
