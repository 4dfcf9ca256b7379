"""The index of held locks: kept by the scripts, verified on read, never a SCAN."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from django_rlock import RLock
from django_rlock.engine import identity, records
from django_rlock.engine.listing import Locks, describe_holders
from django_rlock.engine.lockinfo import describes, parse_entry
from django_rlock.engine.naming import index_key
from django_rlock.engine.watchdog import server_id


def entry(r, prefix: str, key: str) -> dict | None:
    parsed = parse_entry(r.hget(index_key(prefix), key))
    return None if parsed is None else {"since": parsed[0], **parsed[1]}


def test_a_lock_is_indexed_from_acquire_to_release_with_its_holder(r, holders):
    lock = RLock(r, "indexed", prefix="app:")
    h = holders()
    h.thread.name = "worker-7"
    h.call(lock.lock)
    e = entry(r, "app:", "app:indexed")
    assert e is not None and describes(e, h.call(identity.thread_owner))
    # Format 3: the thread in the entry, the process in its record (joined by listings).
    assert e["thread"] == "worker-7" and e["record"] is True and "pid" not in e
    assert e["os_thread_id"] == h.thread.ident
    (holder,) = Locks(r, "app:").read(["indexed"])[0].holders
    assert holder.pid == os.getpid() and holder.host and holder.process == identity.process_label()
    h.call(lock.lock)  # reentry: the entry (and its "since") stays as it was
    assert entry(r, "app:", "app:indexed") == e
    h.call(lock.unlock)
    h.call(lock.unlock)
    assert r.hlen(index_key("app:")) == 0


def test_listing_shows_holder_details_and_uses_no_scan(r, holders):
    h = holders()
    h.thread.name = "exporter"
    shown = RLock(r, "shown", prefix="p:")
    h.call(shown.lock)
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
    h.call(shown.unlock)  # leave no hold for the watchdog of later tests


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
    released = time.time()
    first.call(lock.unlock)  # a waiter of this process: handed over in the release
    assert got(10) is True
    e = entry(r, "p:", "p:handed")
    assert e["thread"] == "second" and describes(e, second.call(identity.thread_owner))
    # Since the grant (the server's time in the release), not since the heir began to wait.
    assert e["since"] > released - 0.1
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


def _hold_as(r, key: str, owner: str) -> None:
    r.hset(key, owner, 1)
    r.pexpire(key, 30_000)


def test_entries_in_the_previous_format_are_still_listed_with_their_holder(r):
    """A deploy: processes of the previous release write "<s>.<us> <json>" (and their hand-off
    puts "<s>.<us> " in front of a new process's entry); listing reads all three."""
    old_owner = "0d1f2a3b-1111-4222-8333-944455556666:7"
    _hold_as(r, "p:old", old_owner)
    about = {"owner": old_owner, "host": "web-1", "pid": 4121, "process": "runserver",
             "thread": "Thread-7", "os_thread_id": 1234}
    r.hset(index_key("p:"), "p:old", f"{time.time() - 2:.6f} {json.dumps(about)}")
    # Format 2 (the previous release's: the process inline), and behind an older release's
    # "<s>.<us> " (its hand-off); format 3 behind one (a release of the previous release
    # granting to a waiter of this one).
    new_owner = "5e6f7a8b-1111-4222-8333-944455556666:9"
    _hold_as(r, "p:mixed", new_owner)
    info = identity.with_kind(identity.thread_info_inline(new_owner), "fenced")
    r.hset(index_key("p:"), "p:mixed", f"{time.time() - 3:.6f} {info}")
    _hold_as(r, "p:two", new_owner[:-1] + "8")
    info = identity.with_kind(identity.thread_info_inline(new_owner[:-1] + "8"), "fair")
    r.hset(index_key("p:"), "p:two", f"{int(time.time() * 1000) - 4000}{info[info.index(identity.SEP):]}")
    three = identity.thread_owner()
    records.write(r, server_id(r))
    _hold_as(r, "p:three", three)
    info = identity.with_kind(identity.thread_info(three), "fenced")
    r.hset(index_key("p:"), "p:three", f"{time.time() - 5:.3f} {info}")
    locks = Locks(r, "p:")
    assert locks.names() == ["mixed", "old", "three", "two"]
    mixed, old, three, two = locks.read(["mixed", "old", "three", "two"])
    for info, kind, held in ((two, "fair", 4), (three, "fenced", 5)):
        (h,) = info.holders
        assert info.kind == kind and h.pid == os.getpid() and h.thread == "MainThread"
        assert held - 0.5 < h.held_for < held + 5
    (h,) = old.holders
    assert (h.host, h.pid, h.process, h.thread, h.os_thread_id) == (
        "web-1", 4121, "runserver", "Thread-7", 1234)
    assert 1.5 < h.held_for < 10
    (h,) = mixed.holders
    assert mixed.kind == "fenced" and h.pid == os.getpid() and h.thread == "MainThread"
    assert 2.5 < h.held_for < 10


def test_an_entry_is_compact_and_not_attributed_to_another_holder(r):
    """The entry names its holder by the uuid's first 8 characters and the serial: a lock that
    expired and was taken again by a client that writes no entry (Redisson) is not shown with
    the old holder's details."""
    RLock(r, "short", prefix="p:").lock(lease_time=30)  # lease mode: nothing renews it
    raw = r.hget(index_key("p:"), "p:short")
    # 44 bytes at most: the allocator's 48-byte class (docs/benchmarks.md, "What the index
    # costs"); the process is in its record (invariant 43).
    assert b"{" not in raw and len(raw) <= 44, raw
    assert Locks(r, "p:").read(["short"])[0].holders[0].pid == os.getpid()
    mine = identity.thread_owner()
    r.delete("p:short")  # gone behind the index's back, taken again by a Java client whose
    _hold_as(r, "p:short", "x" + mine[1:])  # uuid differs in one character, same serial
    (h,) = Locks(r, "p:").read(["short"])[0].holders
    assert h.pid is None and h.held_for is None
    r.delete("p:short")
    _hold_as(r, "p:short", mine[:-1] + "99")  # same process uuid, another serial
    (h,) = Locks(r, "p:").read(["short"])[0].holders
    assert h.pid is None


def test_a_direct_hand_off_lists_the_heir_since_the_release_with_old_info_too(r):
    """A release that hands straight to an unregistered waiter of its own process (reply -1)
    lists the heir from then, by the server's clock, not from when its info was made; the
    info of a waiter of the previous release (JSON) gets format 1's stamp."""
    from django_rlock.engine.naming import grant_channel, handoff_queue, handoff_waiters, lock_channel
    from django_rlock.engine.scripts import RELEASE_SCRIPT, call

    key = "p:direct"
    keys = (key, lock_channel(key), index_key("p:"), handoff_queue(key), handoff_waiters(key),
            grant_channel(key))
    me = identity.thread_owner()
    heir = me[:-1] + "8"
    made = identity.thread_info(heir)  # format 3, no time: the release puts it in front
    stamped = f"{int(time.time() * 1000) - 5000:x}{made}"  # a waiter's record: stamped before
    inline = identity.thread_info_inline(heir)  # a waiter of the previous release (format 2)
    inline = f"{int(inline.split(identity.SEP)[0]) - 5000}{inline[inline.index(identity.SEP):]}"
    old = json.dumps({"owner": heir, "host": "h", "pid": 1, "thread": "old"})
    for info in (made, stamped, inline, old):
        _hold_as(r, key, me)
        before = time.time()
        assert call(r, RELEASE_SCRIPT, keys, (me, 30000, "0", heir, 30000, 1, info, "", "")) == -1
        e = entry(r, "p:", key)
        assert describes(e, heir) and before - 0.1 < e["since"] < time.time() + 0.1
        r.delete(key)


def test_a_name_with_the_separator_in_it_keeps_the_entry_readable(r, holders):
    h = holders()
    h.thread.name = "odd\x1fname"
    h.call(lambda: RLock(r, "odd", prefix="p:").lock(lease_time=30))
    (info,) = Locks(r, "p:").read(["odd"])
    (holder,) = info.holders
    assert holder.thread == "odd?name" and holder.pid == os.getpid()


@pytest.mark.parametrize("kind", ["lock", "fenced"])
def test_the_entry_is_stamped_with_the_servers_clock_not_the_holders(r, monkeypatch, kind):
    """A holder host whose clock is an hour off must not make "held for" an hour off: the
    script puts the server's TIME in front of the entry the holder built."""
    from django_rlock import FencedLock

    monkeypatch.setattr(identity.time, "time", lambda: 3600.0 + _real_time())
    lock = RLock(r, "skewed") if kind == "lock" else FencedLock(r, "skewed")
    lock.lock()
    try:
        since, _ = parse_entry(r.hget(index_key(""), lock.key))
        server_now = float(".".join(str(x) for x in r.time()))
        assert abs(server_now - since) < 5.0, (server_now, since)
    finally:
        lock.unlock()


_real_time = time.time
