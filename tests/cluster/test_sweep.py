"""The index sweep on a Redis Cluster (invariant 11, ``engine/sweep.py``): the index is per lock
there, in its slot; each master this process locked on has its index hashes walked with SCAN,
and those of locks gone are pruned, while a live lock's stays."""

from __future__ import annotations

import time

from django_rlock import RLock
from django_rlock.engine import sweep
from django_rlock.engine.clients import node_clients
from django_rlock.engine.naming import index_key
from django_rlock.engine.watchdog import watchdog
from tests.cluster_topology import ClusterTopology


def _indexes(rc) -> set[str]:
    return {k.decode() for c in node_clients(rc)
            for k in c.scan_iter(match="rlock-index:swc:*", count=1000)}


def test_expired_leases_leave_their_indexes_on_every_master(cluster: ClusterTopology,
                                                            monkeypatch):
    monkeypatch.setattr(sweep, "PERIOD", 0.05)
    monkeypatch.setattr(sweep, "HURRY", 0.05)
    rc = cluster.client()
    names = [f"gone-{i}" for i in range(30)] + ["{tagged}gone"]
    for n in names:
        RLock(rc, n, prefix="swc:").lock(lease_time=30)
    held = RLock(rc, "held", prefix="swc:", watchdog_timeout=3)
    held.lock()
    leased = RLock(rc, "{tagged}leased", prefix="swc:")
    leased.lock(lease_time=60)
    live = {index_key("swc:", "swc:held"), index_key("swc:", "swc:{tagged}leased")}
    assert len(_indexes(rc)) == len(names) + 2
    masters = {cluster.node_for_key("swc:" + n).port for n in names}
    assert len(masters) == 3  # every master has some
    for n in names:  # the leases run out now
        rc.pexpire("swc:" + n, 1)
    deadline = time.monotonic() + 15
    while _indexes(rc) != live and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _indexes(rc) == live
    rounds = watchdog().sweeper.rounds
    while watchdog().sweeper.rounds - rounds < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _indexes(rc) == live and rc.exists("swc:held", "swc:{tagged}leased") == 2
    held.unlock()
    leased.unlock()
