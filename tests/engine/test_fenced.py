"""FencedLock / AsyncFencedLock: Redisson's RFencedLock (tokens from an INCR on every acquire)."""

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

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine.fenced import AsyncFencedLock, FencedLock
from django_rlock.engine.identity import thread_owner
from django_rlock.engine.naming import index_key

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def test_token_increase(r):
    # RedissonFencedLockTest.testTokenIncrease: 1, 2, lock() -> 3, lock(10 s) -> 4, try -> 5.
    lock = FencedLock(r, "lock")
    assert lock.get_token() is None
    assert lock.lock_and_get_token() == 1
    lock.unlock()
    assert lock.lock_and_get_token() == 2
    lock.unlock()
    lock.lock()
    assert lock.get_token() == 3
    lock.unlock()
    lock.lock(lease_time=10)
    assert lock.get_token() == 4
    lock.unlock()
    assert lock.try_lock_and_get_token() == 5
    lock.unlock()
    assert lock.try_lock()
    assert lock.get_token() == 6  # plain try_lock counts too
    lock.unlock()
    assert not lock.is_locked()


def test_a_reentrant_acquire_gets_a_new_larger_token(r):
    lock = FencedLock(r, "re")
    assert lock.lock_and_get_token() == 1
    assert lock.lock_and_get_token() == 2
    lock.lock()
    assert lock.get_token() == 3
    assert lock.try_lock_and_get_token(lease_time=5) == 4
    assert lock.hold_count() == 4
    for _ in range(4):
        lock.unlock()
    assert not lock.is_locked()
    with pytest.raises(LockNotOwnedError):
        lock.unlock()


def test_a_failed_attempt_hands_out_no_token_and_a_wait_gets_the_next(r, holders):
    lock = FencedLock(r, "busy")
    h = holders()
    assert h.call(lock.lock_and_get_token) == 1
    assert lock.try_lock_and_get_token() is None  # one attempt
    assert lock.try_lock() is False
    assert lock.try_lock_and_get_token(wait_time=0.2) is None  # a timed-out wait
    assert lock.get_token() == 1  # refused attempts raised nothing
    threading.Timer(0.3, lambda: h.call(lock.unlock)).start()
    assert lock.try_lock_and_get_token(wait_time=30) == 2
    lock.unlock()


def test_lock_and_get_token_honours_the_lease(r):
    lock = FencedLock(r, "lease", watchdog_timeout=30)
    assert lock.lock_and_get_token(lease_time=3) == 1
    assert 2_000 < r.pttl("lease") <= 3_000
    lock.unlock()
    assert lock.lock_and_get_token() == 2
    assert 29_000 < r.pttl("lease") <= 30_000  # watchdog mode
    lock.unlock()


def test_an_expired_lease_lets_the_next_holder_in_with_a_larger_token(r, holders):
    lock = FencedLock(r, "exp")
    h = holders()
    t1 = h.call(lambda: lock.lock_and_get_token(lease_time=0.2))
    t2 = lock.lock_and_get_token()  # waits for the lease to run out (no message comes)
    assert t2 > t1
    lock.unlock()
    with pytest.raises(LockNotOwnedError):
        h.call(lock.unlock)


def test_layout_redisson_names_and_kind_in_the_index(r):
    lock = FencedLock(r, "doc", prefix="app:")
    lock.lock()
    assert r.hgetall("app:doc") == {thread_owner().encode(): b"1"}
    assert r.get("redisson_lock_token:{app:doc}") == b"1"
    assert r.ttl("redisson_lock_token:{app:doc}") == -1  # no expiry, ever
    entry = json.loads(r.hget(index_key("app:"), "app:doc").decode().split(" ", 1)[1])
    assert entry["kind"] == "fenced" and entry["owner"] == thread_owner()
    assert RLock(r, "doc", prefix="app:").is_held_by_current_thread()  # the same hash
    lock.unlock()
    assert not r.exists("app:doc") and not r.hexists(index_key("app:"), "app:doc")
    assert r.get("redisson_lock_token:{app:doc}") == b"1"  # outlives the lock
    tagged = FencedLock(r, "{user:1}doc")
    assert tagged.lock_and_get_token() == 1
    assert r.get("redisson_lock_token:{user:1}doc") == b"1"  # keeps the hash tag
    tagged.unlock()


def test_a_holder_whose_key_has_no_expiry_is_not_a_grant(r):
    # Redisson reads the PTTL -1 of such a key as "acquired"; here it is someone's lock.
    r.hset("forever", "other-client:1", 1)
    lock = FencedLock(r, "forever")
    assert lock.try_lock_and_get_token() is None
    assert lock.try_lock_and_get_token(wait_time=0.2) is None
    assert lock.get_token() is None
    assert r.hgetall("forever") == {b"other-client:1": b"1"}


def test_excludes_rlock_holders_of_the_same_name(r, holders):
    h = holders()
    plain = RLock(r, "mixed")
    h.call(plain.lock)
    fenced = FencedLock(r, "mixed")
    assert fenced.try_lock_and_get_token() is None
    h.call(plain.unlock)
    assert fenced.try_lock_and_get_token() == 1
    assert h.call(lambda: plain.try_lock()) is False
    fenced.unlock()


def test_a_waiter_is_never_granted_by_an_rlock_release_in_its_process(r, holders):
    # RLock's release hands the lock to this process's first waiter on the channel; for a
    # fenced waiter that grant skipped the token (and held nothing): it must acquire itself.
    h = holders()
    plain = RLock(r, "mixh")
    h.call(plain.lock)
    fenced = FencedLock(r, "mixh")
    waiter = holders()
    got = waiter.submit(lambda: fenced.try_lock_and_get_token(wait_time=30))
    deadline = time.monotonic() + 30
    while r.pubsub_numsub("redisson_lock__channel:{mixh}")[0][1] == 0:  # it is waiting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    h.call(plain.unlock)
    assert got(30) == 1
    assert waiter.call(fenced.is_held_by_current_thread)
    assert waiter.call(fenced.hold_count) == 1
    waiter.call(fenced.unlock)
    assert not r.exists("mixh")


def test_threads_sharing_one_object_each_get_their_own_token(r):
    lock = FencedLock(r, "shared")
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work() -> None:
        try:
            start.wait()
            for _ in range(10):
                token = lock.lock_and_get_token()
                try:
                    seen.append((token, lock.get_token()))  # no other acquire can run now
                finally:
                    lock.unlock()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert all(mine == last for mine, last in seen)
    assert [t for t, _ in seen] == list(range(1, 61))


def test_no_two_callers_get_one_token_even_when_leases_run_out_under_them(r):
    # 1 ms leases on one shared object: the next thread gets in while the previous one is
    # still on its way out of the acquire call. Each must come back with its own token.
    lock = FencedLock(r, "short")
    got: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work() -> None:
        try:
            start.wait()
            for _ in range(25):
                token = lock.try_lock_and_get_token(wait_time=30, lease_time=0.001)
                assert token is not None
                got.append(token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sorted(got) == list(range(1, 151))


def test_tokens_strictly_increase_across_4_processes_x_2_threads(r, redis_server):
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine._fenced_proc",
                               redis_server.socket, "fence", "2", "12"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    got: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0
        got += json.loads(out.strip().splitlines()[-1])
    # 4 x 2 x 12 holds, every other one with a reentrant acquire inside: 144 acquires.
    order = [int(t) for t in r.lrange("order", 0, -1)]
    assert len(got) == len(order) == 144
    assert sorted(got) == list(range(1, 145))  # each token went to exactly one acquire
    assert order == sorted(order)  # in acquisition order, strictly increasing
    assert not r.exists("fence")


def test_bad_input_raises_before_any_redis_command():
    dead = redis.Redis(unix_socket_path="/nonexistent/redis.sock")  # any command would fail
    lock = FencedLock(dead, "bad")
    with pytest.raises(ValueError, match="lease_time.*'bad'"):
        lock.lock_and_get_token(lease_time=0)
    with pytest.raises(ValueError, match="wait_time"):
        lock.try_lock_and_get_token(wait_time=-1)
    with pytest.raises(TypeError, match="wait_time"):
        lock.try_lock_and_get_token(wait_time="1")
    with pytest.raises(TypeError, match="lease_time"):
        lock.try_lock_and_get_token(lease_time=True)
    with pytest.raises(ValueError, match="name"):
        FencedLock(dead, "")
    with pytest.raises(TypeError, match="prefix"):
        FencedLock(dead, "x", prefix=None)


# -- asyncio ----------------------------------------------------------------------------
def test_async_token_increase_and_reentry(ar, r):
    async def main() -> None:
        lock = AsyncFencedLock(ar, "alock")
        assert await lock.get_token() is None
        assert await lock.lock_and_get_token() == 1
        await lock.unlock()
        assert await lock.lock_and_get_token() == 2
        await lock.unlock()
        await lock.lock()
        assert await lock.get_token() == 3
        await lock.unlock()
        await lock.lock(lease_time=10)
        assert await lock.get_token() == 4
        assert 9_000 < await ar.pttl("alock") <= 10_000
        await lock.unlock()
        assert await lock.try_lock_and_get_token() == 5
        assert await lock.lock_and_get_token(lease_time=20) == 6  # reentrant
        assert await lock.hold_count() == 2
        await lock.unlock()
        await lock.unlock()
        assert not await lock.is_locked()
        await ar.aclose()

    asyncio.run(main())


def test_async_tasks_sharing_one_object_each_get_their_own_token(ar, r):
    async def main() -> list[tuple[int, int | None]]:
        lock = AsyncFencedLock(ar, "atasks")
        seen: list[tuple[int, int | None]] = []

        async def work() -> None:
            for _ in range(5):
                token = await lock.lock_and_get_token()
                try:
                    await asyncio.sleep(0)
                    seen.append((token, await lock.get_token()))
                finally:
                    await lock.unlock()

        holder = await lock.try_lock_and_get_token()
        assert holder == 1
        other = asyncio.create_task(lock.try_lock_and_get_token(wait_time=0.2))
        assert await other is None  # another task: refused, no token spent
        await lock.unlock()
        await asyncio.gather(*(work() for _ in range(4)))
        await ar.aclose()
        return seen

    seen = asyncio.run(main())
    assert all(mine == last for mine, last in seen)
    assert sorted(t for t, _ in seen) == list(range(2, 22))


def test_async_and_sync_holders_exclude_each_other_and_share_the_counter(ar, r):
    async def main() -> None:
        sync_lock = FencedLock(r, "both")
        assert sync_lock.lock_and_get_token() == 1
        alock = AsyncFencedLock(ar, "both")
        assert await alock.try_lock_and_get_token() is None
        sync_lock.unlock()
        assert await alock.try_lock_and_get_token() == 2
        entry = json.loads((await ar.hget(index_key(""), "both")).decode().split(" ", 1)[1])
        assert entry["kind"] == "fenced"
        await alock.unlock()
        await ar.aclose()

    asyncio.run(main())


def test_async_bad_input_raises_before_any_redis_command(r):
    async def main() -> None:
        lock = AsyncFencedLock(redis.asyncio.Redis(unix_socket_path="/nonexistent/redis.sock"),
                               "abad", sync_client=r)
        with pytest.raises(ValueError, match="lease_time"):
            await lock.lock_and_get_token(lease_time=-1)
        with pytest.raises(TypeError, match="wait_time"):
            await lock.try_lock_and_get_token(wait_time=None)

    t0 = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - t0 < 5
