"""Process records (invariant 43): the process of a format 3 entry's holder is in one record per
process and server, joined by listings; what it costs, and what a listing shows without it."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import identity, records
from django_rlock.engine.listing import Locks
from django_rlock.engine.naming import index_key, process_key
from django_rlock.engine.watchdog import server_id

MINE = process_key(identity.process_id())


def _listed(r, prefix: str, name: str):
    (info,) = Locks(r, prefix).read([name])
    return info


def _calls(r) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def test_memory_per_held_lock_at_10000_locks_is_under_300_bytes(r):
    """Issue #22's goal. With format 2 (the process in every entry) this was 313 B: the entry
    (70-110 bytes) paid an 80-byte allocation; format 3's (35-40 bytes here) pays 48."""
    warm = RLock(r, "warm", prefix="m:")
    warm.lock(lease_time=600)  # scripts cached, this process's record written
    warm.unlock()
    n = 10_000
    before = r.info("memory")["used_memory"]
    for i in range(n):
        assert RLock(r, str(i), prefix="m:").try_lock(0, lease_time=600)
    per_lock = (r.info("memory")["used_memory"] - before) / n
    assert per_lock < 300, per_lock
    assert r.hlen(index_key("m:")) == n


def test_a_listing_joins_each_holder_and_waiter_with_its_process_record(r, redis_server,
                                                                        holders):
    """Long default thread names are coded in the entry (``identity.NAME_CODES``) and come
    back whole; the pid, label and host come from the record."""
    runserver = holders()
    runserver.thread.name = "Thread-12 (process_request_thread)"
    pool = holders()
    pool.thread.name = "ThreadPoolExecutor-0_12"
    a, b = RLock(r, "a", prefix="j:"), RLock(r, "b", prefix="j:")
    runserver.call(lambda: a.lock(lease_time=30))
    pool.call(b.lock)

    async def task_holds() -> str | None:
        import redis.asyncio

        lock = AsyncRLock(redis.asyncio.Redis(unix_socket_path=redis_server.socket), "c",
                          prefix="j:")
        await lock.lock()
        try:
            (info,) = Locks(r, "j:").read(["c"])  # (blocks the loop: a test)
            return info.holders[0].thread if info.holders[0].pid == os.getpid() else None
        finally:
            await lock.unlock()

    assert (asyncio.run(task_holds()) or "").startswith("Task-")
    got = pool.submit(lambda: a.try_lock(wait_time=10))  # a waiter, registered in line
    deadline = time.monotonic() + 5
    while not _listed(r, "j:", "a").waiters and time.monotonic() < deadline:
        time.sleep(0.02)
    for raw in r.hvals(index_key("j:")):
        # The allocator's 48-byte class, with a serial of up to 5 digits (the test session's
        # threads and tasks count up; each digit more is a byte more).
        serial = raw.split(b"\x1e")[1].partition(b":")[2]
        assert len(raw) - max(0, len(serial) - 5) <= 44, raw
    infos = Locks(r, "j:").read(["a", "b"])
    threads = {info.name: info.holders[0].thread for info in infos}
    assert threads["a"] == "Thread-12 (process_request_thread)"
    assert threads["b"] == "ThreadPoolExecutor-0_12"
    for info in infos:
        (h,) = info.holders
        assert (h.pid, h.host, h.process) == (os.getpid(), r.get(MINE).decode().split(
            identity.SEP3)[2], identity.process_label()), info
        assert h.os_thread_id and h.held_for is not None
    (w,) = _listed(r, "j:", "a").waiters
    assert w.pid == os.getpid() and w.thread == "ThreadPoolExecutor-0_12"
    runserver.call(a.unlock)
    assert got(10) is True
    pool.call(a.unlock)
    pool.call(b.unlock)


def test_the_record_is_written_once_per_process_and_server_never_on_the_hot_path(r):
    """The first attempt on a server writes it (one SET, its own round trip: before the
    attempt, so the entry never names a record not written yet); the next pairs send exactly
    what they did before process records (tests/engine/test_basics.py counts them)."""
    lock = RLock(r, "counted")
    lock.lock()
    lock.unlock()
    first = _calls(r)
    assert first.get("set") == 1 and r.pttl(MINE) > (records.TTL - 5) * 1000
    r.config_resetstat()
    for _ in range(20):
        lock.lock()
        lock.unlock()
    assert "set" not in _calls(r) and r.exists(MINE)


def test_a_lock_whose_record_is_gone_is_listed_with_its_process_unknown_until_rewritten(
        r, monkeypatch):
    """The server lost the record (a restart without persistence, FLUSHALL, a failover): the
    lock is still listed, with its thread, OS thread id and since, and host, pid and process
    None; the watchdog writes the record again after its next renewal past ``REFRESH``."""
    monkeypatch.setattr(records, "REFRESH", 0.2)
    lock = RLock(r, "kept", prefix="g:", watchdog_timeout=0.9)  # renewed every 0.3 s
    lock.lock()
    try:
        r.delete(MINE)
        info = _listed(r, "g:", "kept")
        (h,) = info.holders
        assert (h.pid, h.host, h.process) == (None, None, None)
        assert h.thread == "MainThread" and h.os_thread_id == threading.get_ident()
        assert h.held_for is not None
        assert h.describe().endswith("(process unknown, thread MainThread, held 0.0 s)")
        assert "unknown" in h.describe()
        deadline = time.monotonic() + 5
        while not r.exists(MINE) and time.monotonic() < deadline:
            time.sleep(0.05)
        (h,) = _listed(r, "g:", "kept").holders
        assert h.pid == os.getpid()
    finally:
        lock.unlock()


def test_a_server_restarted_empty_lists_a_lock_taken_again(tmp_path, monkeypatch):
    from django_rlock.testing import RedisServer

    monkeypatch.setattr(records, "REFRESH", 0.2)
    with RedisServer(str(tmp_path)) as server:
        r = server.client()
        lock = RLock(r, "again", prefix="s:", watchdog_timeout=0.9)
        lock.lock(lease_time=30)
        lock.unlock()
        server.restart()  # every key gone, this process's record too; it does not know
        lease = RLock(r, "lease", prefix="s:")
        lease.lock(lease_time=30)
        (h,) = _listed(r, "s:", "lease").holders
        assert h.pid is None and h.thread == "MainThread"  # listed, its process unknown
        lock.lock()  # a watchdog-mode hold: its renewals write the record again
        try:
            deadline = time.monotonic() + 5
            while not r.exists(MINE) and time.monotonic() < deadline:
                time.sleep(0.05)
            for name in ("again", "lease"):
                (h,) = _listed(r, "s:", name).holders
                assert h.pid == os.getpid()
        finally:
            lock.unlock()
            lease.unlock()
        r.close()


_CHILD = textwrap.dedent("""
    import sys, time, redis
    from django_rlock import RLock
    from django_rlock.engine import identity, records
    records.TTL = 1.0
    r = redis.Redis(unix_socket_path=sys.argv[1])
    RLock(r, "dog", prefix="k:", watchdog_timeout=1.0).lock()
    RLock(r, "lease", prefix="k:").lock(lease_time=2.0)
    print(identity.process_id(), flush=True)
    time.sleep(60)
""")


def test_the_record_of_a_sigkilled_process_goes_away_after_its_locks(r, redis_server):
    """No pile-up: a record lives ``TTL`` past its last write and never less than the leases
    its process set (a listing names a dead holder's process for as long as its lock is
    there), then expires."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, redis_server.socket],
                             stdout=subprocess.PIPE, text=True)
    try:
        key = process_key(child.stdout.readline().strip())
        assert r.get(key).decode().split(identity.SEP3)[0] == str(child.pid)
        assert _listed(r, "k:", "lease").holders[0].pid == child.pid
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert 0 < r.pttl(key) <= 2500  # the 2 s lease plus TTL / 2
    deadline = time.monotonic() + 6
    while r.exists(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not r.exists(key) and not r.exists("k:lease") and not r.exists("k:dog")


def _forked_holds(sock: str, out) -> None:
    import redis

    RLock(redis.Redis(unix_socket_path=sock), "child", prefix="f:").lock(lease_time=30)
    out.put(os.getpid())


def test_a_forked_child_writes_its_own_record(r, redis_server):
    """A prefork child has a new uuid (invariant 9): it writes its own record, though its
    parent wrote one on the same server before the fork."""
    RLock(r, "parent", prefix="f:").lock(lease_time=30)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_forked_holds, args=(redis_server.socket, q))
    p.start()
    child_pid = q.get(timeout=10)
    p.join(10)
    pids = {info.name: info.holders[0].pid for info in Locks(r, "f:").read(["child", "parent"])}
    assert pids == {"child": child_pid, "parent": os.getpid()}


@pytest.mark.parametrize("raw", [
    None, b"", b"12", b"x\x1ea\x1eb", b"1\x1ea", b"12\x1eweb\x1ehost",
])
def test_an_unreadable_record_is_no_record(raw):
    expected = {"pid": 12, "process": "web", "host": "host"} if raw == b"12\x1eweb\x1ehost" else None
    assert records.parse(raw) == expected


def test_a_new_process_label_is_written_before_the_next_attempt(r):
    RLock(r, "before", prefix="l:").lock(lease_time=30)
    try:
        identity.set_process_label("billing worker")
        RLock(r, "after", prefix="l:").lock(lease_time=30)
        infos = Locks(r, "l:").read(["after", "before"])
        assert [i.holders[0].process for i in infos] == ["billing worker"] * 2
    finally:
        identity.set_process_label(None)


def test_a_user_denied_the_records_keys_still_locks_and_lists_its_holders_process_unknown(
        r, redis_server):
    """README, "Redis ACLs": a user whose key patterns leave out ``rlock-process:*`` gets its
    locks (the record's write fails quietly, and is not tried again on every attempt); a
    listing shows its holders' process as unknown."""
    r.acl_setuser("nodata", enabled=True, passwords=["+pw"], commands=["+@all"],
                  keys=["acl:*", "rlock-index:*", "rlock_*", "redisson_*"], channels=["*"])
    try:
        limited = redis_server.client(username="nodata", password="pw")
        lock = RLock(limited, "one", prefix="acl:")
        lock.lock()
        r.config_resetstat()
        for _ in range(5):
            lock.lock()
            lock.unlock()  # reentrant: still held once
        assert "set" not in _calls(r)  # the failed write waits out records.RETRY
        assert not r.exists(MINE)
        (h,) = _listed(r, "acl:", "one").holders
        assert (h.pid, h.host, h.process) == (None, None, None)
        assert h.thread == threading.current_thread().name
        lock.unlock()
        assert not r.exists("acl:one")
        limited.close()
    finally:
        r.acl_deluser("nodata")


def test_the_watchdogs_refresh_never_shortens_a_record_a_long_lease_needs(r, monkeypatch):
    """A lock with a lease of an hour makes the record live past it; a later refresh by the
    watchdog (for this process's watchdog-mode holds) must not cut that back to ``TTL``, or
    the long-lease lock would be listed with its process unknown once the watchdog's holds
    ended (found in review)."""
    monkeypatch.setattr(records, "REFRESH", 0.0)
    long = RLock(r, "long", prefix="t:")
    long.lock(lease_time=3600)
    try:
        assert r.pttl(MINE) > 3600 * 1000
        records.refresh(r, server_id(r))  # what the watchdog runs after a renewal there
        assert r.pttl(MINE) > 3600 * 1000
    finally:
        long.unlock()
