"""Kinds that do not run on a cluster yet (issue #10: the lock kinds do, the counters and every
asyncio kind not yet) refuse a cluster client at once, with a message that says so: it is a
redis-py client, only not one of a single server."""

from __future__ import annotations

import asyncio

import pytest

from django_rlock import (
    AsyncFairLock,
    AsyncRLock,
    AsyncSemaphore,
    CountDownLatch,
    PermitExpirableSemaphore,
    Semaphore,
)
from tests.cluster_topology import ClusterTopology


def test_every_kind_refuses_a_cluster_client_before_any_command(cluster: ClusterTopology):
    rc = cluster.client()
    before = sum(n.redis_connection.info("commandstats").get("cmdstat_evalsha", {})
                 .get("calls", 0) for n in rc.get_primaries())
    for kind in (Semaphore, PermitExpirableSemaphore, CountDownLatch):
        with pytest.raises(TypeError, match=r"Redis Cluster client.*'k'"):
            kind(rc, "k")
    after = sum(n.redis_connection.info("commandstats").get("cmdstat_evalsha", {})
                .get("calls", 0) for n in rc.get_primaries())
    assert after == before


def test_asyncio_kinds_refuse_it_too(cluster: ClusterTopology):
    async def main() -> None:
        arc = cluster.async_client()
        try:
            for kind in (AsyncRLock, AsyncFairLock, AsyncSemaphore):
                with pytest.raises(TypeError, match=r"Redis Cluster client.*'k'"):
                    kind(arc, "k")
        finally:
            await arc.aclose()

    asyncio.run(main())
