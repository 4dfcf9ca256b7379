"""Semaphore / AsyncSemaphore: Redisson's RSemaphore (RedissonSemaphoreTest's behaviours)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio

from django_rlock.engine import pubsub
from django_rlock.engine.naming import index_key
from django_rlock.engine.semaphore import RECHECK, AsyncSemaphore, Semaphore

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def background(fn, *args):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


# -- RedissonSemaphoreTest -----------------------------------------------------------------------
def test_acquire_after_add_permits(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(1)
    t, out = background(sem.acquire, 2)
    time.sleep(0.3)
    assert t.is_alive()  # one permit is not two
    t0 = time.monotonic()
    sem.add_permits(1)
    t.join(3)
    assert not t.is_alive() and time.monotonic() - t0 < 3
    assert sem.available_permits() == 0


def test_zero(r):
    sem = Semaphore(r, "s")
    assert sem.try_acquire(0, 600)
    sem.release(0)
    assert sem.available_permits() == 0
    assert not r.exists("s")  # zero permits: nothing sent


def test_acquire_without_set_permits(r):
    sem = Semaphore(r, "s")
    sem.release()
    sem.release()
    sem.acquire(2)
    assert sem.available_permits() == 0


def test_try_set_permits(r):
    sem = Semaphore(r, "s")
    assert sem.try_set_permits(10)
    assert sem.available_permits() == 10
    assert not sem.try_set_permits(15)
    assert sem.available_permits() == 10


def test_add_permits(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(10)
    sem.acquire(10)
    assert sem.available_permits() == 0
    sem.add_permits(4)
    assert sem.available_permits() == 4
    sem.release(10)
    assert sem.available_permits() == 14
    sem.acquire(5)
    assert sem.available_permits() == 9


def test_reduce_permits(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(10)
    sem.acquire(10)
    sem.add_permits(-5)
    assert sem.available_permits() == -5
    sem.release(10)
    assert sem.available_permits() == 5
    sem.acquire(5)
    assert sem.available_permits() == 0


def test_blocking_acquire(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(1)
    sem.acquire()
    threading.Timer(0.3, sem.release).start()
    t0 = time.monotonic()
    sem.acquire()
    assert 0.2 < time.monotonic() - t0 < 3
    assert sem.available_permits() == 0


def test_blocking_n_acquire(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(5)
    sem.acquire(3)
    threading.Timer(0.2, sem.release).start()
    threading.Timer(0.4, sem.release).start()
    t, _ = background(sem.acquire, 4)
    t.join(5)
    assert not t.is_alive()
    assert sem.available_permits() == 0


def test_try_n_acquire_waits_its_budget(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(5)
    sem.acquire(3)
    t0 = time.monotonic()
    assert sem.try_acquire(4, wait_time=1) is False
    assert 0.9 < time.monotonic() - t0 < 3
    threading.Timer(0.3, sem.release, (2,)).start()
    assert sem.try_acquire(4, wait_time=30)
    assert sem.available_permits() == 0


def test_release_without_permits(r):
    sem = Semaphore(r, "s")
    sem.release()
    assert sem.available_permits() == 1


def test_drain_permits(r):
    sem = Semaphore(r, "s")
    assert sem.drain_permits() == 0
    sem.try_set_permits(10)
    sem.acquire(3)
    assert sem.drain_permits() == 7
    assert sem.available_permits() == 0


def test_release_acquire(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(10)
    sem.acquire()
    assert sem.available_permits() == 9
    sem.release()
    assert sem.available_permits() == 10
    sem.acquire(5)
    assert sem.available_permits() == 5
    sem.release(5)
    assert sem.available_permits() == 10


def test_with_takes_one_permit(r):
    sem = Semaphore(r, "s")
    sem.try_set_permits(2)
    with sem as same:
        assert same is sem
        assert sem.available_permits() == 1
    assert sem.available_permits() == 2
    with pytest.raises(KeyError), sem:
        raise KeyError
    assert sem.available_permits() == 2


def test_concurrency_threads(r):
    # RedissonSemaphoreTest's concurrency: 15 threads, one permit, a counter no two bump at once.
    sem = Semaphore(r, "c")
    sem.try_set_permits(1)
    seen: list[int] = []

    def work() -> None:
        for _ in range(10):
            with sem:
                seen.append(r.incr("inside"))
                r.decr("inside")

    threads = [threading.Thread(target=work) for _ in range(15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 150 and set(seen) == {1}
    assert sem.available_permits() == 1


# -- layout, messages, index ---------------------------------------------------------------------
def test_layout_channel_messages_and_index(r, redis_server):
    sem = Semaphore(r, "lay", prefix="p:")
    assert sem.key == "p:lay" and sem.channel == "redisson_sc:{p:lay}"
    sub = redis_server.client().pubsub()
    sub.subscribe("redisson_sc:{p:lay}")
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    assert sem.try_set_permits(3)
    assert not sem.try_set_permits(4)  # kept: no message
    sem.acquire(2)  # taking publishes nothing
    sem.release()
    sem.add_permits(5)
    sem.add_permits(-1)
    got = []
    while (m := sub.get_message(timeout=0.5)) is not None:
        got.append(m["data"])
    assert got == [b"3", b"2", b"7", b"6"]  # the permits now free, each time
    assert r.type("p:lay") == b"string" and r.get("p:lay") == b"6"
    entry = r.hget(index_key("p:"), "p:lay").decode()
    assert entry.split(" ", 1)[1] == '{"kind":"semaphore"}'
    assert sem.delete() and not r.exists("p:lay") and not r.hexists(index_key("p:"), "p:lay")
    sem.release()  # created again by a release: listed again
    assert r.hget(index_key("p:"), "p:lay").decode().endswith('{"kind":"semaphore"}')
    sub.close()


def test_bad_input_raises_before_any_command():
    dead = redis.Redis(unix_socket_path="/nonexistent")  # any command would fail to connect
    sem = Semaphore(dead, "bad")
    for call, exc in [
        (lambda: sem.acquire(-1), ValueError), (lambda: sem.acquire(True), TypeError),
        (lambda: sem.try_acquire(1.0), TypeError), (lambda: sem.try_acquire(1, -1), ValueError),
        (lambda: sem.try_acquire(1, "1"), TypeError), (lambda: sem.release(-2), ValueError),
        (lambda: sem.try_set_permits(-1), ValueError), (lambda: sem.add_permits(1.5), TypeError),
        (lambda: sem.add_permits(False), TypeError),
    ]:
        with pytest.raises(exc, match="'bad'"):
            call()
    for call, exc in [
        (lambda: Semaphore(dead, ""), ValueError), (lambda: Semaphore(dead, 3), TypeError),
        (lambda: Semaphore(dead, "x", prefix=1), TypeError),
        (lambda: Semaphore(object(), "x"), TypeError),
    ]:
        with pytest.raises(exc):
            call()
    with pytest.raises(ValueError, match=r"permits must be >= 0, got -1 \(semaphore 'bad'\)"):
        sem.acquire(-1)
    with pytest.raises(TypeError, match=r"permits must be an int, not bool \(semaphore 'bad'\)"):
        sem.release(True)


# -- waking ------------------------------------------------------------------------------------
def test_a_release_wakes_a_waiter_long_before_the_recheck(r):
    # A waiter learns of the release from its message: well inside its budget, which is
    # shorter than the re-check (without the publish it would give up).
    sem = Semaphore(r, "wake")
    sem.try_set_permits(1)
    sem.acquire()
    budget = RECHECK * 0.8
    threading.Timer(0.3, sem.release).start()
    t0 = time.monotonic()
    assert sem.try_acquire(1, wait_time=budget)
    assert time.monotonic() - t0 < budget - 0.5


def test_permits_set_by_hand_are_found_by_the_recheck(r):
    # No message (a count written by another client that does not publish): the waiter
    # re-checks within RECHECK and takes it; it never hangs.
    sem = Semaphore(r, "hand")
    t, out = background(sem.try_acquire, 1, RECHECK * 3)
    time.sleep(0.3)
    r.set("hand", 1)
    t0 = time.monotonic()
    t.join(RECHECK * 3)
    assert out == [True] and time.monotonic() - t0 <= RECHECK + 1


def test_a_message_wakes_as_many_waiters_as_it_carries(r):
    sem = Semaphore(r, "many")
    waiters = [background(sem.try_acquire, 1, 30) for _ in range(4)]
    deadline = time.monotonic() + 10
    mgr = None
    while time.monotonic() < deadline:
        mgr = pubsub.existing_manager(r)
        ch = mgr and mgr.channel(b"redisson_sc:{many}")
        if ch is not None and len(ch.queue) == 4 and ch.confirmed.is_set():
            break
        time.sleep(0.01)
    t0 = time.monotonic()
    sem.release(3)  # one message "3": three waiters retry and take a permit each
    while sum(bool(out) for _, out in waiters) < 3 and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    assert time.monotonic() - t0 < RECHECK * 0.8  # woken by the message, not found by re-checks
    assert sum(bool(out) and out[0] for _, out in waiters) == 3
    sem.release()
    for t, _ in waiters:
        t.join(10)
    assert all(out == [True] for _, out in waiters)


def test_never_over_subscribed_4_processes_x_4_threads(r, redis_server):
    sem = Semaphore(r, "over")
    sem.try_set_permits(4)
    rounds = 15
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine._sem_proc", "sem",
                               redis_server.socket, "over", "4", str(rounds)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        done.append(json.loads(out))
    assert done == [4 * rounds] * 4
    assert 2 <= int(r.get("peak")) <= 4  # contended, never more than the four permits
    assert int(r.get("in")) == 0
    assert sem.available_permits() == 4


# -- AsyncSemaphore --------------------------------------------------------------------------
def test_async_semaphore(ar, r):
    async def main() -> None:
        sem = AsyncSemaphore(ar, "as")
        assert await sem.try_set_permits(2)
        assert not await sem.try_set_permits(3)
        await sem.acquire(2)
        assert await sem.try_acquire() is False
        assert await sem.available_permits() == 0
        asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(sem.release()))
        t0 = time.monotonic()
        assert await sem.try_acquire(1, wait_time=RECHECK * 0.8)
        assert time.monotonic() - t0 < RECHECK * 0.8 - 0.5
        await sem.release(2)
        async with sem:
            assert await sem.available_permits() == 1
        assert await sem.available_permits() == 2
        assert await sem.drain_permits() == 2
        await sem.add_permits(-1)
        assert await sem.available_permits() == -1
        with pytest.raises(ValueError):
            await sem.acquire(-1)
        assert await sem.delete()
        await ar.aclose()

    asyncio.run(main())
    assert not r.exists("as")


def test_async_waiters_on_one_loop_share_permits(ar, r):
    async def main() -> None:
        sem = AsyncSemaphore(ar, "aw")
        await sem.try_set_permits(1)
        inside = 0
        peak = 0

        async def work() -> None:
            nonlocal inside, peak
            for _ in range(5):
                async with sem:
                    inside += 1
                    peak = max(peak, inside)
                    await asyncio.sleep(0.005)
                    inside -= 1

        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(6))), 60)
        assert peak == 1
        assert await sem.available_permits() == 1
        await ar.aclose()

    asyncio.run(main())


def test_a_cancelled_waiting_acquire_never_loses_a_permit(ar, r):
    """The waiter is woken and its acquire is in flight (held up by CLIENT PAUSE) when it is
    cancelled: the round trip lands and takes the permit, and the permit is given back."""

    async def main() -> None:
        sem = AsyncSemaphore(ar, "cancel")
        task = asyncio.ensure_future(sem.acquire())
        mgr = None
        for _ in range(500):
            mgr = pubsub.existing_manager(sem._sync_client)
            ch = mgr and mgr.channel(b"redisson_sc:{cancel}")
            if ch is not None and ch.queue and ch.confirmed.is_set():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # parked
        r.set("cancel", 1)  # a permit, and no message...
        r.client_pause(1500, all=False)  # ...and every script waits
        mgr.wake(b"redisson_sc:{cancel}", b"1")  # the waiter sends its acquire now
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await sem.available_permits() == 1  # taken by the landed acquire, given back
        assert await sem.try_acquire()
        await ar.aclose()

    asyncio.run(main())
    assert r.get("cancel") == b"0"


def test_a_cancelled_parked_acquire_leaves_nothing_behind(ar, r):
    async def main() -> None:
        sem = AsyncSemaphore(ar, "parked")
        task = asyncio.ensure_future(sem.acquire(2))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sem.release(2)
        assert await sem.available_permits() == 2
        mgr = pubsub.existing_manager(sem._sync_client)
        ch = mgr.channel(b"redisson_sc:{parked}")
        assert ch is None or not ch.queue
        await ar.aclose()

    asyncio.run(main())
