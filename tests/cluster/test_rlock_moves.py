"""RLock while its slot moves (issue #10): a migration, a coordinated failover, a SIGKILLed master.

A held lock keeps being renewed where its slot is now, a waiter still gets it when it is
released, and a hold the move lost is reported lost (``on_lost``, ``is_lost()``), never kept
silently: while its holder believes it holds the lock, nobody else gets it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from django_rlock import RLock
from tests.cluster_topology import ClusterTopology

ROOT = Path(__file__).resolve().parents[2]


def _field_on(cluster: ClusterTopology, server, lock: RLock) -> bool:
    with cluster.node_client(server) as c:
        return bool(c.hexists(lock.key, lock._field()))


class _Contender(threading.Thread):
    """Tries for the lock over and over from a live thread, and records whether it ever got
    it while ``holding`` was set (an overlap)."""

    def __init__(self, rc, name: str, holding: threading.Event) -> None:
        super().__init__(daemon=True)
        self.lock, self.holding = RLock(rc, name), holding
        self.stop, self.overlaps, self.errors = threading.Event(), 0, 0
        self.got = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.lock.try_lock(0.2):
                    if self.holding.is_set():
                        self.overlaps += 1
                    self.got.set()
                    self.lock.unlock()
                    return
            except Exception:  # a failover under way: connection errors are expected
                self.errors += 1
                time.sleep(0.1)


def test_a_held_lock_follows_its_slot_to_another_master(cluster: ClusterTopology):
    rc = cluster.client()
    name = "moving"
    lock = RLock(rc, name, watchdog_timeout=3.0)
    lock.lock()
    holding = threading.Event()
    holding.set()
    slot, src = cluster.keyslot(name), cluster.node_for_key(name)
    dst = next(m for m in cluster.masters() if m is not src)
    contender = _Contender(cluster.client(), name, holding)
    contender.start()
    time.sleep(0.3)  # waiting: registered in the line on the source
    assert cluster.migrate_slot(slot, src, dst) >= 2  # the hash, its index (and the line)
    time.sleep(4.0)  # more than a lease: only renewals on the new master keep it
    assert not lock.is_lost()
    assert cluster.node_for_key(name) is dst and _field_on(cluster, dst, lock)
    with cluster.node_client(dst) as c:
        assert 0 < c.pttl(lock.key) <= 3000
    assert lock.is_held_by_current_thread() and lock.hold_count() == 1
    assert not contender.got.is_set()
    holding.clear()
    lock.unlock()
    assert contender.got.wait(10), "the waiter was not woken after the move"
    contender.stop.set()
    contender.join(5)
    assert contender.overlaps == 0
    assert RLock(rc, name).client.connection_pool.connection_kwargs["port"] == dst.port


_WAITER = """
import sys, time
from redis.cluster import ClusterNode, RedisCluster
from django_rlock import RLock
rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", int(p)) for p in sys.argv[1].split(",")])
lock = RLock(rc, sys.argv[2])
print("waiting", flush=True)
lock.lock()
print("got", flush=True)
lock.unlock()
"""


def test_a_waiter_follows_its_lock_to_another_master(cluster: ClusterTopology):
    """A waiter in another process subscribed on the old master: after the move (which, with
    sharded pub/sub, drops its subscription) it re-checks every ``MOVED_RECHECK`` instead of
    sleeping out the holder's 30 s lease, so the release on the new master reaches it."""
    name = "moving-waiter"
    holder = RLock(cluster.client(), name)  # 30 s: only a release can end the wait in time
    holder.lock()
    ports = ",".join(str(m.port) for m in cluster.masters())
    proc = subprocess.Popen([sys.executable, "-c", _WAITER, ports, name], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(1.0)  # parked on the old master's subscription
        slot, src = cluster.keyslot(name), cluster.node_for_key(name)
        dst = next(m for m in cluster.masters() if m is not src)
        cluster.migrate_slot(slot, src, dst)
        time.sleep(0.5)
        holder.unlock()
        t0 = time.monotonic()
        out = proc.communicate(timeout=20)[0]
        assert "got" in out and time.monotonic() - t0 < 5, "slept past the release"
    finally:
        proc.kill()
    assert not holder.is_locked()


def test_a_release_during_a_migration_completes_when_it_ends(cluster: ClusterTopology):
    rc = cluster.client()
    name = "{mig}:a"
    lock = RLock(rc, name, watchdog_timeout=3.0)
    lock.lock()
    slot, src = cluster.keyslot(name), cluster.node_for_key(name)
    dst = next(m for m in cluster.masters() if m is not src)
    cluster.begin_migration(slot, src, dst)

    def finish() -> None:
        time.sleep(0.5)
        cluster.move_keys(slot, src, dst)
        cluster.finish_migration(slot, src, dst)

    mover = threading.Thread(target=finish)
    mover.start()
    # Its scripts name keys that do not exist (channels, the line): the server answers TRYAGAIN
    # or ASK while the slot is half moved, and the release is sent again until it runs.
    lock.unlock()
    mover.join(30)
    assert not lock.is_locked()
    with cluster.node_client(dst) as c, cluster.node_client(src) as s:
        assert not c.exists(lock.key) and s.dbsize() >= 0
    again = RLock(rc, name)
    assert again.try_lock()
    assert _field_on(cluster, dst, again)
    again.unlock()


def test_a_held_lock_survives_a_coordinated_failover(cluster: ClusterTopology):
    rc = cluster.client()
    name = "failing-over"
    lost: list[str] = []
    lock = RLock(rc, name, watchdog_timeout=3.0, on_lost=lost.append)
    lock.lock()  # sync_replicas="auto": acknowledged by the master's replica
    holding = threading.Event()
    holding.set()
    master = cluster.node_for_key(name)
    (replica,) = cluster.replicas_of(master)
    contender = _Contender(cluster.client(), name, holding)
    contender.start()
    assert cluster.failover(replica) is master
    time.sleep(4.0)  # more than a lease: renewed on the promoted replica
    assert lost == [] and not lock.is_lost()
    assert _field_on(cluster, replica, lock)
    assert not contender.got.is_set()
    holding.clear()
    lock.unlock()
    assert contender.got.wait(10)
    contender.stop.set()
    contender.join(5)
    assert contender.overlaps == 0


@pytest.mark.parametrize("lease, outcome", [(20.0, "kept"), (1.0, "lost")])
def test_a_sigkilled_master_the_hold_is_kept_or_reported_lost(cluster: ClusterTopology, lease,
                                                               outcome):
    """20 s: the replica had the hold (WAIT at acquire) and a lease outlasts the promotion, so
    it is kept. 1 s: the lease runs out before a replica is promoted (over 1 s of node timeout
    plus the election), so the holder is told it lost the lock; and the other client, which
    was trying on the dead master, follows the slot and gets it."""
    rc = cluster.client()
    name = f"killed-master-{outcome}"
    lost: list[str] = []
    lock = RLock(rc, name, watchdog_timeout=lease, on_lost=lost.append)
    lock.lock()
    victim = cluster.node_for_key(name)
    holding = threading.Event()
    holding.set()
    contender = _Contender(cluster.client(), name, holding)
    contender.start()
    cluster.kill(victim)
    heir = cluster.wait_for_promotion(victim, timeout=30)
    try:
        time.sleep(2.0)  # past the short lease; renewals reach the new master by now
        if outcome == "lost":
            assert lock.is_lost() and lost == [name]
            holding.clear()
            assert contender.got.wait(15), "the other client never found the new master"
        else:
            assert not lock.is_lost() and lost == []
            assert _field_on(cluster, heir, lock), "kept silently: not held on the new master"
            assert not contender.got.is_set()
            holding.clear()
            lock.unlock()
            assert contender.got.wait(15)
            assert contender.overlaps == 0
    finally:
        contender.stop.set()
        contender.join(5)
        cluster.revive(victim)
