"""The asyncio kinds do not run on a cluster yet (issue #10; every sync kind does): they refuse
a cluster client at once, with a message that says so (it is a redis-py client, only not one
of a single server), before any command."""

from __future__ import annotations

import asyncio

import pytest

from django_rlock import AsyncFairLock, AsyncRLock, AsyncSemaphore
from tests.cluster_topology import ClusterTopology


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
