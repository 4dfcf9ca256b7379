"""NonReentrantLock: Redisson 4.4's non-reentrant lock, added through the kind registry alone."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from django_rlock import AsyncNonReentrantLock, LockError, LockReentryError, NonReentrantLock
from django_rlock.engine import identity, kinds
from django_rlock.engine.listing import Locks
from django_rlock.engine.lockinfo import parse_entry
from django_rlock.engine.naming import index_key
from tests.conftest import script_calls


def test_a_second_acquire_by_the_holder_never_deadlocks_and_sends_nothing(r):
    lock = NonReentrantLock(r, "nr:twice")
    lock.lock()
    r.config_resetstat()
    assert lock.try_lock() is False
    assert lock.try_lock(wait_time=5) is False  # at once, not after 5 s
    with pytest.raises(LockReentryError) as err:
        lock.lock()
    assert isinstance(err.value, LockError) and err.value.name == "nr:twice"
    assert "nr:twice" in str(err.value)
    with pytest.raises(LockReentryError):
        with lock:
            pass
    assert script_calls(r) == 0  # refused before any command
    assert r.hgetall("nr:twice") == {identity.thread_owner().encode(): b"1"}  # count unchanged
    lock.unlock()
    assert not r.exists("nr:twice")


def test_redisson_layout_and_reply_for_an_owner_this_process_does_not_know(r, holders):
    """Another handle (a Redisson client, another server id) asking again gets Redisson's
    NON_REENTRANT_REACQUIRE; the count is never bumped."""
    lock = NonReentrantLock(r, "nr:layout")
    lock.lock()
    owner = identity.thread_owner()
    assert r.type("nr:layout") == b"hash"
    assert r.hgetall("nr:layout") == {owner.encode(): b"1"}
    assert 29_000 < r.pttl("nr:layout") <= 30_000
    with pytest.raises(redis.ResponseError, match="NON_REENTRANT_REACQUIRE"):
        r.eval(NonReentrantLock._ACQUIRE.source, 2, "nr:layout", index_key(""), 30000, owner,
               "{}", "")
    assert r.hget("nr:layout", owner) == b"1"
    assert parse_entry(r.hget(index_key(""), "nr:layout"))[1]["kind"] == "non_reentrant"
    lock.unlock()


def test_a_contender_waits_and_then_acquires(r, holders):
    lock = NonReentrantLock(r, "nr:contend")
    holder, other = holders(), holders()
    holder.call(lock.lock)
    got = other.submit(lambda: lock.try_lock(wait_time=10))
    time.sleep(0.3)
    t0 = time.monotonic()
    holder.call(lock.unlock)
    assert got(10) is True and time.monotonic() - t0 < 2.0
    assert other.call(lock.try_lock) is False  # its own second try
    other.call(lock.unlock)


def test_exclusive_across_threads_and_one_hold_per_owner_whatever_the_handle(r):
    lock = NonReentrantLock(r, "nr:excl")
    inside, most = [0], [0]
    mu = threading.Lock()

    def work() -> None:
        for _ in range(20):
            with lock:
                with mu:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.001)
                with mu:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == 1
    lock.lock()
    assert not NonReentrantLock(r, "nr:excl").try_lock()  # another handle, the same owner
    lock.unlock()
    assert not r.exists("nr:excl")


def test_async_twin(r):
    async def main() -> tuple[bool, bool, bool]:
        client = aredis.Redis(unix_socket_path=r.connection_pool.connection_kwargs["path"])
        lock = AsyncNonReentrantLock(client, "nr:async")
        await lock.lock()
        again = await lock.try_lock(wait_time=3)
        try:
            await lock.lock()
            raised = False
        except LockReentryError:
            raised = True

        async def other() -> bool:
            return await AsyncNonReentrantLock(client, "nr:async").try_lock()

        contender = await asyncio.create_task(other())
        await lock.unlock()
        await client.aclose()
        return again, raised, contender

    assert asyncio.run(main()) == (False, True, False)
    assert not r.exists("nr:async")


def test_listed_as_its_kind_and_cleared_through_the_registry(r, holders):
    holder = holders()
    holder.call(NonReentrantLock(r, "nr:listed").lock)
    assert kinds.get("non_reentrant") is not None
    (info,) = Locks(r).read(["nr:listed"])
    assert info.kind == "non_reentrant" and len(info.holders) == 1
    assert Locks(r).clear(["nr:listed"]) == ["nr:listed"]
    assert not r.exists("nr:listed") and not r.hexists(index_key(""), "nr:listed")
