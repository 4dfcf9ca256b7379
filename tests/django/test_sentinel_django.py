"""get_lock on django-redis' SentinelClient, configured the way django-redis 7 documents it,
and through a real Sentinel failover (tests/topology.py: master, replica, three sentinels).

django-redis needs its Sentinel connection factory, per cache (``OPTIONS["CONNECTION_FACTORY"]``)
or for every cache (``DJANGO_REDIS_CONNECTION_FACTORY``); without it, building the
``SentinelConnectionPool`` fails (a TypeError, for the cache as much as for a lock).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel
from django.core.cache import caches
from django.http import HttpResponse
from django.test import AsyncRequestFactory

from django_rlock import (
    AsyncRLock,
    LockNotSyncedError,
    RLock,
    get_leader,
    get_lock,
    limited,
    locked,
    rate_limited,
)
from django_rlock.connection import get_client, get_prefix
from django_rlock.engine import pubsub
from django_rlock.engine.clients import SentinelTwinPool, async_twin, sync_twin
from django_rlock.engine.naming import handoff_queue, leader_name
from tests.django.conftest import write_lock
from tests.topology import SentinelTopology

FACTORY = "django_redis.pool.SentinelConnectionFactory"


def sentinel_caches(topo: SentinelTopology, factory_option: bool = True) -> dict[str, Any]:
    options: dict[str, Any] = {
        "CLIENT_CLASS": "django_redis.client.SentinelClient",
        "SENTINELS": topo.sentinel_addresses,
        "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
        "SOCKET_TIMEOUT": 2,
    }
    if factory_option:
        options["CONNECTION_FACTORY"] = FACTORY
    return {"default": {"BACKEND": "django_redis.cache.RedisCache",
                        "LOCATION": f"redis://{topo.service}/0", "KEY_PREFIX": "shop",
                        "OPTIONS": options}}


def _until(cond: Any, limit: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + limit
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {limit:g} s")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def topo() -> Iterator[SentinelTopology]:
    with SentinelTopology(replicas=1, sentinels=3) as t:
        yield t


@pytest.mark.parametrize("factory_option", [True, False], ids=["OPTIONS", "global-setting"])
def test_get_lock_uses_the_sentinel_clients_master(settings, topo, holders, factory_option):
    if not factory_option:
        settings.DJANGO_REDIS_CONNECTION_FACTORY = FACTORY
    settings.CACHES = sentinel_caches(topo, factory_option)
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 1.2}
    client = get_client()
    assert client is caches["default"].client.get_client(write=True)
    assert isinstance(client.connection_pool, redis.sentinel.SentinelConnectionPool)
    assert client.connection_pool.is_master
    master, replica = topo.master().client(), topo.replicas()[0].client()
    caches["default"].set("greeting", "hi")  # the cache itself works on this configuration
    lock = get_lock("orders:1")
    h = holders()
    h.call(lock.lock)
    try:
        assert lock.key == "shop:rlock:orders:1"
        assert replica.hgetall(lock.key) == master.hgetall(lock.key) != {}  # synced on acquire
        time.sleep(1.8)  # past the 1.2 s lease: renewed through the Sentinel pool
        assert master.pttl(lock.key) > 0
        assert get_lock("orders:1").try_lock() is False  # another thread: busy
    finally:
        h.call(lock.unlock)
    assert not master.exists(lock.key)
    master.close()
    replica.close()


def test_asyncio_paths_on_the_sentinel_cache(settings, topo):
    """Async views, ``get_lock(aio=True)`` and ``get_leader(aio=True)`` on the documented
    Sentinel cache send on a ``redis.asyncio`` twin of its client: Sentinel-managed as well,
    so on the master (not a TypeError). Two event loops, as Django gives two async requests
    under WSGI: each has its own twin."""
    settings.CACHES = sentinel_caches(topo)
    master = topo.master().client()
    key = "shop:rlock:report:1"
    inside: list[int] = []
    most = 0

    @locked("report:{n}", wait=20)
    async def report(n: int) -> str:
        nonlocal most
        inside.append(n)
        most = max(most, len(inside))
        seen = master.exists(key)  # (a blocking call, from the event loop: a test only)
        await asyncio.sleep(0.2)
        inside.remove(n)
        return "held on the master" if seen else "not on the master"

    @locked("page:{pk}")
    async def page(request: Any, pk: int) -> HttpResponse:
        return HttpResponse("ok")

    @limited("exports", permits=1)
    async def export() -> str:
        return "exported"

    @rate_limited("mails", "5/m")
    async def mail() -> str:
        return "sent"

    async def first_request() -> None:
        # Two tasks of one loop, one lock: the second runs after the first, never alongside.
        assert await asyncio.gather(report(1), report(1)) == ["held on the master"] * 2
        assert most == 1
        assert (await page(AsyncRequestFactory().get("/"), pk=7)).status_code == 200
        assert await export() == "exported" and await mail() == "sent"

    async def second_request() -> None:
        lock = get_lock("orders:2", aio=True)
        async with lock:
            assert master.exists(lock.key)
            other = asyncio.create_task(get_lock("orders:2", aio=True).try_lock())
            assert await other is False  # another task: busy
            busy = get_lock("page:7", aio=True)
            await busy.lock()
            try:  # the view, on another task, finds its lock held: the 423 answer
                response = await asyncio.create_task(page(AsyncRequestFactory().get("/"), pk=7))
                assert response.status_code == 423
            finally:
                await busy.unlock()
        assert not master.exists(lock.key)
        async with get_leader("reports", aio=True) as leader:
            assert await leader.wait_elected(10)
            assert master.exists(get_prefix() + leader_name("reports"))

    try:
        asyncio.run(first_request())
        asyncio.run(second_request())  # a new loop: the first loop's twin is let go
    finally:
        master.close()


def test_asyncio_client_of_sentinel_without_sync_client(topo):
    """An ``AsyncRLock`` on a ``redis.asyncio`` Sentinel client, no ``sync_client``: its
    renewals and waiting go through a sync Sentinel-managed twin of it, to the master."""
    sentinel = redis.asyncio.sentinel.Sentinel(topo.sentinel_addresses, socket_timeout=2)
    master = topo.master().client()

    async def main() -> None:
        aclient = sentinel.master_for(topo.service)
        twin = sync_twin(aclient)
        assert isinstance(twin.connection_pool, redis.sentinel.SentinelConnectionPool)
        assert twin.connection_pool.is_master and twin.connection_pool.service_name == topo.service
        lock = AsyncRLock(aclient, "twin:1", watchdog_timeout=1.2)
        async with lock:
            assert await lock.is_held_by_current_task()
            await asyncio.sleep(1.8)  # past the 1.2 s lease: renewed on the sync twin
            assert master.pttl(lock.key) > 0
        assert not master.exists(lock.key)
        await aclient.aclose()

    try:
        asyncio.run(main())
    finally:
        master.close()


def test_twins_keep_the_service_role_and_settings(topo):
    """Both ways, a twin asks the same sentinels with their own settings (a sentinel password
    apart from the servers') for the same service and role, with the servers' password and
    database: what the topology above cannot show, as it has no passwords."""
    addresses = [tuple(a) for a in topo.sentinel_addresses]
    manager = redis.sentinel.Sentinel(addresses, sentinel_kwargs={"password": "s-pw"},
                                      password="m-pw", db=2, socket_timeout=2)
    replica = manager.slave_for(topo.service)

    async def twin_of(client: Any) -> Any:
        return async_twin(client)

    aio = asyncio.run(twin_of(replica))
    back = sync_twin(aio)
    for twin, kind in ((aio, SentinelTwinPool), (back, redis.sentinel.SentinelConnectionPool)):
        pool = twin.connection_pool
        assert isinstance(pool, kind)
        assert (pool.service_name, pool.is_master) == (topo.service, False)
        assert (pool.connection_kwargs["password"], pool.connection_kwargs["db"]) == ("m-pw", 2)
        assert [(c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs[
            "port"], c.connection_pool.connection_kwargs["password"])
            for c in pool.sentinel_manager.sentinels] == [(h, p, "s-pw") for h, p in addresses]


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of its own for the whole test."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    runner.join(10)
    loop.close()


def test_renewal_and_waiters_follow_a_failover(settings, holders, loop_thread):
    """SIGKILL the master under a django-redis Sentinel cache: the watchdog renews the held
    lock on the promoted replica, the process's pub/sub subscription moves there, and a
    release published there wakes a waiter at once (its other wake-up, the holder's 30 s
    lease, is far off). An asyncio holder (``get_lock(aio=True)``, on a loop of its own that
    outlives the failover) releases on the new master and acquires there again: its twin's
    connections find the new master through the sentinels."""
    with SentinelTopology(replicas=1, sentinels=3) as topo:
        settings.CACHES = sentinel_caches(topo)
        settings.RLOCK = {"WATCHDOG_TIMEOUT": 12.0}
        old = topo.master()
        master = old.client()
        job = get_lock("job")
        holder = holders()
        holder.call(job.lock)
        held, go = threading.Event(), threading.Event()

        async def async_holder() -> bool:
            lock = get_lock("ajob", aio=True)
            await lock.lock()
            held.set()
            while not go.is_set():
                await asyncio.sleep(0.02)
            assert not lock.is_lost()
            await lock.unlock()  # on the new master: the twin reconnects through the sentinels
            again, got = get_lock("ajob", aio=True), False
            for _ in range(2):  # (LockNotSyncedError: see below)
                try:
                    got = await again.try_lock()
                    break
                except LockNotSyncedError as exc:
                    sync_errors.append(exc)
            if got:
                assert await again.is_held_by_current_task()
                await again.unlock()
            return got

        sync_errors: list[LockNotSyncedError] = []
        async_done = asyncio.run_coroutine_threadsafe(async_holder(), loop_thread)
        assert held.wait(10)
        akey = get_lock("ajob").key

        # A lock of another process (as a Java service using Redisson would leave it), and a
        # thread of ours waiting for it: only pub/sub or its 30 s lease can wake the thread.
        other = get_lock("other")
        with master.pipeline(transaction=False) as pipe:
            write_lock(pipe, other.key, ttl_ms=30_000)
            pipe.execute_command("WAIT", 1, 1000)  # on the replica before the kill
            assert pipe.execute()[-1] == 1
        waiter = holders()

        def wait_for_other() -> float:
            while True:
                try:
                    assert other.try_lock(wait_time=40)
                    return time.monotonic()
                except LockNotSyncedError as exc:  # see below
                    sync_errors.append(exc)

        acquired = waiter.submit(wait_for_other)
        name = pubsub.subscriber_name(0)
        _until(lambda: name in [c["name"] for c in master.client_list()], what="subscribed")
        # In line, so parked: its first attempt is done (one sent as the master dies would
        # fail with a connection error, which is not what this test is about).
        _until(lambda: master.llen(handoff_queue(other.key)) >= 1, what="the waiter in line")

        topo.kill(old)
        master.close()
        new = topo.wait_for_failover(old)
        nc = new.client()
        (owner,) = nc.hkeys(job.key)
        first = nc.pttl(job.key)

        # The watchdog renews "job" on the new master; the subscription is there again.
        _until(lambda: nc.pttl(job.key) > first + 200, 20, "renewal on the new master")
        assert nc.hexists(job.key, owner) and not holder.call(job.is_lost)
        _until(lambda: name in [c["name"] for c in nc.client_list()], 10, "resubscribed")
        assert pubsub.existing_manager(get_client()).reconnects >= 1
        assert nc.exists(akey)  # the asyncio hold, on the new master (synced before the kill)
        go.set()
        assert async_done.result(40) is True
        assert not nc.exists(akey)

        # The other process releases on the new master: DEL + PUBLISH, nothing in this process
        # told directly (a plain client of its own, not the Sentinel pool).
        time.sleep(0.3)
        released = time.monotonic()
        assert RLock(nc, other.key).force_unlock()
        woke = acquired(40) - released
        # Woken by the message, not by the 30 s lease. A first acquire on the promoted replica
        # can still WAIT for the old master's replica count (probed before the failover) and
        # be undone with LockNotSyncedError: at most one sync_timeout more.
        assert woke < 3.0, woke
        assert len(sync_errors) <= 2  # the waiter's and the asyncio holder's: one each
        waiter.call(other.unlock)
        holder.call(job.unlock)
        assert not nc.exists(job.key) and not nc.exists(other.key)
        nc.close()
