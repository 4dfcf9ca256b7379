"""ReadWriteLock: a reader asking to wait for the write lock (an upgrade) is refused at once.

The write waits for every reader to leave, the caller included: before, ``lock()`` waited for
itself forever while the watchdog renewed its read hold (a user audit). Redisson waits there.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from django_rlock import LockReentryError, LockUpgradeError
from django_rlock.engine.rwlock import AsyncReadWriteLock, ReadWriteLock
from tests.conftest import script_calls


def test_a_reader_asking_to_wait_for_the_write_lock_is_refused_before_any_command(r, holders):
    rw = ReadWriteLock(r, "up")
    read, write = rw.read_lock(), rw.write_lock()
    reader = holders()
    reader.call(read.lock)  # the only reader
    before = script_calls(r)
    t0 = time.monotonic()
    with pytest.raises(LockUpgradeError, match="'up'") as err:
        reader.submit(write.lock)(10)  # it once blocked here for good
    assert isinstance(err.value, LockReentryError) and err.value.name == "up"
    for attempt in (lambda: write.try_lock(wait_time=5), write.acquire,
                    lambda: write.acquire(timeout=5), write.__enter__):
        with pytest.raises(LockUpgradeError):
            reader.call(attempt)
    assert time.monotonic() - t0 < 3  # never the 5 s budgets
    assert script_calls(r) == before  # decided here, not by Redis
    # One attempt is the script's to refuse, as in Redisson (testWriteReadReentrancy).
    assert reader.call(write.try_lock) is False
    assert reader.call(lambda: write.acquire(blocking=False)) is False
    # The read hold is untouched, still renewed; released, the write is the caller's.
    assert r.hget("up", "mode") == b"read" and reader.call(read.hold_count) == 1
    assert not reader.call(read.is_lost)
    reader.call(read.unlock)
    reader.call(write.lock)
    assert r.hget("up", "mode") == b"write"
    reader.call(write.unlock)
    assert not r.exists("up")


def test_a_writer_that_reads_takes_its_write_again_and_an_expired_read_is_no_hold(r):
    rw = ReadWriteLock(r, "down")
    read, write = rw.read_lock(), rw.write_lock()
    write.lock()
    read.lock()  # a downgrade under way: both held
    write.lock()  # a write reentry, not an upgrade
    assert write.hold_count() == 2
    write.unlock()
    write.unlock()  # downgraded: a reader now
    with pytest.raises(LockUpgradeError):
        write.try_lock(wait_time=1)
    read.unlock()
    read.lock(lease_time=0.2)
    time.sleep(0.4)  # the read hold ran out: the caller holds nothing now
    assert not r.exists("down")
    assert write.try_lock(wait_time=1) is True
    write.unlock()


def test_an_asyncio_reader_asking_to_wait_for_the_write_lock_is_refused(redis_server, r):
    async def main() -> None:
        client = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        rw = AsyncReadWriteLock(client, "aup")
        read, write = rw.read_lock(), rw.write_lock()
        await read.lock()
        before = script_calls(r)
        with pytest.raises(LockUpgradeError, match="'aup'"):
            async with asyncio.timeout(10):  # this task (wait_for would run it in another)
                await write.lock()  # once: forever
        with pytest.raises(LockUpgradeError):
            await write.try_lock(wait_time=5)
        assert script_calls(r) == before
        assert await write.try_lock() is False

        async def not_a_reader() -> bool:  # another task is no upgrade: it waits, and fails
            return await write.try_lock(wait_time=0.2)

        assert await asyncio.create_task(not_a_reader()) is False
        await read.unlock()
        await write.lock()
        await write.unlock()
        assert not r.exists("aup")
        await client.aclose()

    asyncio.run(main())
