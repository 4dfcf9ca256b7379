"""Leader election and the beat's progress on a Redis Cluster (issue #20 on issue #10's
topology): a group's leader key, its token counter and the beat's progress share one slot, so
the term's scripts and the tick script run on that slot's master; a standby is elected by the
release's message there, and terms keep increasing.
"""

from __future__ import annotations

import asyncio
import time

from redis.crc import key_slot

from django_rlock import AsyncLeader, Leader
from django_rlock.engine.ticks import PAST, SEND, STALE, TickProgress
from tests.cluster_topology import ClusterTopology

S = 1_000_000


def _calls(cluster: ClusterTopology, server, command: str) -> int:
    with cluster.node_client(server) as c:
        return c.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_a_standby_is_elected_on_the_groups_master_when_the_leader_stops(
        cluster: ClusterTopology) -> None:
    a = Leader(cluster.client(), "cl-group", watchdog_timeout=3.0).start()
    b = Leader(cluster.client(), "cl-group", watchdog_timeout=3.0)
    try:
        assert a.wait_elected(10)
        first = a.term
        assert first is not None
        # Everything of the group in one slot, served by one master.
        slot = key_slot(a.key.encode())
        assert key_slot(a.token_key.encode()) == slot
        master = cluster.node_for_key(a.key)
        with cluster.node_client(master) as c:
            assert c.exists(a.key) == 1
        others = [m for m in cluster.masters() if m.port != master.port]
        before = {m.port: _calls(cluster, m, "evalsha") for m in others}
        b.start()
        time.sleep(0.5)
        assert not b.is_leader() and a.is_leader()
        # Renewed past the lease, on the master: still the one leader.
        time.sleep(3.5)
        assert a.is_leader() and a.term == first and not b.is_leader()
        assert (info := b.leader()) is not None and info.term == first
        t0 = time.monotonic()
        a.stop(timeout=5)
        assert not a.is_leader()
        assert b.wait_elected(5)
        took = time.monotonic() - t0
        # Woken by the release's message, not found at the lease's end (3 s).
        assert took < 1.5, took
        assert b.term is not None and b.term > first
        # No script of the group ran on another master.
        assert {m.port: _calls(cluster, m, "evalsha") for m in others} == before
    finally:
        a.stop(timeout=5)
        b.stop(timeout=5)


def test_the_beats_tick_script_runs_in_the_groups_slot_and_refuses_a_stale_term(
        cluster: ClusterTopology) -> None:
    rc = cluster.client()
    a = Leader(rc, "cl-beat", "b:", watchdog_timeout=5.0).start()
    try:
        assert a.wait_elected(10)
        term, owner = a.term, a.owner
        assert term is not None and owner is not None
        progress = TickProgress(a.client, a.key, a.token_key)
        now = progress.now()
        sent = progress.advance(term, owner, "e", now - 5 * S, now - 6 * S)
        assert (sent.code, sent.progress) == (SEND, now - 5 * S)
        assert progress.advance(term, owner, "e", now - 5 * S, now - 6 * S).code == PAST
        assert progress.load() == {"e": now - 5 * S}
        a.stop(timeout=5)
        # The term is over: nothing is advanced by it.
        assert progress.advance(term, owner, "e", now - 2 * S, now - 6 * S).code == STALE
        assert progress.load() == {"e": now - 5 * S}
    finally:
        a.stop(timeout=5)


def test_an_asyncio_leader_on_the_asyncio_cluster_client(cluster: ClusterTopology) -> None:
    async def main() -> None:
        arc = cluster.async_client()
        a = AsyncLeader(arc, "cl-aio", watchdog_timeout=3.0)
        b = AsyncLeader(cluster.async_client(), "cl-aio", watchdog_timeout=3.0)
        await a.start()
        try:
            assert await a.wait_elected(10)
            first = a.term
            await b.start()
            await asyncio.sleep(0.5)
            assert a.is_leader() and not b.is_leader()
            await a.stop(timeout=5)
            assert await b.wait_elected(5)
            assert b.term is not None and first is not None and b.term > first
        finally:
            await a.stop(timeout=5)
            await b.stop(timeout=5)

    asyncio.run(main())

