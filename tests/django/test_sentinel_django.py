"""get_lock on django-redis' SentinelClient, configured the way django-redis 7 documents it,
and through a real Sentinel failover (tests/topology.py: master, replica, three sentinels).

django-redis needs its Sentinel connection factory, per cache (``OPTIONS["CONNECTION_FACTORY"]``)
or for every cache (``DJANGO_REDIS_CONNECTION_FACTORY``); without it, building the
``SentinelConnectionPool`` fails (a TypeError, for the cache as much as for a lock).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.cache import caches

from django_rlock import LockNotSyncedError, RLock, get_lock
from django_rlock.connection import get_client
from django_rlock.engine import pubsub
from django_rlock.engine.naming import handoff_queue
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


def test_renewal_and_waiters_follow_a_failover(settings, holders):
    """SIGKILL the master under a django-redis Sentinel cache: the watchdog renews the held
    lock on the promoted replica, the process's pub/sub subscription moves there, and a
    release published there wakes a waiter at once (its other wake-up, the holder's 30 s
    lease, is far off)."""
    with SentinelTopology(replicas=1, sentinels=3) as topo:
        settings.CACHES = sentinel_caches(topo)
        settings.RLOCK = {"WATCHDOG_TIMEOUT": 12.0}
        old = topo.master()
        master = old.client()
        job = get_lock("job")
        holder = holders()
        holder.call(job.lock)

        # A lock of another process (as a Java service using Redisson would leave it), and a
        # thread of ours waiting for it: only pub/sub or its 30 s lease can wake the thread.
        other = get_lock("other")
        with master.pipeline(transaction=False) as pipe:
            write_lock(pipe, other.key, ttl_ms=30_000)
            pipe.execute_command("WAIT", 1, 1000)  # on the replica before the kill
            assert pipe.execute()[-1] == 1
        waiter = holders()
        sync_errors: list[LockNotSyncedError] = []

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
        assert len(sync_errors) <= 1
        waiter.call(other.unlock)
        holder.call(job.unlock)
        assert not nc.exists(job.key) and not nc.exists(other.key)
        nc.close()
