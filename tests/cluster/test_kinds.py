"""The family on a Redis Cluster (issue #10): FairLock, FencedLock, ReadWriteLock, the semaphores
and the latch run on the master of their key's slot as RLock does, with their own scripts,
channels and renewals.
"""

from __future__ import annotations

import threading
import time

import pytest
from redis.crc import key_slot

from django_rlock import (
    CountDownLatch,
    FairLock,
    FencedLock,
    MultiLock,
    PermitExpirableSemaphore,
    ReadWriteLock,
    RLock,
    Semaphore,
)
from django_rlock.engine.listing import Locks
from django_rlock.engine.semaphore import RECHECK
from tests.cluster_topology import ClusterTopology


def _calls(cluster: ClusterTopology, server, command: str) -> int:
    with cluster.node_client(server) as c:
        return c.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def _kinds(rc, name: str, watchdog: float):
    return {
        "fair": lambda: FairLock(rc, name, watchdog_timeout=watchdog),
        "fenced": lambda: FencedLock(rc, name, watchdog_timeout=watchdog),
        "write": lambda: ReadWriteLock(rc, name, watchdog_timeout=watchdog).write_lock(),
    }


@pytest.mark.parametrize("kind", ["fair", "fenced", "write"])
def test_a_kind_holds_renews_and_wakes_its_waiter_on_its_master(cluster: ClusterTopology, kind):
    rc = cluster.client()
    name = f"kind-{kind}"
    master = cluster.node_for_key(name)
    others = [m for m in cluster.masters() if m.port != master.port]
    before = {m.port: _calls(cluster, m, "evalsha") for m in others}
    # Renewed on its master past a 1.5 s lease.
    short = _kinds(rc, name, 1.5)[kind]()
    short.lock()
    try:
        time.sleep(2.0)
        assert short.is_locked() and not short.is_lost()
        with cluster.node_client(master) as c:
            assert 0 < c.pttl(short.key) <= 1500
            assert key_slot(short._index.encode()) == key_slot(name.encode())
            assert c.hexists(short._index, short.key)
        (info,) = Locks(rc).read([name])
        assert info.kind == ("rw" if kind == "write" else kind)
    finally:
        short.unlock()
    # A waiter is woken by the release (its bound, the holder's 30 s lease, is far off).
    make = _kinds(rc, name, 30.0)[kind]
    holder = make()
    holder.lock()
    got = threading.Event()

    def waiter() -> None:
        lock = make()
        lock.lock()
        got.set()
        lock.unlock()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)
    assert not got.is_set()
    holder.unlock()
    assert got.wait(5), "the waiter was not woken by the release"
    t.join(5)
    assert not holder.is_locked()
    assert {m.port: _calls(cluster, m, "evalsha") for m in others} == before


def test_fenced_tokens_grow_on_a_cluster(cluster: ClusterTopology):
    rc = cluster.client()
    lock = FencedLock(rc, "fenced-tokens")
    tokens = []
    for _ in range(3):
        tokens.append(lock.lock_and_get_token())
        lock.unlock()
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert lock.get_token() == tokens[-1]


def test_readers_share_and_a_writer_waits_for_both(cluster: ClusterTopology):
    rc = cluster.client()
    rw = ReadWriteLock(rc, "rw-cluster", watchdog_timeout=1.5)
    slow = ReadWriteLock(rc, "rw-cluster", watchdog_timeout=30.0)
    entered = threading.Event()
    release = threading.Event()

    def reader() -> None:
        lock = rw.read_lock()
        lock.lock()
        entered.set()
        release.wait(10)
        lock.unlock()

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    assert entered.wait(5)
    time.sleep(0.1)
    assert rw.read_lock().is_locked()
    got = threading.Event()

    def writer() -> None:
        w = slow.write_lock()  # its bound: a reader's lease, 1.5 s at most
        w.lock()
        got.set()
        w.unlock()

    wt = threading.Thread(target=writer)
    wt.start()
    time.sleep(2.0)  # read holds renewed past their 1.5 s lease; the writer still waits
    assert not got.is_set()
    release.set()
    for t in readers:
        t.join(5)
    assert got.wait(5), "the writer was not woken by the last read unlock"
    wt.join(5)
    assert not rw.write_lock().is_locked()


def test_a_semaphore_wakes_a_waiter_when_a_permit_comes_back(cluster: ClusterTopology):
    rc = cluster.client()
    sem = Semaphore(rc, "sem-cluster")
    assert sem.try_set_permits(1)
    master = cluster.node_for_key(sem.key)
    with cluster.node_client(master) as c:
        assert c.get(sem.key) == b"1" and c.hexists(sem._index, sem.key)
    sem.acquire()
    got = threading.Event()

    def waiter() -> None:
        Semaphore(rc, "sem-cluster").acquire()
        got.set()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)
    assert not got.is_set() and sem.available_permits() == 0
    t0 = time.monotonic()
    sem.release()
    assert got.wait(5)
    assert time.monotonic() - t0 < RECHECK / 2  # woken by the release, not by its re-check
    t.join(5)
    (info,) = Locks(rc).read(["sem-cluster"])
    assert info.kind in ("semaphore", "semaphore|latch")
    assert sem.delete() and not sem.delete()


def test_expirable_permits_are_renewed_and_listed_on_a_cluster(cluster: ClusterTopology):
    rc = cluster.client()
    sem = PermitExpirableSemaphore(rc, "permits-cluster", watchdog_timeout=1.5)
    assert sem.try_set_permits(2)
    a = sem.acquire()  # no lease: renewed by the watchdog
    time.sleep(2.0)
    assert sem.available_permits() == 1  # still taken past its 1.5 s lease
    (info,) = Locks(rc).read(["permits-cluster"])
    assert info.kind == "permits"
    b = sem.try_acquire(lease_time=5)
    assert b is not None and sem.try_acquire() is None
    sem.release(a)
    sem.release(b)
    assert sem.available_permits() == 2
    assert sem.delete()


def test_a_latch_opens_for_its_waiter_on_a_cluster(cluster: ClusterTopology):
    rc = cluster.client()
    latch = CountDownLatch(rc, "latch-cluster")
    assert latch.try_set_count(2)
    opened = threading.Event()

    def waiter() -> None:
        if CountDownLatch(rc, "latch-cluster").wait(10):
            opened.set()

    t = threading.Thread(target=waiter)
    t.start()
    latch.count_down()
    time.sleep(0.3)
    assert not opened.is_set() and latch.get_count() == 1
    latch.count_down()
    assert opened.wait(5)
    t.join(5)
    assert latch.get_count() == 0


def test_a_multilock_over_keys_on_every_master(cluster: ClusterTopology):
    """Redisson's MultiLock use on a cluster: all of several keys (here on different masters)
    or none; renewed on each member's own master."""
    rc = cluster.client()
    names = ["multi-a", "multi-b", "multi-c", "multi-d", "multi-e", "multi-f"]
    assert len({cluster.node_for_key(n).port for n in names}) >= 2
    multi = MultiLock(*[RLock(rc, n, watchdog_timeout=1.5) for n in names])
    multi.lock()
    try:
        time.sleep(2.0)  # past a 1.5 s lease: every member renewed on its master
        assert all(RLock(rc, n).is_locked() for n in names)
        blocked = [False]

        def other() -> None:  # one member free, the others held: the whole is refused
            blocked[0] = not MultiLock(RLock(rc, "multi-free"), RLock(rc, names[0])).try_lock()

        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        assert blocked == [True] and not RLock(rc, "multi-free").is_locked()
    finally:
        multi.unlock()
    assert not any(RLock(rc, n).is_locked() for n in names)
