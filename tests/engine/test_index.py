"""The index of held locks: kept by the scripts, verified on read, never a SCAN."""

from __future__ import annotations

import json
import threading
import time

import pytest

from django_rlock import RLock
from django_rlock.engine import identity
from django_rlock.engine.listing import Locks, describe_holders
from django_rlock.engine.naming import index_key


def entry(r, prefix: str, key: str) -> dict | None:
    raw = r.hget(index_key(prefix), key)
    if raw is None:
        return None
    since, _, blob = raw.decode().partition(" ")
    return {"since": float(since), **json.loads(blob)}


def test_a_lock_is_indexed_from_acquire_to_release_with_its_holder(r, holders):
    lock = RLock(r, "indexed", prefix="app:")
    h = holders()
    h.thread.name = "worker-7"
    h.call(lock.lock)
    e = entry(r, "app:", "app:indexed")
    assert e is not None and e["owner"] == h.call(identity.thread_owner)
    assert e["thread"] == "worker-7" and e["pid"] > 0 and e["host"] and e["process"]
    assert e["os_thread_id"] == h.thread.ident
    h.call(lock.lock)  # reentry: the entry (and its "since") stays as it was
    assert entry(r, "app:", "app:indexed") == e
    h.call(lock.unlock)
    h.call(lock.unlock)
    assert r.hlen(index_key("app:")) == 0


def test_listing_shows_holder_details_and_uses_no_scan(r, holders):
    h = holders()
    h.thread.name = "exporter"
    h.call(RLock(r, "shown", prefix="p:").lock)
    time.sleep(0.2)
    r.config_resetstat()
    locks = Locks(r, "p:")
    (info,) = locks.read(locks.names())
    (holder,) = info.holders
    assert holder.thread == "exporter" and holder.hold_count == 1
    assert 0.15 < holder.held_for < 5
    assert set(holder.as_dict()) == {"client_id", "thread_id", "hold_count", "host", "pid",
                                     "process", "thread", "held_for"}
    assert "cmdstat_scan" not in r.info("commandstats")
    assert "exporter" in describe_holders(r, "p:shown", "p:")


def test_a_foreign_holder_is_found_by_scan_only_with_unknown_details(r):
    r.hset("p:java", "8a7c1f0e-1111-4222-8333-944455556666:57", 1)
    r.pexpire("p:java", 30_000)
    assert Locks(r, "p:").names() == []
    assert Locks(r, "p:").names(scan=True) == ["java"]
    (info,) = Locks(r, "p:").read(["java"])
    (holder,) = info.holders
    assert holder.thread_id == 57 and holder.pid is None and holder.held_for is None


def test_entries_of_locks_deleted_or_expired_behind_its_back_are_not_listed_and_pruned(r):
    RLock(r, "expiring", prefix="p:").lock(lease_time=0.2)
    deleted = RLock(r, "deleted", prefix="p:")
    deleted.lock(lease_time=30)
    r.delete("p:deleted")
    time.sleep(0.3)
    assert r.hlen(index_key("p:")) == 2
    assert Locks(r, "p:").names() == []
    assert r.hlen(index_key("p:")) == 0


def test_a_hand_off_rewrites_the_entry_and_force_unlock_removes_it(r, holders):
    lock = RLock(r, "handed", prefix="p:")
    first, second = holders(), holders()
    first.thread.name, second.thread.name = "first", "second"
    first.call(lock.lock)
    got = second.submit(lambda: lock.try_lock(wait_time=10))
    time.sleep(0.3)
    first.call(lock.unlock)  # a waiter of this process: handed over in the release
    assert got(10) is True
    e = entry(r, "p:", "p:handed")
    assert e["thread"] == "second" and e["owner"] == second.call(identity.thread_owner)
    assert lock.force_unlock() is True
    assert entry(r, "p:", "p:handed") is None


def test_a_dead_threads_release_removes_its_entry(r):
    # Released by the watchdog within a period (1 s); a lease running out would leave the entry.
    t = threading.Thread(target=RLock(r, "gone", prefix="p:", watchdog_timeout=3.0).lock)
    t.start()
    t.join()
    deadline = time.monotonic() + 5
    while r.exists("p:gone") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not r.exists("p:gone") and entry(r, "p:", "p:gone") is None


def test_prune_never_unlists_a_lock_taken_again_since_the_read(r):
    from django_rlock.engine.scripts import PRUNE_INDEX_SCRIPT, call

    lock = RLock(r, "again", prefix="p:")
    lock.lock()
    # A reader that saw the key gone a moment ago prunes it now: the live lock stays listed.
    assert call(r, PRUNE_INDEX_SCRIPT, (index_key("p:"), "p:again"), ()) == 0
    assert Locks(r, "p:").names() == ["again"]
    lock.unlock()


@pytest.mark.parametrize("prefix", ["", "app:rlock:", "we*ird[1]:"])
def test_index_key_is_outside_the_prefix_and_matches_are_literal(r, prefix):
    RLock(r, "a*b", prefix=prefix).lock(lease_time=5)
    RLock(r, "axb", prefix=prefix).lock(lease_time=5)
    assert not index_key(prefix).startswith(prefix) or prefix == ""
    assert Locks(r, prefix).names() == ["a*b", "axb"]
    assert Locks(r, prefix).names("a\\*b") == ["a*b"]
    assert sorted(Locks(r, prefix).names(scan=True)) == ["a*b", "axb"]
