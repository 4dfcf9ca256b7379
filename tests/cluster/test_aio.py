"""The asyncio kinds on a ``redis.asyncio.RedisCluster`` (issue #10): each sends on an asyncio
client of its slot's master (the twin of a sync node client, which renews and subscribes),
wakes its waiters there, and follows the slot when it moves. A client of the other flavour
(sync for an asyncio kind, or the reverse) is refused before any command."""

from __future__ import annotations

import asyncio

import pytest

from django_rlock import (
    AsyncCountDownLatch,
    AsyncFairLock,
    AsyncFencedLock,
    AsyncReadWriteLock,
    AsyncRLock,
    AsyncSemaphore,
    FairLock,
    RLock,
    Semaphore,
)
from tests.cluster_topology import ClusterTopology


def test_an_asyncio_lock_holds_renews_and_wakes_its_waiter(cluster: ClusterTopology):
    name = "aio-lock"
    master = cluster.node_for_key(name)

    async def body(arc) -> None:
        short = AsyncRLock(arc, name, watchdog_timeout=1.5)
        await short.lock()
        assert short.client.connection_pool.connection_kwargs["port"] == master.port
        await asyncio.sleep(2.0)  # past a 1.5 s lease: renewed on its master
        assert await short.is_locked() and not short.is_lost()
        with cluster.node_client(master) as c:
            assert c.hexists(short.key, short._field())
            assert 0 < c.pttl(short.key) <= 1500
        await short.unlock()
        holder = AsyncRLock(arc, name)  # 30 s: only the release can wake the waiter in time
        await holder.lock()
        got = asyncio.Event()

        async def waiter() -> None:
            lock = AsyncRLock(arc, name)
            await lock.lock()
            got.set()
            await lock.unlock()

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.5)
        assert not got.is_set()
        await holder.unlock()
        await asyncio.wait_for(got.wait(), 5)
        await task
        assert not await holder.is_locked()

    cluster.run_async(body)


def test_the_asyncio_kinds_run_on_a_cluster(cluster: ClusterTopology):
    async def body(arc) -> None:
        fair = AsyncFairLock(arc, "aio-fair")
        async with fair:
            assert await fair.is_locked()
        fenced = AsyncFencedLock(arc, "aio-fenced")
        t1 = await fenced.lock_and_get_token()
        await fenced.unlock()
        t2 = await fenced.lock_and_get_token()
        await fenced.unlock()
        assert t2 > t1
        rw = AsyncReadWriteLock(arc, "aio-rw")
        async with rw.read_lock():
            assert await rw.read_lock().is_locked()
            assert not await rw.write_lock().try_lock()
        async with rw.write_lock():
            assert await rw.write_lock().is_locked()
        sem = AsyncSemaphore(arc, "aio-sem")
        assert await sem.try_set_permits(1)
        await sem.acquire()
        assert not await sem.try_acquire(wait_time=0.1)
        waiter = asyncio.ensure_future(sem.acquire())
        await asyncio.sleep(0.3)
        await sem.release()
        await asyncio.wait_for(waiter, 3)  # woken by the release (its re-check is 5 s off)
        await sem.release()
        assert await sem.available_permits() == 1 and await sem.delete()
        latch = AsyncCountDownLatch(arc, "aio-latch")
        assert await latch.try_set_count(1)
        opened = asyncio.ensure_future(latch.wait(5))
        await asyncio.sleep(0.2)
        await latch.count_down()
        assert await asyncio.wait_for(opened, 3) is True

    cluster.run_async(body)


def test_an_asyncio_lock_follows_its_slot_to_another_master(cluster: ClusterTopology):
    name = "aio-moving"

    async def body(arc) -> None:
        lock = AsyncRLock(arc, name, watchdog_timeout=3.0)
        await lock.lock()
        # Another client's lock, resolved before the move: its map is refreshed only by the
        # MOVED its first attempt gets afterwards.
        arc2 = cluster.async_client()
        stale = AsyncRLock(arc2, name)
        slot, src = cluster.keyslot(name), cluster.node_for_key(name)
        dst = next(m for m in cluster.masters() if m is not src)
        await asyncio.to_thread(cluster.migrate_slot, slot, src, dst)
        await asyncio.sleep(4.0)  # more than a lease: renewed on the new master
        assert not lock.is_lost() and await lock.is_held_by_current_task()
        with cluster.node_client(dst) as c:
            assert c.hexists(lock.key, lock._field())
        await lock.unlock()
        assert not await lock.is_locked()
        assert await stale.try_lock()  # MOVED from the old master: sent again to the new one
        assert stale.client.connection_pool.connection_kwargs["port"] == dst.port
        await stale.unlock()
        await arc2.aclose()

    cluster.run_async(body)


def test_a_client_of_the_wrong_flavour_is_refused_before_any_command(cluster: ClusterTopology):
    rc = cluster.client()
    for kind in (AsyncRLock, AsyncSemaphore, AsyncCountDownLatch):
        with pytest.raises(TypeError, match=r"'k'\) takes an asyncio RedisCluster"):
            kind(rc, "k")

    async def body(arc) -> None:
        with pytest.raises(TypeError, match="takes a sync RedisCluster"):
            RLock(arc, "k")
        with pytest.raises(TypeError, match="takes a sync RedisCluster"):
            FairLock(arc, "k")
        with pytest.raises(TypeError, match="takes a sync RedisCluster"):
            Semaphore(arc, "k")

    cluster.run_async(body)
