"""Process records on a Redis Cluster (invariant 43): the index is per lock, in the lock's slot,
so the record is written through the cluster client, in a slot of its own, and listings join
it from there, whichever master holds the lock."""

from __future__ import annotations

import asyncio
import os

from redis.crc import key_slot

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import identity, records
from django_rlock.engine.listing import Locks
from django_rlock.engine.naming import process_key
from tests.cluster_topology import ClusterTopology


def test_locks_on_every_master_list_their_holder_through_the_record(cluster: ClusterTopology):
    rc = cluster.client()
    records.forget()
    key = process_key(identity.process_id())
    names = [f"rec-{i}" for i in range(12)]
    locks = [RLock(rc, n) for n in names]
    for lock in locks:
        lock.lock(lease_time=30)
    try:
        masters = {cluster.node_for_key(n).port for n in names}
        assert len(masters) > 1  # the locks are spread; the record is in one slot
        assert rc.get(key).decode().split(identity.SEP3)[0] == str(os.getpid())
        infos = Locks(rc).read(names)
        assert sorted(i.name for i in infos) == sorted(names)
        for info in infos:
            (h,) = info.holders
            assert (h.pid, h.process) == (os.getpid(), identity.process_label())
            assert h.thread == "MainThread"
        # A lock in the record's own slot and one elsewhere: the same listing.
        assert any(key_slot(n.encode()) != key_slot(key.encode()) for n in names)
    finally:
        for lock in locks:
            lock.unlock()


def test_an_asyncio_lock_on_a_cluster_writes_the_record_too(cluster: ClusterTopology):
    rc = cluster.client()
    records.forget()
    rc.delete(process_key(identity.process_id()))

    async def main() -> int | None:
        arc = cluster.async_client()
        lock = AsyncRLock(arc, "rec-async")
        await lock.lock()
        try:
            (info,) = Locks(rc).read(["rec-async"])
            return info.holders[0].pid
        finally:
            await lock.unlock()
            await arc.aclose()

    assert asyncio.run(main()) == os.getpid()
