"""AsyncRLock: task-scoped ownership on one event loop, same layout and semantics."""

from __future__ import annotations

import asyncio
import gc
import re
import time
import weakref

import pytest
import redis.asyncio

from django_rlock import AsyncRLock, LockNotOwnedError, RLock
from django_rlock.engine.clients import sync_twin
from django_rlock.engine.watchdog import server_id
from tests.conftest import script_calls


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def run(coro):
    return asyncio.run(coro)


def test_concurrent_tasks_are_different_owners(ar, r):
    async def main():
        lock = AsyncRLock(ar, "tasks")
        holding = asyncio.Event()
        done = asyncio.Event()

        async def holder():
            await lock.lock()
            holding.set()
            await done.wait()
            await lock.unlock()

        t = asyncio.create_task(holder())
        await holding.wait()
        # Same thread, same loop, same lock object: still not the owner.
        assert await lock.try_lock() is False
        assert await lock.hold_count() == 0
        with pytest.raises(LockNotOwnedError):
            await lock.unlock()
        done.set()
        await t
        assert not await lock.is_locked()
        await ar.aclose()

    run(main())


def test_reentrancy_and_layout(ar, r):
    async def main():
        lock = AsyncRLock(ar, "layout", prefix="p:")
        await lock.lock()
        await lock.lock()
        assert await lock.hold_count() == 2 and await lock.is_held_by_current_task()
        ((field, count),) = r.hgetall("p:layout").items()
        assert re.fullmatch(rb"[0-9a-f-]{36}:\d+", field) and count == b"2"
        assert 29_000 < r.pttl("p:layout") <= 30_000

        async def child():  # a child task is another owner
            return await lock.try_lock()

        assert await asyncio.create_task(child()) is False
        await lock.unlock()
        assert await lock.hold_count() == 1
        await lock.unlock()
        assert not r.exists("p:layout")
        await ar.aclose()

    run(main())


def test_twenty_concurrent_tasks_never_overlap_and_do_not_poll(ar, r):
    async def main():
        lock = AsyncRLock(ar, "twenty")
        inside, worst = 0, 0

        async def work():
            nonlocal inside, worst
            for _ in range(5):
                async with lock:
                    inside += 1
                    worst = max(worst, inside)
                    await asyncio.sleep(0.002)
                    inside -= 1

        await asyncio.gather(*(work() for _ in range(20)))
        assert worst == 1
        await ar.aclose()

    r.config_resetstat()
    run(main())
    # 100 acquisitions: one release each, and hand-offs inside the process need no attempt.
    assert script_calls(r) <= 100 * 2.5


def test_waiting_does_not_block_the_event_loop(ar, r, holders):
    lock_sync = RLock(r, "loop")
    h = holders()
    h.call(lambda: lock_sync.lock())

    async def main():
        lock = AsyncRLock(ar, "loop")
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())

        async def take():
            await lock.lock()
            held = await lock.is_held_by_current_task()
            await lock.unlock()
            return held

        waiter = asyncio.create_task(take())
        await asyncio.sleep(1.0)
        assert not waiter.done() and ticks > 50  # the loop kept running while we waited
        await asyncio.to_thread(h.call, lock_sync.unlock)  # a thread hands off to the task
        start = time.monotonic()
        assert await asyncio.wait_for(waiter, 5) is True
        assert time.monotonic() - start < 2
        t.cancel()
        await ar.aclose()

    run(main())


def test_cancelled_waiter_leaves_no_trace(ar, r):
    async def main():
        lock = AsyncRLock(ar, "cancel")
        await lock.lock()

        async def other():
            await lock.lock()

        waiter = asyncio.create_task(other())
        await asyncio.sleep(0.3)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await lock.unlock()
        assert not r.exists("cancel")  # nobody was handed the lock
        assert await lock.try_lock() is True
        await lock.unlock()
        await ar.aclose()

    run(main())


def test_watchdog_renews_async_locks_and_lease_expires(ar, r):
    async def main():
        lock = AsyncRLock(ar, "renew", watchdog_timeout=1.0)
        await lock.lock()
        await asyncio.sleep(2.5)
        assert r.pttl("renew") > 0 and not lock.is_lost()
        await lock.unlock()
        leased = AsyncRLock(ar, "leased")
        await leased.lock(lease_time=0.3)
        assert await leased.try_lock(wait_time=0, lease_time=0.3) is True  # reentrant
        await asyncio.sleep(0.6)
        with pytest.raises(LockNotOwnedError):
            await leased.unlock()
        await ar.aclose()

    run(main())


def test_try_lock_budget_and_force_unlock_wakes(ar, r, holders):
    lock_sync = RLock(r, "budget")
    holders().call(lambda: lock_sync.lock())

    async def main():
        lock = AsyncRLock(ar, "budget")
        start = time.monotonic()
        assert await lock.try_lock(wait_time=0.5) is False
        assert 0.45 < time.monotonic() - start < 3
        async def take():
            got = await lock.try_lock(wait_time=10)
            await lock.unlock()
            return got

        waiter = asyncio.create_task(take())
        await asyncio.sleep(0.3)
        assert await lock.force_unlock() is True
        assert await asyncio.wait_for(waiter, 5) is True
        await ar.aclose()

    run(main())


def test_bad_input_before_any_command(ar, r):
    async def main():
        with pytest.raises(ValueError):
            AsyncRLock(ar, "")
        with pytest.raises(TypeError):
            AsyncRLock(ar, 5)
        lock = AsyncRLock(ar, "bad")
        with pytest.raises(ValueError, match="'bad'"):
            await lock.lock(lease_time=0)
        with pytest.raises(ValueError, match="'bad'"):
            await lock.try_lock(wait_time=-1)
        await ar.aclose()

    r.config_resetstat()
    run(main())
    assert script_calls(r) == 0


def test_sync_twin_is_the_same_server(ar, r):
    assert server_id(sync_twin(ar)) == server_id(r)


def test_a_cancelled_acquire_that_lands_later_is_given_back(own_server):
    admin = own_server.client()
    ar = redis.asyncio.Redis(unix_socket_path=own_server.socket)

    async def main():
        lock = AsyncRLock(ar, "late")
        assert await lock.try_lock()  # loads the script, then free it again
        await lock.unlock()
        admin.client_pause(600, all=False)  # the next acquire waits in the server
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await lock.try_lock()
        await asyncio.sleep(1.2)  # the pause ends, the acquire runs, and is given back
        assert not admin.exists("late")
        await ar.aclose()

    run(main())
    admin.close()


def test_a_hold_left_by_a_finished_task_is_released(ar, r, caplog):
    """asyncio.wait_for (3.11) runs lock() in a task of its own: that task owns the lock and
    ends at once. Its hold must not be renewed forever."""

    async def main():
        lock = AsyncRLock(ar, "orphan", watchdog_timeout=1.0)
        await asyncio.wait_for(lock.lock(), 5)
        with pytest.raises(LockNotOwnedError):
            await lock.unlock()  # we are not the task that took it
        await asyncio.sleep(0.3)
        assert not await lock.is_locked()
        await ar.aclose()

    run(main())
    assert any("finished without unlocking" in rec.getMessage() for rec in caplog.records)


def test_a_task_that_locks_in_a_loop_gets_one_done_callback_not_one_per_hold(ar, r, caplog):
    """The watch for a task that ends holding a lock is one callback per task: one per hold
    piled up on a long-lived task (a consumer loop) with every hold it ever had. It still
    releases what the task left held when it ends."""

    async def body(locks):
        task = asyncio.current_task()
        before = len(task._callbacks or ())  # (CPython's Future keeps them there)
        for _ in range(50):
            for lock in locks:
                await lock.lock()
            for lock in locks:
                await lock.unlock()
        after = len(task._callbacks or ())
        await locks[0].lock()  # left held: released when the task ends
        return after - before

    async def main():
        locks = [AsyncRLock(ar, "cb-loop-1"), AsyncRLock(ar, "cb-loop-2")]
        assert await asyncio.ensure_future(body(locks)) == 1
        await asyncio.sleep(0.2)
        assert not await locks[0].is_locked()
        await ar.aclose()

    run(main())
    assert any("finished without unlocking" in rec.getMessage() for rec in caplog.records)


def test_a_long_lived_task_keeps_nothing_of_the_distinct_locks_it_released(ar):
    """A consumer task that takes and releases many distinct locks: once a hold ends, nothing
    of it (nor its lock object) stays referenced until the task ends."""

    async def main():
        refs = []
        for i in range(20):
            lock = AsyncRLock(ar, f"distinct-{i}")
            await lock.lock()
            await lock.unlock()
            refs.append(weakref.ref(lock))
            del lock
        gc.collect()
        alive = sum(ref() is not None for ref in refs)
        await ar.aclose()
        return alive

    assert run(main()) == 0
