"""Listing, showing and force-unlocking every kind of the family (``engine.listing``).

The keys are written with raw Redis commands in Redisson's layout (``write_kinds``), with or
without the index entries the kinds' scripts write, so these tests depend on the layout only,
not on the kind classes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_rlock.engine import events
from django_rlock.engine.listing import (
    BATCH,
    NEVER_MS,
    LockInfo,
    Locks,
    describe_holders,
    is_auxiliary,
)
from django_rlock.engine.naming import (
    index_key,
    latch_channel,
    lock_channel,
    prefix_name,
    suffix_name,
)

U1, U2, U3 = ("0b3c4d5e-0000-4000-8000-00000000000a", "0b3c4d5e-0000-4000-8000-00000000000b",
              "0b3c4d5e-0000-4000-8000-00000000000c")
W1, W2 = f"{U3}:7", f"{U3}:8"  # fair waiters
PERMIT_1, PERMIT_2 = "a1" * 16, "b2" * 16


def now_ms(client: redis.Redis) -> int:
    s, us = client.time()
    return int(s) * 1000 + int(us) // 1000


def rw_timeout(key: str, field: str, k: int) -> str:
    return suffix_name(key, f"{field}:rwlock_timeout:{k}")


def index(client: Any, prefix: str, key: str, kind: str | None, owner: str | None = None,
          **info: Any) -> None:
    """The index entry a kind's script writes where its key is created."""
    data = ({"owner": owner, "host": "web-1", "pid": 12, "process": "worker",
             "thread": "T-1", "os_thread_id": 99, **info} if owner else {})
    if kind is not None:
        data["kind"] = kind
    client.hset(index_key(prefix), key, f"{time.time():.6f} {json.dumps(data)}")


def write_kinds(client: redis.Redis, prefix: str, *, indexed: bool = True,
                tag: str = "") -> dict[str, str]:
    """Every kind under ``prefix`` in Redisson's layout; returns name -> kind as the index
    names it. ``tag`` (e.g. "{t}") goes into every name: auxiliary keys then carry no braces
    of their own and land under the prefix too (Redisson's brace rule)."""
    n = now_ms(client)
    p = prefix + tag
    idx = (lambda key, kind, owner=None: index(client, prefix, key, kind, owner)) if indexed \
        else (lambda *a, **k: None)
    pipe = client.pipeline(transaction=False)

    pipe.hset(f"{p}plain", f"{U1}:1", 2)
    pipe.pexpire(f"{p}plain", 30_000)
    idx(f"{p}plain", None, f"{U1}:1")

    key = f"{p}fair"
    pipe.hset(key, f"{U1}:2", 1)
    pipe.pexpire(key, 30_000)
    pipe.rpush(prefix_name("redisson_lock_queue", key), W1, W2)
    pipe.zadd(prefix_name("redisson_lock_timeout", key), {W1: n + 40_000, W2: n + 45_000})
    idx(key, "fair", f"{U1}:2")

    key = f"{p}rw"  # two readers
    pipe.hset(key, mapping={"mode": "read", f"{U1}:3": 2, f"{U2}:4": 1})
    pipe.pexpire(key, 30_000)
    for field, k in ((f"{U1}:3", 1), (f"{U1}:3", 2), (f"{U2}:4", 1)):
        pipe.set(rw_timeout(key, field, k), 1, px=30_000)
    idx(key, "rw", f"{U1}:3")

    key = f"{p}rw-w"  # a writer that also reads (downgrade)
    pipe.hset(key, mapping={"mode": "write", f"{U2}:5:write": 1, f"{U2}:5": 1})
    pipe.pexpire(key, 30_000)
    pipe.set(rw_timeout(key, f"{U2}:5", 1), 1, px=30_000)
    idx(key, "rw", f"{U2}:5:write")

    key = f"{p}fenced"
    pipe.hset(key, f"{U1}:6", 1)
    pipe.pexpire(key, 30_000)
    pipe.set(prefix_name("redisson_lock_token", key), 17)
    idx(key, "fenced", f"{U1}:6")

    pipe.set(f"{p}sem", 3)
    idx(f"{p}sem", "semaphore")

    key = f"{p}permits"
    pipe.set(key, 1)
    pipe.zadd(suffix_name(key, "timeout"), {bytes.fromhex(PERMIT_1): n + 20_000,
                                            bytes.fromhex(PERMIT_2): NEVER_MS})
    idx(key, "permits")

    pipe.set(f"{p}latch", 4)
    idx(f"{p}latch", "latch")
    pipe.execute()
    return {f"{tag}plain": "lock", f"{tag}fair": "fair", f"{tag}rw": "rw", f"{tag}rw-w": "rw",
            f"{tag}fenced": "fenced", f"{tag}sem": "semaphore", f"{tag}permits": "permits",
            f"{tag}latch": "latch"}


def by_name(infos: list[LockInfo]) -> dict[str, LockInfo]:
    return {i.name: i for i in infos}


# -- listing -----------------------------------------------------------------------------------
def test_every_kind_is_listed_from_the_index_with_its_details(r: redis.Redis) -> None:
    kinds = write_kinds(r, "p:")
    locks = Locks(r, "p:")
    names = locks.names()
    assert names == sorted(kinds)
    infos = by_name(locks.read(names))
    assert {n: i.kind for n, i in infos.items()} == kinds

    plain = infos["plain"]
    assert plain.details == {} and plain.summary() == ""
    assert [(h.owner, h.hold_count, h.thread) for h in plain.holders] == [(f"{U1}:1", 2, "T-1")]
    assert plain.as_dict()["kind"] == "lock" and set(plain.as_dict()) == {
        "name", "key", "ttl", "holders", "kind", "waiters"}

    fair = infos["fair"]
    assert fair.details == {"queue_length": 2} and fair.summary() == "queue 2"
    assert [h.owner for h in fair.holders] == [f"{U1}:2"] and fair.holders[0].pid == 12

    rw = infos["rw"]
    assert rw.details == {"mode": "read", "writer": None, "readers": [
        {"owner": f"{U1}:3", "hold_count": 2}, {"owner": f"{U2}:4", "hold_count": 1}]}
    assert sorted(h.field for h in rw.holders) == [f"{U1}:3", f"{U2}:4"]  # "mode" is no holder
    assert rw.summary() == "mode read, 2 readers"

    rww = infos["rw-w"]
    assert rww.details == {"mode": "write", "writer": {"owner": f"{U2}:5", "hold_count": 1},
                           "readers": [{"owner": f"{U2}:5", "hold_count": 1}]}
    writer = next(h for h in rww.holders if h.write)
    assert (writer.field, writer.owner, writer.thread) == (f"{U2}:5:write", f"{U2}:5", "T-1")
    assert [h.as_dict()["client_id"] for h in rww.holders] == [U2, U2]
    assert rww.summary() == f"mode write, 1 reader, writer {U2}:5"

    assert infos["fenced"].details == {"token": 17} and infos["fenced"].summary() == "token 17"
    sem = infos["sem"]
    assert (sem.details, sem.holders, sem.value, sem.ttl) == ({"permits": 3}, (), "3", float("inf"))
    assert sem.as_dict() == {"name": "sem", "key": "p:sem", "ttl": None, "holders": [],
                             "kind": "semaphore", "permits": 3, "waiters": []}
    assert infos["permits"].details == {"permits": 1, "taken": 2}
    assert infos["permits"].summary() == "1 available, 2 taken"
    assert infos["latch"].details == {"count": 4} and infos["latch"].summary() == "count 4"
    assert "cmdstat_scan" not in r.info("commandstats")


def test_show_gives_the_queue_in_order_and_each_permits_lease(r: redis.Redis) -> None:
    write_kinds(r, "p:")
    locks = Locks(r, "p:")
    fair = locks.show("fair")
    assert fair is not None
    assert [w["owner"] for w in fair.details["queue"]] == [W1, W2]
    t1, t2 = (w["timeout"] for w in fair.details["queue"])
    assert 35 < t1 <= 40 and 40 < t2 <= 45
    permits = locks.show("permits")
    assert permits is not None
    leases = {p["id"]: p["ttl"] for p in permits.details["leases"]}
    assert set(leases) == {PERMIT_1, PERMIT_2}
    assert 15 < leases[PERMIT_1] <= 20 and leases[PERMIT_2] is None  # Redisson's "never"
    # The list form stays short: no queue, no leases.
    assert "queue" not in locks.read(["fair"])[0].details
    assert "leases" not in locks.read(["permits"])[0].details
    assert locks.show("nope") is None and locks.show("") is None


def test_an_expired_permit_is_free_by_the_semaphores_rule_and_nothing_is_written(
        r: redis.Redis) -> None:
    """A permit past its expiry (a crashed holder's, once its lease is over) is read as the
    semaphore's next write will count it: free. The read changes nothing; on a server that
    never ran the read's script (flushed) it loads it itself; unindexed, a key whose taken
    permits all expired is still told a ``permits`` by its zset."""
    from django_rlock.engine.permits import PermitExpirableSemaphore

    write_kinds(r, "p:")  # permits: 1 free, PERMIT_1 expires in 20 s, PERMIT_2 never
    zset = suffix_name("p:permits", "timeout")
    r.zadd(zset, {bytes.fromhex(PERMIT_1): now_ms(r) - 1})
    r.script_flush()
    locks = Locks(r, "p:")
    assert by_name(locks.read(locks.names()))["permits"].details == {"permits": 2, "taken": 1}
    shown = locks.show("permits")
    assert shown is not None and shown.details["leases"] == [{"id": PERMIT_2, "ttl": None}]
    r.zadd(zset, {bytes.fromhex(PERMIT_2): now_ms(r) - 1})
    r.delete(index_key("p:"))
    assert locks.names(scan=True).count("permits") == 1
    [info] = locks.read(["permits"])
    assert (info.kind, info.details) == ("permits", {"permits": 3, "taken": 0})
    assert r.get("p:permits") == b"1" and r.zcard(zset) == 2  # nothing reclaimed by a read
    assert PermitExpirableSemaphore(r, "permits", "p:").available_permits() == 3


@pytest.mark.parametrize("prefix,tag", [("", ""), ("p:", "{t}")])
def test_scan_tells_kinds_by_layout_and_never_lists_auxiliary_keys(r: redis.Redis, prefix: str,
                                                                   tag: str) -> None:
    """Without index entries (another Redisson client's keys). With prefix "" every key
    matches the glob, and with a hash tag in the names the rwlock timeouts and the permit
    zset sit under the prefix: none of them is listed."""
    write_kinds(r, prefix, indexed=False, tag=tag)
    k = prefix + tag
    r.hset(f"{k}fair-zset-only", f"{U1}:9", 1)  # a fair lock whose queue is gone, zset left
    r.zadd(prefix_name("redisson_lock_timeout", f"{k}fair-zset-only"), {W1: now_ms(r) + 1000})
    r.set(f"{k}text", "not a number")
    r.hset(f"{k}own-hash", "field", "value")
    index(r, "elsewhere:", "elsewhere:x", None, f"{U1}:1")  # another prefix's index hash

    locks = Locks(r, prefix)
    assert locks.names() == []  # nothing is indexed
    names = locks.names(scan=True)
    # The semaphore and the latch without index entries are plain integer strings, which
    # prove nothing (a cache value looks the same): not listed, not even read by name.
    expected = {"plain": "lock", "fair": "fair", "fair-zset-only": "fair", "rw": "rw",
                "rw-w": "rw", "fenced": "fenced", "permits": "permits"}
    assert names == sorted(tag + n for n in expected)
    infos = by_name(locks.read(names))
    assert {n.removeprefix(tag): i.kind for n, i in infos.items()} == expected
    assert locks.read([f"{tag}sem", f"{tag}latch"]) == []
    assert infos[f"{tag}rw"].holders[0].pid is None  # no entry: nothing known about holders
    # The auxiliary keys the glob did visit: strings and hashes among them, none listed.
    listed = {prefix + n for n in names} | {f"{k}text", f"{k}own-hash", f"{k}sem", f"{k}latch"}
    others = {key.decode(): r.type(key).decode() for key in r.scan_iter(match=f"{prefix}*")
              if key.decode() not in listed}
    assert sum(t == "string" and "rwlock_timeout" in key for key, t in others.items()) == 4
    assert all(is_auxiliary(key) for key, t in others.items() if t in ("string", "hash"))
    if prefix == "":
        assert {"string", "hash", "list", "zset"} <= set(others.values())


def test_scan_takes_the_kind_from_an_index_entry_when_there_is_one(r: redis.Redis) -> None:
    write_kinds(r, "p:")
    infos = by_name(Locks(r, "p:").read(Locks(r, "p:").names(scan=True)))
    assert infos["sem"].kind == "semaphore" and infos["latch"].kind == "latch"


def test_an_index_entry_that_does_not_fit_the_key_falls_back_to_the_layout(r: redis.Redis) -> None:
    r.hset("p:odd", mapping={"mode": "write", f"{U1}:1:write": 1})
    index(r, "p:", "p:odd", "latch")  # a string kind's entry on a hash
    r.set("p:num", 5)
    index(r, "p:", "p:num", "fair", f"{U1}:1")  # a hash kind's entry on a string
    r.hset("p:broken-rw", mapping={"mode": "sideways", f"{U1}:2": 1})
    index(r, "p:", "p:broken-rw", "rw", f"{U1}:2")
    infos = by_name(Locks(r, "p:").read(["odd", "num", "broken-rw"]))
    assert infos["odd"].kind == "rw"
    assert "broken-rw" not in infos
    # A string under a hash kind's entry proves nothing: the lock went, something else wrote
    # an integer there (a cache value, say). Not read, so never cleared.
    assert "num" not in infos and Locks(r, "p:").clear(["num"]) == [] and r.get("p:num") == b"5"


def test_listing_costs_two_round_trips_per_batch_whatever_the_kinds(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """No per-lock round trip: 800 keys of every kind (100 of each) are listed and read in
    pipelines of ``BATCH`` keys (shapes, then contents)."""
    for i in range(100):
        write_kinds(r, "p:", tag=f"{i:03d}-")
    counted = {"pipelines": 0, "direct": 0}
    make_pipeline, execute_command = r.pipeline, r.execute_command

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = make_pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted_execute(*a: Any, **k: Any) -> Any:
            counted["pipelines"] += 1
            return execute(*a, **k)
        pipe.execute = counted_execute  # type: ignore[method-assign]
        return pipe

    def direct(*args: Any, **kwargs: Any) -> Any:
        counted["direct"] += 1
        return execute_command(*args, **kwargs)

    monkeypatch.setattr(r, "pipeline", pipeline)
    monkeypatch.setattr(r, "execute_command", direct)
    locks = Locks(r, "p:")
    infos = locks.read(locks.names())
    assert len(infos) == 800 and {i.kind for i in infos} == {
        "lock", "fair", "rw", "fenced", "semaphore", "permits", "latch"}
    batches = -(-800 // BATCH)
    assert counted["pipelines"] == batches + 2 * batches  # names: shapes; read: shapes + contents
    assert counted["direct"] <= 5  # HSCAN of the index only


def test_describe_holders_names_the_kind_when_nobody_owns_it(r: redis.Redis) -> None:
    write_kinds(r, "p:")
    assert describe_holders(r, "p:sem", "p:") == "semaphore: 3 available"
    assert describe_holders(r, "p:rw-w", "p:").startswith(f"{U2}:5:write (worker pid 12")
    assert describe_holders(r, "p:gone", "p:") == "nobody"


def test_decode_responses_client_lists_every_kind(redis_server: Any, r: redis.Redis) -> None:
    write_kinds(r, "p:")
    text = redis_server.client(decode_responses=True)
    try:
        locks = Locks(text, "p:")
        assert {i.name: i.kind for i in locks.read(locks.names())}["rw-w"] == "rw"
        permits = locks.show("permits")
        assert permits is not None and permits.details["taken"] == 2
        assert permits.details["leases"] == []  # raw permit ids cannot be decoded as text
    finally:
        text.close()


# -- force-unlock ----------------------------------------------------------------------------------
class Subscriber:
    """A plain redis-py subscriber: what a waiter of another process would receive."""

    def __init__(self, server: Any, *channels: str) -> None:
        self.client = server.client()
        self.pubsub = self.client.pubsub()
        self.pubsub.subscribe(*channels)
        for _ in channels:
            assert self.pubsub.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]

    def messages(self, wait: float = 2.0) -> list[tuple[str, str]]:
        out = []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            m = self.pubsub.get_message(timeout=0.1)
            if m is not None and m["type"] == "message":
                out.append((m["channel"].decode(), m["data"].decode()))
                deadline = min(deadline, time.monotonic() + 0.3)  # a little more, then stop
        return out

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


@pytest.fixture
def subscribe(redis_server: Any) -> Iterator[Any]:
    made: list[Subscriber] = []

    def make(*channels: str) -> Subscriber:
        made.append(Subscriber(redis_server, *channels))
        return made[-1]
    yield make
    for s in made:
        s.close()


def test_clear_fair_keeps_its_queue_and_wakes_the_head(r: redis.Redis, subscribe: Any) -> None:
    """The fair lock's one force-unlock (Redisson's forceUnlock): the waiters keep their
    places, and the head is woken to take the lock."""
    write_kinds(r, "p:")
    key = "p:fair"
    queue, timeouts = prefix_name("redisson_lock_queue", key), prefix_name("redisson_lock_timeout", key)
    before = (r.lrange(queue, 0, -1), r.zrange(timeouts, 0, -1))
    sub = subscribe(f"{lock_channel(key)}:{W1}", f"{lock_channel(key)}:{W2}", lock_channel(key))
    assert Locks(r, "p:").clear(["fair"]) == ["fair"]
    assert sub.messages() == [(f"{lock_channel(key)}:{W1}", "0")]  # the head, and only it
    assert not r.exists(key)
    assert (r.lrange(queue, 0, -1), r.zrange(timeouts, 0, -1)) == before
    assert not r.hexists(index_key("p:"), key)
    assert Locks(r, "p:").names() == sorted(["plain", "rw", "rw-w", "fenced", "sem", "permits", "latch"])


def test_clear_rw_deletes_every_read_timeout_and_wakes_everyone(r: redis.Redis, subscribe: Any) -> None:
    write_kinds(r, "p:", tag="{t}")
    write_kinds(r, "q:")
    for prefix, name in (("p:", "{t}rw"), ("q:", "rw-w")):
        key = prefix + name
        sub = subscribe(prefix_name("redisson_rwlock", key))
        timeouts = [k for k in r.keys("*rwlock_timeout*")
                    if k.decode().startswith(suffix_name(key, ""))]
        assert timeouts
        assert Locks(r, prefix).clear([name]) == [name]
        assert sub.messages() == [(prefix_name("redisson_rwlock", key), "1")]
        assert not r.exists(key, *timeouts) and not r.hexists(index_key(prefix), key)
    assert r.exists("q:rw") and r.exists(rw_timeout("q:rw", f"{U1}:3", 2))  # others untouched


def test_clear_semaphores_and_latch(r: redis.Redis, subscribe: Any) -> None:
    write_kinds(r, "p:")
    sub = subscribe(prefix_name("redisson_sc", "p:sem"), prefix_name("redisson_sc", "p:permits"),
                    latch_channel("p:latch"), latch_channel("p:sem"))
    assert Locks(r, "p:").clear(["sem", "permits", "latch"]) == ["sem", "permits", "latch"]
    assert sub.messages() == [(prefix_name("redisson_sc", "p:sem"), "0"),
                              (prefix_name("redisson_sc", "p:permits"), "0"),
                              (latch_channel("p:latch"), "1")]
    assert not r.exists("p:sem", "p:permits", suffix_name("p:permits", "timeout"), "p:latch")
    assert r.hkeys(index_key("p:")) and not any(
        r.hexists(index_key("p:"), k) for k in ("p:sem", "p:permits", "p:latch"))


def test_an_unindexed_integer_string_is_never_cleared(r: redis.Redis, subscribe: Any) -> None:
    """A Redisson semaphore or latch (no index entry) and a cache's raw integer look alike:
    neither a named clear nor a SCAN clear touches one, nor wakes anybody."""
    write_kinds(r, "", indexed=False)
    sub = subscribe(prefix_name("redisson_sc", "latch"), latch_channel("latch"))
    assert Locks(r, "").clear(["latch", "sem"]) == []
    assert Locks(r, "").clear(Locks(r, "").names(scan=True))  # the others go
    assert r.get("latch") == b"4" and r.get("sem") == b"3"
    assert sub.messages() == []


def test_clear_fenced_keeps_the_token_counter(r: redis.Redis, subscribe: Any) -> None:
    write_kinds(r, "p:")
    sub = subscribe(lock_channel("p:fenced"))
    assert Locks(r, "p:").clear(["fenced"]) == ["fenced"]
    assert sub.messages() == [(lock_channel("p:fenced"), "0")]
    assert not r.exists("p:fenced") and r.get(prefix_name("redisson_lock_token", "p:fenced")) == b"17"


def test_clear_plain_lock_and_events(r: redis.Redis, subscribe: Any) -> None:
    write_kinds(r, "p:")
    seen: list[tuple[str, dict[str, Any]]] = []
    def listener(e: str, d: dict[str, Any]) -> None:
        seen.append((e, d))

    events.add_listener(listener)
    try:
        sub = subscribe(lock_channel("p:plain"))
        assert Locks(r, "p:").clear(["plain", "rw", "gone"]) == ["plain", "rw"]
        assert sub.messages() == [(lock_channel("p:plain"), "0")]
    finally:
        events.remove_listener(listener)  # only ours: Django's signal bridge may be there too
    assert [(e, d["name"], d["deleted"]) for e, d in seen] == [
        ("force_unlocked", "plain", True), ("force_unlocked", "rw", True)]


def test_clear_leaves_a_key_that_changed_type_since_the_read(r: redis.Redis) -> None:
    write_kinds(r, "p:")
    locks = Locks(r, "p:")
    infos = by_name(locks.read(["fair", "sem"]))
    r.delete("p:fair", "p:sem")
    r.set("p:fair", "cached")
    r.hset("p:sem", "k", "v")
    assert locks.force(infos["fair"]) is False and locks.force(infos["sem"]) is False
    assert r.get("p:fair") == b"cached" and r.hgetall("p:sem") == {b"k": b"v"}


def test_the_kind_classes_write_what_the_listing_reads(r: redis.Redis) -> None:
    """The family's own classes, where they exist: their index entries name the kind."""
    import importlib

    def kind_class(module: str, name: str) -> Any:
        try:
            return getattr(importlib.import_module(f"django_rlock.engine.{module}"), name, None)
        except ImportError:
            return None

    made: dict[str, str] = {}
    cleanups = []
    for module, cls_name, name, kind in (("semaphore", "Semaphore", "sem", "semaphore"),
                                         ("semaphore", "PermitExpirableSemaphore", "permits", "permits"),
                                         ("latch", "CountDownLatch", "latch", "latch")):
        cls = kind_class(module, cls_name)
        if cls is None:
            continue
        obj = cls(r, name, prefix="k:")
        obj.try_set_permits(2) if kind != "latch" else obj.try_set_count(3)
        made[name] = kind
    for module, cls_name, name, kind in (("fenced", "FencedLock", "fenced", "fenced"),
                                         ("fair", "FairLock", "fair", "fair")):
        cls = kind_class(module, cls_name)
        if cls is None:
            continue
        lock = cls(r, name, prefix="k:")
        lock.lock(lease_time=30)
        cleanups.append(lock.unlock)
        made[name] = kind
    rw_cls = kind_class("rwlock", "ReadWriteLock")
    if rw_cls is not None:
        w = rw_cls(r, "rw", prefix="k:").write_lock()
        w.lock(lease_time=30)
        cleanups.append(w.unlock)
        made["rw"] = "rw"
    if not made:
        pytest.skip("no kind class is importable yet")
    try:
        locks = Locks(r, "k:")
        assert {i.name: i.kind for i in locks.read(locks.names())} == made
        if "rw" in made:
            [rw] = locks.read(["rw"])
            assert rw.details["mode"] == "write" and rw.details["writer"] is not None
            assert rw.holders[0].write and rw.holders[0].pid is not None
    finally:
        for unlock in cleanups:
            unlock()


def test_clear_wakes_real_waiters_of_the_kind_classes(r: redis.Redis, holders: Any) -> None:
    """With the family's own classes (where they exist): a latch waiter returns and a writer
    waiting for a reader gets the lock at once, long before a recheck or a lease would let
    them; the reader's hold is reported lost."""
    import importlib
    import threading

    ran = 0
    try:
        latch_cls = importlib.import_module("django_rlock.engine.latch").CountDownLatch
    except (ImportError, AttributeError):
        latch_cls = None
    if latch_cls is not None:
        latch = latch_cls(r, "latch", prefix="k:")
        assert latch.try_set_count(5)
        returned = threading.Event()
        t = threading.Thread(target=lambda: latch.wait(60) and returned.set(), daemon=True)
        t.start()
        time.sleep(0.3)
        assert not returned.is_set()
        start = time.monotonic()
        assert Locks(r, "k:").clear(["latch"]) == ["latch"]
        assert returned.wait(10)
        assert time.monotonic() - start < 3  # by the message, not the 5 s recheck
        t.join(5)
        ran += 1
    try:
        rw_cls = importlib.import_module("django_rlock.engine.rwlock").ReadWriteLock
    except (ImportError, AttributeError):
        rw_cls = None
    if rw_cls is not None:
        reader = rw_cls(r, "rw", prefix="k:").read_lock()
        h = holders()
        h.call(reader.lock)  # watchdog mode: 30 s, renewed
        writer = rw_cls(r, "rw", prefix="k:").write_lock()
        w = holders()
        got = w.submit(lambda: writer.try_lock(wait_time=60))
        time.sleep(0.3)
        start = time.monotonic()
        [info] = Locks(r, "k:").read(["rw"])
        assert info.kind == "rw" and info.details["mode"] == "read"
        assert Locks(r, "k:").clear(["rw"]) == ["rw"]
        assert got(20) is True
        assert time.monotonic() - start < 5
        assert h.call(reader.is_lost) is True
        [info] = Locks(r, "k:").read(["rw"])
        assert info.details["mode"] == "write" and info.details["readers"] == []
        w.call(writer.unlock)
        ran += 1
    if not ran:
        pytest.skip("no kind class is importable yet")
