"""ReadWriteLock: Redisson's layout and RedissonReadWriteLockTest's behaviours, per-hold read
expiry, renewal of one's own holds only, exclusion across processes, and the asyncio twin."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis.asyncio

from django_rlock import LockNotOwnedError, LockUpgradeError
from django_rlock.engine import identity
from django_rlock.engine.lockinfo import describes, parse_entry
from django_rlock.engine.naming import index_key, prefix_name, suffix_name
from django_rlock.engine.rwlock import (
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncWriteLock,
    ReadLock,
    ReadWriteLock,
    WriteLock,
)
from django_rlock.engine.watchdog import watchdog

ROOT = Path(__file__).parents[2]


def _left(r) -> list[bytes]:
    """The keys left, but this process's record (invariant 43), which outlives its locks."""
    return [k for k in r.keys("*") if not k.startswith(b"rlock-process:")]


def run_proc(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.engine._rw_proc", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)


def tkey(key: str, owner: str, k: int) -> str:
    return suffix_name(key, f"{owner}:rwlock_timeout") + f":{k}"


def wait_until(cond, limit: float, step: float = 0.01) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if cond():
            return time.monotonic() - start
        time.sleep(step)
    return None


# -- layout ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["plain", "{test}:abc:key"])
def test_layout_is_redissons(r, name):
    rw = ReadWriteLock(r, name, prefix="p:")
    read, write = rw.read_lock(), rw.write_lock()
    assert isinstance(read, ReadLock) and isinstance(write, WriteLock)
    key = "p:" + name
    me = identity.thread_owner()
    read.lock()
    read.lock()
    assert r.hgetall(key) == {b"mode": b"read", me.encode(): b"2"}
    # One string per read hold, named by the brace rule (the Lua side builds the same names).
    for k in (1, 2):
        assert r.get(tkey(key, me, k)) == b"1" and 0 < r.pttl(tkey(key, me, k)) <= 30_000
    entry = parse_entry(r.hget(index_key("p:"), key))[1]
    assert entry["kind"] == "rw" and describes(entry, me)
    read.unlock()
    assert not r.exists(tkey(key, me, 2)) and r.exists(tkey(key, me, 1))
    write_channel = prefix_name("redisson_rwlock", key).encode()
    assert read._channel == write._channel == write_channel
    ps = r.pubsub()
    ps.subscribe(write_channel)
    assert ps.get_message(timeout=1)["type"] == "subscribe"
    read.unlock()  # frees the lock: "0"
    assert _left(r) == []
    write.lock()
    assert r.hgetall(key) == {b"mode": b"write", (me + ":write").encode(): b"1"}
    assert parse_entry(r.hget(index_key("p:"), key))[1]["kind"] == "rw"
    write.unlock()  # frees the lock: "1"
    got = [ps.get_message(timeout=1)["data"] for _ in range(2)]
    assert got == [b"0", b"1"]
    assert _left(r) == []
    ps.close()


def test_bad_input_is_refused_before_any_redis_command(r):
    calls = r.info("commandstats")
    for bad, err in (({"name": ""}, ValueError), ({"name": 3}, TypeError),
                     ({"watchdog_timeout": 0}, ValueError), ({"sync_replicas": -1}, ValueError),
                     ({"label": 5}, TypeError)):
        kw = {"name": "x", **bad}
        with pytest.raises(err):
            ReadWriteLock(r, kw.pop("name"), **kw)
    read = ReadWriteLock(r, "x").read_lock()
    with pytest.raises(ValueError):
        read.try_lock(wait_time=-1)
    with pytest.raises(ValueError):
        read.lock(lease_time=0)
    assert r.info("commandstats").get("cmdstat_evalsha") == calls.get("cmdstat_evalsha")


# -- Redisson's tests -----------------------------------------------------------------------
def test_is_locked_and_write_then_read(r, holders):
    """testReadLockIsLocked and testWR."""
    rw = ReadWriteLock(r, "wr")
    read, write = rw.read_lock(), rw.write_lock()
    assert not read.is_locked() and not write.is_locked()
    write.lock()
    assert write.is_locked() and not read.is_locked()
    assert read.try_lock()  # the writer may read (downgrade)
    assert read.is_locked() and write.is_locked()
    assert holders().call(lambda: (read.is_locked(), write.is_locked(),
                                   read.is_held_by_current_thread())) == (True, True, False)
    read.unlock()
    assert write.is_locked() and not read.is_locked()
    write.unlock()
    assert not write.is_locked() and not read.is_locked() and not r.exists("wr")


def test_write_then_read_reentrancy_and_no_upgrade(r, holders):
    """testWriteReadReentrancy."""
    rw = ReadWriteLock(r, "wrr")
    read, write = rw.read_lock(), rw.write_lock()
    other = holders()
    write.lock()
    assert read.try_lock()
    assert other.call(lambda: read.try_lock()) is False
    write.unlock()  # downgraded: a read lock now
    assert r.hget("wrr", "mode") == b"read" and read.is_locked() and not write.is_locked()
    assert write.try_lock() is False  # no upgrade from read to write
    assert other.call(lambda: read.try_lock()) is True  # readers together
    other.call(read.unlock)
    with pytest.raises(LockUpgradeError):  # still ours as a reader: it would wait for itself
        write.try_lock(wait_time=0.4)
    read.unlock()
    assert write.try_lock()
    write.unlock()
    assert not r.exists("wrr")


def test_many_readers_waiting_on_a_writer_all_enter_together(r, holders):
    """testWriteRead: every local waiter is woken by the write unlock, not one at a time.

    The writer is in watchdog mode (30 s): a reader left asleep would wait on that PTTL.
    """
    rw = ReadWriteLock(r, "writeread")
    write, read = rw.write_lock(), rw.read_lock()
    write.lock()
    inside = threading.Semaphore(0)
    release = threading.Event()
    entered: list[float] = []

    def reader():
        read.lock()
        entered.append(time.monotonic())
        inside.release()
        release.wait(20)
        read.unlock()

    hs = [holders() for _ in range(8)]
    results = [h.submit(reader) for h in hs]
    wait_until(lambda: False, 0.5)  # let them queue
    unlocked = time.monotonic()
    write.unlock()
    for _ in hs:
        assert inside.acquire(timeout=5), "a reader was not woken"
    assert max(entered) - unlocked < 2.0
    assert read.is_locked() and int(r.hlen("writeread")) == 1 + 8  # all of them at once
    release.set()
    for res in results:
        res(10)
    assert not r.exists("writeread")


def test_read_lease_expiry_is_per_hold(r, holders):
    """testReadLockLeaseTimeoutDiffThreadsRRW: a reader gone by its lease no longer counts."""
    rw = ReadWriteLock(r, "perhold")
    read, write = rw.read_lock(), rw.write_lock()
    a = holders()
    a.call(lambda: read.lock(lease_time=0.6))   # never unlocked
    read.lock(lease_time=5.0)
    assert r.pttl("perhold") > 4000  # the hash lives as long as its longest hold
    time.sleep(0.9)                              # a's hold has expired, its field has not
    assert r.hexists("perhold", a.call(identity.thread_owner))
    assert write.try_lock() is False
    read.unlock()                                # nobody alive is left: deleted at once
    assert not r.exists("perhold")
    assert write.try_lock()
    write.unlock()


def test_reentrant_read_unlock_shortens_the_hash_to_the_longest_live_hold(r):
    """testReadLockLeaseTimeout, scaled: lease 1.5 s; at 0.8 s a reentrant 1.5 s hold that is
    released; the lock is then gone with the first hold (0.7 s later), not 1.5 s later."""
    rw = ReadWriteLock(r, "reent")
    read, write = rw.read_lock(), rw.write_lock()
    t0 = time.monotonic()
    read.lock(lease_time=1.5)
    time.sleep(0.8)
    read.lock(lease_time=1.5)
    assert r.pttl("reent") > 1300
    read.unlock()
    assert r.pttl("reent") <= 1500 - 700
    gone = wait_until(lambda: write.try_lock(), 3.0)
    assert gone is not None and time.monotonic() - t0 < 2.0
    write.unlock()


def test_read_lock_expiration(r, holders):
    """testReadLockExpiration, scaled: readers with leases 2 s and 0.8 s unlock in time; a
    writer gets the lock when the last one unlocks."""
    rw = ReadWriteLock(r, "readexp")
    read, write = rw.read_lock(), rw.write_lock()
    a, b = holders(), holders()

    def reader(lease, hold):
        read.lock(lease_time=lease)
        time.sleep(hold)
        # Taken before the unlock: the writer may be in before this thread runs again.
        t = time.monotonic()
        read.unlock()
        return t

    ra = a.submit(lambda: reader(2.0, 1.2))
    rb = b.submit(lambda: reader(0.8, 0.5))
    wait_until(lambda: r.hlen("readexp") == 3, 2)
    assert write.try_lock(wait_time=5, lease_time=2)
    entered = time.monotonic()
    last_unlock = max(ra(), rb())
    assert 0 <= entered - last_unlock < 1.0  # woken by the last read unlock, not by a lease
    ra(), rb()
    write.unlock()


def test_force_unlock_is_one_meaning_from_either_side_in_either_mode(r, holders):
    """A read-write lock has one force-unlock (the one ``locks clear`` and the admin run): from
    the read or the write handle or the ``ReadWriteLock``, it deletes the lock in either mode,
    every read hold's timeout key with it, and wakes every waiter. (Redisson's per-side
    forceUnlock leaves the other mode alone; a force-unlock that may do nothing is no way out.)
    """
    rw = ReadWriteLock(r, "force")
    read, write = rw.read_lock(), rw.write_lock()
    assert read.force_unlock() is False and write.force_unlock() is False  # nothing there
    assert rw.force_unlock() is False
    read.lock()
    me = identity.thread_owner()
    assert r.exists(tkey("force", me, 1))
    assert write.force_unlock() is True  # read mode, from the write side
    assert not read.is_locked() and _left(r) == [] and read.is_lost()
    with pytest.raises(LockNotOwnedError):
        read.unlock()
    write.lock()
    assert read.force_unlock() is True  # write mode, from the read side
    assert not write.is_locked() and write.is_lost() and _left(r) == []
    write.lock()
    assert rw.force_unlock() is True and _left(r) == []
    # Waiters wake at once (a waiting writer would otherwise sleep on the 30 s PTTL).
    read.lock()
    got = holders().submit(lambda: write.try_lock(wait_time=10))
    time.sleep(0.3)
    t0 = time.monotonic()
    assert read.force_unlock()
    assert got(10) is True and time.monotonic() - t0 < 2.0
    assert write.force_unlock()


def test_write_reentry_sets_the_lease_rather_than_adding_it(r):
    rw = ReadWriteLock(r, "wreent")
    write = rw.write_lock()
    write.lock(lease_time=2)
    write.lock(lease_time=2)
    assert 1500 < r.pttl("wreent") <= 2000  # Redisson would give PTTL + lease (about 4 s)
    write.lock(lease_time=2)
    assert r.pttl("wreent") <= 2000
    write.unlock()
    assert 1500 < r.pttl("wreent") <= 2000
    assert write.hold_count() == 2
    write.unlock()
    write.unlock()
    assert not r.exists("wreent")


def test_a_writers_lease_never_cuts_its_own_longer_read_holds(r):
    rw = ReadWriteLock(r, "wrlonger")
    read, write = rw.read_lock(), rw.write_lock()
    write.lock(lease_time=1)
    read.lock(lease_time=5)
    write.lock(lease_time=1)
    assert r.pttl("wrlonger") > 4000
    write.unlock()
    write.unlock()  # downgraded: as long as the read hold
    assert r.hget("wrlonger", "mode") == b"read" and r.pttl("wrlonger") > 4000
    read.unlock()
    assert not r.exists("wrlonger")


def test_a_writers_own_read_unlock_never_cuts_its_write_lease(r):
    rw = ReadWriteLock(r, "wrcut")
    read, write = rw.read_lock(), rw.write_lock()
    write.lock()  # watchdog: 30 s
    read.lock(lease_time=1)
    read.lock(lease_time=1)
    read.unlock()  # Redisson would PEXPIRE the hash to the read hold's ~1 s
    assert r.pttl("wrcut") > 20_000
    read.unlock()
    assert r.pttl("wrcut") > 20_000 and write.is_locked()
    write.unlock()
    assert not r.exists("wrcut")


def test_a_downgrade_wakes_waiting_readers(r, holders):
    """The writer keeps a read hold as it unlocks the write lock: waiting readers may enter
    now (Redisson publishes nothing here; they would sleep on the 30 s PTTL)."""
    rw = ReadWriteLock(r, "down")
    read, write = rw.read_lock(), rw.write_lock()
    write.lock()
    read.lock()
    got = holders().submit(lambda: read.try_lock(wait_time=10))
    time.sleep(0.3)
    t0 = time.monotonic()
    write.unlock()
    assert got(10) is True and time.monotonic() - t0 < 2.0
    assert r.hlen("down") == 3 and r.hget("down", "mode") == b"read"
    read.force_unlock()


def test_ttl_under_the_watchdog_for_read_and_write(r):
    """testReadWriteTTL, scaled: watchdog 1.5 s (renewed every 0.5 s); over 2.5 s the hash and
    the read hold's key keep their TTL; then the read hold alone keeps it."""
    rw = ReadWriteLock(r, "ttl", watchdog_timeout=1.5)
    read, write = rw.read_lock(), rw.write_lock()
    me = identity.thread_owner()
    write.lock()
    read.lock()
    for _ in range(5):
        time.sleep(0.5)
        assert r.pttl("ttl") > 700 and r.pttl(tkey("ttl", me, 1)) > 700
    write.unlock()
    for _ in range(4):
        time.sleep(0.5)
        assert r.pttl("ttl") > 700 and r.pttl(tkey("ttl", me, 1)) > 700
    assert not read.is_lost()
    read.unlock()
    assert _left(r) == []


def test_expire_read_and_expire_write(r, holders):
    """testExpireRead / testExpireWrite, with 1 s leases."""
    rw = ReadWriteLock(r, "exp")
    read, write = rw.read_lock(), rw.write_lock()
    a = holders()
    a.call(lambda: read.lock(lease_time=1))
    t0 = time.monotonic()
    read.lock()  # readers together: no wait
    assert time.monotonic() - t0 < 0.5
    read.unlock()
    a.call(read.unlock)  # in time: fine
    a.call(lambda: write.lock(lease_time=1))
    t0 = time.monotonic()
    write.lock()
    assert 0.7 < time.monotonic() - t0 < 2.5
    with pytest.raises(LockNotOwnedError):
        a.call(write.unlock)
    write.unlock()
    a.call(lambda: read.lock(lease_time=0.5))
    time.sleep(0.7)
    with pytest.raises(LockNotOwnedError):
        a.call(read.unlock)
    assert _left(r) == [index_key("").encode()]  # expiry leaves only a stale index entry


def test_hold_counts(r):
    """testHoldCount: 0, 1, 0, 2, 1, 0 for each side."""
    rw = ReadWriteLock(r, "holds")
    for lock in (rw.read_lock(), rw.write_lock()):
        seen = [lock.hold_count()]
        lock.lock()
        seen.append(lock.hold_count())
        lock.unlock()
        seen.append(lock.hold_count())
        lock.lock()
        lock.lock()
        seen.append(lock.hold_count())
        lock.unlock()
        seen.append(lock.hold_count())
        lock.unlock()
        seen.append(lock.hold_count())
        assert seen == [0, 1, 0, 2, 1, 0]
        assert not lock.is_held_by_current_thread()


def test_unlock_by_a_non_owner_fails(r, holders):
    """testUnlockFail: a read or write hold is released by its owner only."""
    rw = ReadWriteLock(r, "nonowner")
    read, write = rw.read_lock(), rw.write_lock()
    a = holders()
    a.call(read.lock)
    with pytest.raises(LockNotOwnedError):
        read.unlock()
    with pytest.raises(LockNotOwnedError):
        write.unlock()
    assert r.hlen("nonowner") == 2
    a.call(read.unlock)
    a.call(write.lock)
    with pytest.raises(LockNotOwnedError):
        write.unlock()
    with pytest.raises(LockNotOwnedError):
        read.unlock()  # a reader field is not a writer's
    assert a.call(write.hold_count) == 1
    a.call(write.unlock)
    assert not r.exists("nonowner")


def test_a_reader_cannot_upgrade_and_a_writer_waits_for_readers(r, holders):
    rw = ReadWriteLock(r, "upgrade")
    read, write = rw.read_lock(), rw.write_lock()
    read.lock()
    with pytest.raises(LockUpgradeError):  # Redisson: an upgrade waits (forever)
        write.try_lock(wait_time=0.3)
    got = holders().submit(lambda: write.try_lock(wait_time=10))
    time.sleep(0.3)
    t0 = time.monotonic()
    read.unlock()  # publishes "0": the waiting writer enters at once
    assert got(10) is True and time.monotonic() - t0 < 2.0
    assert write.force_unlock()


# -- renewal and dead owners ----------------------------------------------------------------
def test_a_read_hold_whose_key_is_gone_is_lost(r, holders):
    """Its own timeout key gone (a pause past its lease, say) while another reader keeps the
    hash alive: that reader's unlock would treat it as dead, so the holder is told now."""
    lost: list[str] = []
    read = ReadWriteLock(r, "lostread", watchdog_timeout=1.5, on_lost=lost.append).read_lock()
    other = holders()
    other_read = ReadWriteLock(r, "lostread", watchdog_timeout=1.5).read_lock()
    other.call(other_read.lock)  # keeps the hash alive
    read.lock()
    r.delete(tkey("lostread", identity.thread_owner(), 1))
    assert wait_until(read.is_lost, 2.0) is not None
    # on_lost runs on the watchdog thread just after the hold is marked lost: wait for it too.
    assert wait_until(lambda: lost, 2.0) is not None
    assert lost == ["lostread"] and other.call(other_read.is_lost) is False
    other.call(other_read.unlock)  # our stale field does not keep the lock
    assert not r.exists("lostread")


def test_renewal_touches_only_its_own_owners_timeout_keys(r):
    """#7098: a dead client's read hold (its field and a timeout key) is never renewed by a
    live reader, so the live reader's unlock frees the lock at once."""
    rw = ReadWriteLock(r, "zombie", watchdog_timeout=1.2)
    read, write = rw.read_lock(), rw.write_lock()
    read.lock()
    r.hset("zombie", "dead-client:7", 1)  # a reader of another client that died
    r.set(tkey("zombie", "dead-client:7", 1), 1, px=600)
    time.sleep(1.6)  # several renewals of ours
    assert not r.exists(tkey("zombie", "dead-client:7", 1))
    assert r.pttl(tkey("zombie", identity.thread_owner(), 1)) > 400
    read.unlock()
    assert not r.exists("zombie")
    assert write.try_lock()
    write.unlock()


def test_a_sigkilled_readers_hold_never_outlives_the_live_readers(r, redis_server):
    """testMultiInstanceReadLockZombieCleanup across processes: A reads and is SIGKILLed; B
    reads past A's watchdog timeout and unlocks; the writer gets the lock at once."""
    proc = run_proc("hold_read", redis_server.socket, "zread", "1.0")
    assert proc.stdout.readline().strip() == "locked"
    rw = ReadWriteLock(r, "zread", watchdog_timeout=1.0)
    read, write = rw.read_lock(), rw.write_lock()
    read.lock()
    time.sleep(1.2)  # both renewing
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.6)  # A's timeout key has run out; ours is renewed (so is the hash)
    assert r.hlen("zread") == 3 and not write.try_lock()
    read.unlock()
    assert write.try_lock()
    write.unlock()


def test_a_sigkilled_readers_hold_blocks_a_writer_no_longer_than_its_watchdog_timeout(
        r, redis_server):
    proc = run_proc("hold_read", redis_server.socket, "zread2", "1.5")
    assert proc.stdout.readline().strip() == "locked"
    time.sleep(2.0)  # past its lease: renewed by its watchdog
    assert r.exists("zread2")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    write = ReadWriteLock(r, "zread2").write_lock()
    assert write.try_lock(wait_time=10)
    assert time.monotonic() - killed <= 1.5 + 0.7
    write.unlock()


def test_a_thread_that_ends_holding_a_read_lock_is_released(r):
    rw = ReadWriteLock(r, "deadread", watchdog_timeout=3.0)  # renewed every 1 s
    other = rw.read_lock()
    t = threading.Thread(target=other.lock, name="doomed-reader")
    t.start()
    t.join()
    hold = [h for _, h in watchdog().holds_of(*_server_key(rw, "deadread"))][0]
    assert hold.end_args[0] == hold.owner and hold.renew_key == "deadread"
    freed = wait_until(lambda: not r.exists("deadread"), 3.0)
    assert freed is not None and freed < 2.5  # a period and a tick, not its 3 s lease
    assert _left(r) == []


def _server_key(rw: ReadWriteLock, key: str):
    return rw.read_lock()._server, key


# -- exclusion across processes ---------------------------------------------------------------
def test_readers_together_writers_alone_across_4_processes_x_2_threads(r, redis_server):
    t0 = time.monotonic()
    procs = [run_proc("mix", redis_server.socket, "mixrw", "2", "40", str(i)) for i in range(4)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "done" in out
    elapsed = time.monotonic() - t0
    assert int(r.get("rw:bad") or 0) == 0
    assert int(r.get("rw:maxread") or 0) >= 2  # readers did overlap
    assert int(r.get("rw:readers")) == 0 and int(r.get("rw:writers")) == 0
    assert not r.exists("mixrw") and r.hlen(index_key("")) == 0
    assert elapsed < 60, elapsed


# -- asyncio --------------------------------------------------------------------------------
@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def test_asyncio_readers_together_writer_alone_per_task(ar, r):
    async def main():
        rw = AsyncReadWriteLock(ar, "arw")
        read, write = rw.read_lock(), rw.write_lock()
        assert isinstance(read, AsyncReadLock) and isinstance(write, AsyncWriteLock)
        assert read._sync_client is write._sync_client
        go = asyncio.Event()
        inside: list[str] = []

        async def reader(tag):
            async with read:
                inside.append(tag)
                await go.wait()
            return tag

        readers = [asyncio.create_task(reader(i)) for i in range(3)]
        while len(inside) < 3:
            await asyncio.sleep(0.01)
        assert r.hlen("arw") == 4  # three task owners and the mode
        assert await read.is_locked() and not await write.is_locked()
        assert await write.try_lock() is False  # this task is not a reader, but they are
        released_at: list[float] = []

        async def let_go():
            await asyncio.sleep(0.3)
            released_at.append(time.monotonic())
            go.set()

        opener = asyncio.create_task(let_go())
        assert await write.try_lock(wait_time=10) is True  # this task waits for the readers
        assert time.monotonic() - released_at[0] < 2
        await opener
        assert sorted(await asyncio.gather(*readers)) == [0, 1, 2]
        assert await write.is_locked() and await write.hold_count() == 1
        assert await read.try_lock()  # downgrade in the same task
        await write.unlock()
        assert r.hget("arw", "mode") == b"read"

        async def other_writer():
            return await write.try_lock(wait_time=0.2)

        assert await asyncio.create_task(other_writer()) is False
        await read.unlock()
        assert not r.exists("arw")

        # A task that ends holding a read lock is released (the read kind's end script).
        async def leaves_it():
            await read.lock()

        await asyncio.create_task(leaves_it())
        for _ in range(200):
            if not r.exists("arw"):
                break
            await asyncio.sleep(0.01)
        assert not r.exists("arw") and _left(r) == []
        await ar.aclose()

    asyncio.run(main())


# -- the shared wake-all policy (pubsub.py) ---------------------------------------------------
# A message that lands while a woken waiter's retry is in flight must not be dropped, or the
# waiter sleeps on the PTTL its stale retry saw (fixed in pubsub by 6c37b84).
def test_a_message_during_a_woken_waiters_retry_is_not_lost(r, holders):
    rw = ReadWriteLock(r, "lostwake")
    write = rw.write_lock()
    reader, holder = holders(), holders()
    read = rw.read_lock()
    holder.call(write.lock)                      # watchdog: a 30 s PTTL
    waiter = ReadWriteLock(r, "lostwake").write_lock()
    real = waiter._attempt
    calls: list[bool] = []  # 1: before waiting; 2: on entering the queue; 3: woken

    def attempt(k, lease_ms, t0, claim=False, reg=None):  # reg: a retry's waiter record
        calls.append(claim)
        if len(calls) == 3:                      # the retry woken by the write unlock:
            reader.call(read.lock)               # a reader barges in first (non-fair)
            ttl = real(k, lease_ms, t0, claim, reg)  # so this retry fails, with a 30 s PTTL
            reader.call(read.unlock)             # the lock is free, "0" is published ...
            time.sleep(0.3)                      # ... and arrives while the retry is active
            return ttl
        return real(k, lease_ms, t0, claim, reg)

    waiter._attempt = attempt
    got = holders().submit(lambda: waiter.try_lock(wait_time=5))
    time.sleep(0.3)
    t0 = time.monotonic()
    holder.call(write.unlock)                    # publishes "1": the waiter retries
    assert got(15) is True
    assert time.monotonic() - t0 < 3.0           # not at the end of its budget
    assert len(calls) == 4                       # it retried once more, and got it
    waiter.force_unlock()
