"""The rate limiter on a Redis Cluster: its hash, counter, grants, line and index entry share the
key's slot (Redisson's braces), it runs on that slot's master and is listed from there."""

from __future__ import annotations

import asyncio
import threading

from redis.crc import key_slot

from django_rlock import AsyncRateLimiter, RateLimiter
from django_rlock.engine.listing import Locks
from django_rlock.engine.naming import rate_keys
from tests.cluster_topology import ClusterTopology


def test_a_limiter_lives_on_its_slots_master(cluster: ClusterTopology):
    rc = cluster.client()
    rl = RateLimiter(rc, "api:rate")
    rl.set_rate(3, 0.5)
    keys = rate_keys(rl.key)
    assert {key_slot(k.encode()) for k in (*keys, rl._index)} == {key_slot(b"api:rate")}
    got: list[float] = []
    threads = [threading.Thread(target=lambda: got.append(rl.acquire())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 6 and sorted(got)[3] - sorted(got)[0] > 0.5
    master = cluster.node_for_key("api:rate")
    with cluster.node_client(master) as c:
        assert c.hget("api:rate", "rate") == b"3"
        assert c.zcard(keys[2]) >= 3
    (info,) = Locks(rc).read(["api:rate"])
    assert info.kind == "rate" and info.details["rate"] == 3
    assert "api:rate" in Locks(rc).names()
    assert rl.force_unlock() and rl.available_permits() == 3

    async def aio() -> bool:
        arc = cluster.async_client()
        try:
            return await AsyncRateLimiter(arc, "api:rate").try_acquire(3)
        finally:
            await arc.aclose()

    assert asyncio.run(aio())
    assert rl.available_permits() == 0
    rc.close()
