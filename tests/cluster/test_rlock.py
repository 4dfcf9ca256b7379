"""RLock on a real Redis Cluster (issue #10): a lock runs on the master of its key's slot.

What a cluster user relies on: every name of a lock in one slot on one node, exclusion across
processes and threads, waiters woken by a release on that node (not by their bound), renewals
in one pipeline per node, listing over every master, and a clear error where a kind does not
run on a cluster yet.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from redis.crc import key_slot

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine import naming
from django_rlock.engine.listing import Locks
from django_rlock.engine.watchdog import watchdog
from tests.cluster_topology import ClusterTopology

ROOT = Path(__file__).resolve().parents[2]


def _calls(cluster: ClusterTopology, server, command: str) -> int:
    with cluster.node_client(server) as c:
        return c.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def _names_over_every_master(cluster: ClusterTopology, n: int = 60) -> list[str]:
    names = [f"spread-{i}" for i in range(n)]
    owners = {cluster.node_for_key(name).port for name in names}
    assert owners == {m.port for m in cluster.masters()}  # the sample covers every master
    return names


def test_every_name_of_a_lock_is_in_its_slot_on_its_master(cluster: ClusterTopology):
    rc = cluster.client()
    for name in _names_over_every_master(cluster, 30) + ["{tag}:a", "p{x}q"]:
        lock = RLock(rc, name)
        master = cluster.node_for_key(name)
        names = [lock.key, lock._channel, lock._index, *lock._wait_keys[2:], lock._grant_channel]
        with cluster.node_client(master) as c:
            slots = {c.execute_command("CLUSTER", "KEYSLOT", k) for k in names}
            assert slots == {key_slot(name.encode())}
            lock.lock()
            try:
                # The hash and its index entry are on the slot's master, nowhere else.
                assert c.hexists(lock.key, lock._field())
                assert c.hexists(lock._index, lock.key)
                assert lock.is_held_by_current_thread() and lock.hold_count() == 1
            finally:
                lock.unlock()
            assert not c.exists(lock.key) and not c.exists(lock._index)


def test_only_the_owner_may_unlock(cluster: ClusterTopology):
    rc = cluster.client()
    lock = RLock(rc, "owned")
    lock.lock()
    failed: list[BaseException] = []

    def other() -> None:
        try:
            RLock(rc, "owned").unlock()
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(failed) == 1 and isinstance(failed[0], LockNotOwnedError)
    assert "owned" in str(failed[0])
    assert lock.is_held_by_current_thread()
    lock.unlock()
    assert not lock.is_locked()


def test_a_waiter_is_woken_by_the_release_on_the_locks_master_only(cluster: ClusterTopology):
    rc = cluster.client()
    name = "woken"
    master = cluster.node_for_key(name)
    others = [m for m in cluster.masters() if m.port != master.port]
    holder = RLock(rc, name)  # watchdog mode: a 30 s lease, so only a wake-up ends the wait
    holder.lock()
    got = threading.Event()

    def waiter() -> None:
        with RLock(rc, name):
            got.set()

    before = {m.port: (_calls(cluster, m, "evalsha"), _calls(cluster, m, "publish"))
              for m in cluster.masters()}
    t = threading.Thread(target=waiter)
    t.start()
    # The waiter subscribes on the lock's master (its line, or the shared subscription).
    deadline = time.monotonic() + 10
    with cluster.node_client(master) as c:
        while time.monotonic() < deadline and c.pubsub_numsub(
                holder._channel)[0][1] + c.execute_command("PUBSUB", "NUMPAT") == 0 and not (
                c.pubsub_channels(f"{naming.WAKE_CHANNEL_PREFIX}:*")):
            time.sleep(0.01)
    time.sleep(0.2)  # parked
    assert not got.is_set()
    holder.unlock()
    assert got.wait(5), "the waiter slept on past the release"
    t.join(5)
    assert not holder.is_locked()
    for m in others:  # no script, no publish sent to the other masters
        assert (_calls(cluster, m, "evalsha"), _calls(cluster, m, "publish")) == before[m.port]
    assert _calls(cluster, master, "evalsha") > before[master.port][0]


def test_exclusion_across_four_processes_of_four_threads(cluster: ClusterTopology):
    rc = cluster.client()
    name, rounds = "excl", 15
    rc.delete(f"{name}:counter", f"{name}:inside")
    ports = ",".join(str(m.port) for m in cluster.masters())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.cluster._contender", ports, name,
                               "4", str(rounds)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    done = [line.split() for out in outs for line in out.splitlines() if line.startswith("done")]
    assert len(done) == 4, outs
    assert sum(int(d[1]) for d in done) == 4 * 4 * rounds
    assert sum(int(d[2]) for d in done) == 0
    assert int(rc.get(f"{name}:counter")) == 4 * 4 * rounds
    assert not RLock(rc, name).is_locked()


def test_renewals_reach_every_master_in_one_pipeline_each(cluster: ClusterTopology, monkeypatch):
    rc = cluster.client()
    names = _names_over_every_master(cluster, 30)
    wd = watchdog()
    sent: list[int] = []
    real = wd._pipeline

    def counting(client, calls, wait=None):  # a spy: every call still goes to the server
        sent.append(client.connection_pool.connection_kwargs["port"])
        return real(client, calls, wait)

    monkeypatch.setattr(wd, "_pipeline", counting)
    locks = [RLock(rc, n, watchdog_timeout=1.5) for n in names]
    for lock in locks:
        lock.lock()
    try:
        time.sleep(3.2)  # about 6 periods of 0.5 s; a lease of 1.5 s would have run out twice
        for lock in locks:
            assert lock.is_locked() and not lock.is_lost()
            ttl = lock.remaining_ttl()
            assert ttl is not None and 0 < ttl <= 1.5
        per_master = {m.port: sent.count(m.port) for m in cluster.masters()}
        # Every master renewed, each in about one pipeline per period (30 locks: a round trip
        # per lock would be ~10 per master and period).
        assert all(2 <= n <= 12 for n in per_master.values()), per_master
    finally:
        for lock in locks:
            lock.unlock()


def test_listing_covers_every_master(cluster: ClusterTopology):
    rc = cluster.client()
    names = _names_over_every_master(cluster, 24)
    locks = Locks(rc, "lst:")
    held = [RLock(rc, n, prefix="lst:") for n in names]
    for lock in held:
        lock.lock()
    try:
        assert locks.names() == sorted(names)
        assert locks.names("spread-1*") == sorted(n for n in names if n.startswith("spread-1"))
        assert locks.names(scan=True) == sorted(names)
        infos = locks.read(reversed(names))
        assert [i.name for i in infos] == list(reversed(names))
        assert all(len(i.holders) == 1 and i.holders[0].owner == held[0]._owner()
                   for i in infos)
        shown = locks.show(names[0])
        assert shown is not None and shown.kind == "lock"
        # A lock another prefix took is not ours to list.
        other = RLock(rc, "spread-0", prefix="other:")
        other.lock()
        try:
            assert locks.names() == sorted(names)
        finally:
            other.unlock()
        # Force-unlocking one on each master, from the listing.
        victims = {cluster.node_for_key("lst:" + n).port: n for n in names}
        cleared = locks.clear(victims.values())
        assert sorted(cleared) == sorted(victims.values())
        assert locks.names() == sorted(set(names) - set(victims.values()))
    finally:
        for lock in held:
            if lock.is_held_by_current_thread():
                lock.unlock()
    assert locks.names() == []


def test_an_expired_lock_leaves_the_listing(cluster: ClusterTopology):
    rc = cluster.client()
    lock = RLock(rc, "brief", prefix="exp:")
    assert lock.try_lock(lease_time=0.2)
    assert Locks(rc, "exp:").names() == ["brief"]
    time.sleep(0.4)
    assert Locks(rc, "exp:").names() == []
    with cluster.node_client(cluster.node_for_key(lock.key)) as c:
        assert not c.exists(lock._index)  # pruned on read


@pytest.mark.parametrize("lease", [None, 5.0])
def test_reentry_and_try_lock_on_a_cluster(cluster: ClusterTopology, lease):
    rc = cluster.client()
    lock = RLock(rc, f"re-{lease}")
    assert lock.try_lock(lease_time=lease)
    assert lock.try_lock(lease_time=lease)
    assert lock.hold_count() == 2
    seen: list[bool] = []
    t = threading.Thread(target=lambda: seen.append(RLock(rc, f"re-{lease}").try_lock(0.2)))
    t.start()
    t.join()
    assert seen == [False]
    lock.unlock()
    lock.unlock()
    assert not lock.is_locked()
