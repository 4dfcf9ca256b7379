"""The watchdog: one thread per process, batched renewal, losses reported, never dies."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine.watchdog import watchdog
from tests.faultproxy import FaultProxy


def watchdog_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "django-rlock-watchdog")


def test_watchdog_keeps_a_lock_for_several_timeouts(r):
    lock = RLock(r, "kept", watchdog_timeout=1.0)
    lock.lock()
    try:
        for _ in range(14):  # 3.5 s = 3.5 x the timeout
            time.sleep(0.25)
            assert r.pttl("kept") > 0
    finally:
        lock.unlock()
    assert not r.exists("kept")


def test_lease_mode_is_not_renewed(r):
    lock = RLock(r, "leased", watchdog_timeout=1.0)
    lock.lock(lease_time=0.6)
    time.sleep(1.2)
    assert not r.exists("leased")
    with pytest.raises(LockNotOwnedError):
        lock.unlock()


def test_one_thread_renews_many_locks_in_few_round_trips(r):
    locks = [RLock(r, f"many:{i}", watchdog_timeout=1.5) for i in range(600)]
    for lock in locks:
        lock.lock()
    wd = watchdog()
    # Taking 600 locks can outlast half a period on a busy machine: let the sweeps settle
    # (at most two per period), then count.
    time.sleep(1.0)
    trips, renewed = wd.round_trips, wd.renewed
    time.sleep(2.6)  # five periods
    try:
        assert watchdog_threads() == 1
        assert wd.renewed - renewed >= 600
        # 600 locks, 0.5 s period, ~5 periods: a timer per lock would need ~3000 round trips.
        assert wd.round_trips - trips <= 12
        assert all(r.pttl(lock.key) > 0 for lock in locks[::50])
    finally:
        for lock in locks:
            lock.unlock()
    assert watchdog().renewing() == 0


def test_redis_restart_marks_the_hold_lost_and_later_locks_renew(own_server, holders, caplog):
    client = own_server.client()
    lost: list[str] = []
    lock = RLock(client, "restart", watchdog_timeout=1.0, on_lost=lost.append)
    h = holders()
    h.call(lambda: lock.lock())
    caplog.set_level(logging.WARNING, logger="django_rlock")
    own_server.restart()  # data and scripts gone
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost == ["restart"]
    assert h.call(lock.is_lost)
    assert any("restart" in rec.getMessage() and "lost" in rec.getMessage() for rec in caplog.records)
    with pytest.raises(LockNotOwnedError):
        h.call(lock.unlock)
    # The watchdog thread survived the outage: a new hold is renewed normally.
    fresh = RLock(client, "after-restart", watchdog_timeout=1.0)
    h.call(lambda: fresh.lock())
    time.sleep(2.2)
    assert client.pttl("after-restart") > 0 and not h.call(fresh.is_lost)
    h.call(fresh.unlock)
    assert not client.exists("after-restart")
    client.close()


@pytest.mark.parametrize("op", ["acquire", "release"])
def test_lock_scripts_are_never_resent_after_a_lost_reply(r, redis_server, op):
    """The server ran the script but the reply was lost. redis-py's Retry (3 retries here)
    would run it again: hold count 4 after one acquire (Redisson #4822/#7367), or a release
    of every level of a reentrant hold. We send once and surface the timeout."""
    proxy = FaultProxy(redis_server.socket)
    c = redis.Redis(port=proxy.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 3))
    lock = RLock(c, "once")
    holder = holders_thread()
    try:
        holder.call(lambda: lock.lock(lease_time=30))
        if op == "release":
            holder.call(lambda: lock.lock(lease_time=30))
            holder.call(lambda: lock.lock(lease_time=30))
        proxy.swallow_replies.set()
        call = (lambda: lock.lock(lease_time=30)) if op == "acquire" else lock.unlock
        with pytest.raises(redis.TimeoutError):
            holder.call(call)
        assert r.hvals("once") == ([b"2"] if op == "acquire" else [b"2"])  # ran exactly once
    finally:
        proxy.close()
        holder.close()
        c.close()


def holders_thread():
    from tests.conftest import Holder

    return Holder()


def test_a_failed_release_cancels_renewal(own_server):
    admin = own_server.client()
    c = own_server.client(socket_timeout=0.3)
    lock = RLock(c, "stuck", watchdog_timeout=1.0)
    lock.lock()
    admin.client_pause(700, all=False)
    with pytest.raises(redis.TimeoutError):
        lock.unlock()
    assert watchdog().renewing() == 0
    # Whether or not the release landed, nothing keeps the key alive beyond its lease.
    time.sleep(2.0)
    assert not admin.exists("stuck")
    c.close()
    admin.close()


def test_a_holder_is_told_before_an_unrenewed_lease_can_run_out(own_server):
    """Redis stops answering (a failover under way): renewals cannot be confirmed, so
    is_lost() turns True once the last confirmed lease is over, before anyone else could have
    the lock; on_lost is not called for a doubt, only for a hold found gone."""
    import os
    import signal

    client = own_server.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    lost: list[str] = []
    lock = RLock(client, "lapse", watchdog_timeout=0.9, on_lost=lost.append)
    lock.lock()
    assert not lock.is_lost()
    os.kill(own_server.proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 3
        while not lock.is_lost() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.is_lost()  # within the 0.9 s lease of the last renewal, + a poll
        assert time.monotonic() < deadline
    finally:
        os.kill(own_server.proc.pid, signal.SIGCONT)
    client.close()


def test_holds_of_every_kind_are_renewed_in_one_pipeline_per_sweep(r):
    """Invariant 19: the watchdog groups holds per server, then per kind's renew script, and
    maps each script's replies back to its own holds (a mix-up would mark some lost)."""
    from django_rlock import FairLock, FencedLock, PermitExpirableSemaphore, ReadWriteLock

    lost: list[str] = []
    rw = ReadWriteLock(r, "mix:rw", watchdog_timeout=1.5, on_lost=lost.append)
    locks = [RLock(r, "mix:plain", watchdog_timeout=1.5, on_lost=lost.append),
             FairLock(r, "mix:fair", watchdog_timeout=1.5, on_lost=lost.append),
             FencedLock(r, "mix:fenced", watchdog_timeout=1.5, on_lost=lost.append),
             rw.read_lock(), ReadWriteLock(r, "mix:rw2", watchdog_timeout=1.5,
                                           on_lost=lost.append).write_lock()]
    sem = PermitExpirableSemaphore(r, "mix:sem", watchdog_timeout=1.5)
    sem.try_set_permits(1)
    wd = watchdog()
    for lock in locks:
        lock.lock()
    permit = sem.acquire()
    try:
        trips, renewed = wd.round_trips, wd.renewed
        time.sleep(4.0)  # about eight renewal periods (0.5 s)
        sweeps = wd.round_trips - trips
        assert lost == []
        assert all(lock.is_held_by_current_thread() and not lock.is_lost() for lock in locks)
        assert r.pttl("mix:plain") > 0 and r.pttl("mix:fair") > 0 and r.pttl("mix:rw") > 0
        [read_lease] = r.keys("{mix:rw}:*:rwlock_timeout:1")  # the read hold's own lease
        assert r.pttl(read_lease) > 0
        assert sem.available_permits() == 0 and r.zscore("{mix:sem}:timeout",
                                                          bytes.fromhex(permit)) is not None
        # Six holds of five kinds: one pipeline per sweep renews them all.
        assert 4 <= sweeps <= 12
        assert wd.renewed - renewed >= 6 * sweeps - 6
    finally:
        for lock in locks:
            lock.unlock()
        sem.release(permit)


def test_a_batch_of_many_owners_and_leases_renews_only_each_owners_own_keys(r, holders):
    """The RLock batch sends each owner and lease once per run of keys (renew_many.lua): keys
    of three owners and two leases interleaved in one batch each get their own owner's check
    and their own lease, and a key another owner took meanwhile is reported lost and never
    extended (a renewal never lengthens someone else's lock)."""
    lost: list[str] = []
    threads = [holders() for _ in range(3)]
    locks = []
    for i in range(60):
        lock = RLock(r, f"runs:{i}", watchdog_timeout=1.5 if i % 2 else 3.0,
                     on_lost=lost.append)
        threads[i % 3].call(lock.lock)
        locks.append(lock)
    wd = watchdog()
    stolen = locks[7]
    r.delete(stolen.key)
    r.hset(stolen.key, "someone-else:1", 1)
    r.pexpire(stolen.key, 60_000)
    try:
        renewed = wd.renewed
        time.sleep(3.5)  # past every lease the locks were taken with, 2-7 periods
        assert lost == [stolen.name]
        assert r.pttl(stolen.key) > 50_000  # not cut to a watchdog lease
        assert r.hgetall(stolen.key) == {b"someone-else:1": b"1"}
        for i, lock in enumerate(locks):
            if lock is stolen:
                continue
            ttl = r.pttl(lock.key)
            assert 0 < ttl <= (1500 if i % 2 else 3000), (lock.key, ttl)
            assert not threads[i % 3].call(lock.is_lost)
        assert wd.renewed - renewed >= 59 * 2
    finally:
        for i, lock in enumerate(locks):
            if lock is not stolen:
                threads[i % 3].call(lock.unlock)


def test_renew_calls_give_each_key_its_own_owners_check_and_lease(r):
    """``renew_calls``/``results`` on a real server: holds of two owners and two leases
    interleaved go out in runs (each owner and lease once per run), every key gets its own
    hold's lease, and the replies map back to the right holds (a stolen key lost, the rest
    renewed)."""
    from django_rlock.engine.holds import Hold
    from django_rlock.engine.renewal import RENEW_BATCH, renew_calls, results

    holds = []
    for i in range(RENEW_BATCH + 40):  # two batches
        owner = f"owner-{i % 2}:1"
        h = Hold(r, ("s",), f"runs2:{i}", f"runs2:{i}", owner)
        h.period = 5.0 if i % 3 else 20.0  # leases 15 s and 60 s
        h.renew = True
        r.hset(h.key, owner, 1)
        holds.append(h)
    stolen = holds[10]
    r.hdel(stolen.key, stolen.owner)
    r.hset(stolen.key, "owner-x:1", 1)
    calls, order, shapes = renew_calls(holds, False, time.monotonic())
    assert sorted(map(id, order)) == sorted(map(id, holds))
    # Four runs (two owners x two leases): a handful of ARGV per script, not two per key.
    assert all(len(args) <= 3 * 4 for _, _, args in calls)
    replies = [r.eval(script.source, len(keys), *keys, *args) for script, keys, args in calls]
    got = dict(zip(map(id, order), results(replies, shapes), strict=True))
    for i, h in enumerate(holds):
        ttl = r.pttl(h.key)
        if h is stolen:
            assert got[id(h)] == 0 and ttl == -1  # not ours: neither renewed nor given a TTL
        else:
            lease = 15_000 if i % 3 else 60_000
            assert got[id(h)] == 1 and lease - 5_000 < ttl <= lease, (h.key, ttl)


def test_a_renewal_that_meets_its_owners_own_release_reports_no_loss(r):
    """A renewal in flight while the owner releases: the release deletes the key on the
    server first, the renewal finds it gone, and the releasing thread books its release just
    after. That is a release, not a loss: no ``lost`` event, no ``on_lost``, no WARNING."""
    from django_rlock.engine import identity
    from django_rlock.engine.holds import server_id

    lost: list[str] = []
    lock = RLock(r, "own-release", watchdog_timeout=0.6, on_lost=lost.append)
    lock.lock()
    wd = watchdog()
    k = (server_id(r), lock.key, identity.thread_owner())
    hold = wd.get(k)
    assert hold is not None
    r.delete(lock.key)  # what the owner's release does on the server...
    renewed = wd.renewed
    deadline = time.monotonic() + 5
    while wd.renewed == renewed and time.monotonic() < deadline:
        time.sleep(0.001)
    assert wd.renewed > renewed  # ...while this renewal was on its way,
    wd.released(k, hold, fully=True)  # and the releasing thread books it on the reply
    time.sleep(0.6)
    assert lost == [] and not lock.is_lost()


def test_a_batched_renewal_runs_one_check_and_one_expiry_per_key(r):
    """What renewing a key costs the server, counted: the owner's check (``HEXISTS``) and the
    new expiry (``PEXPIREAT``: the server's ``TIME``, read once per script, plus the lease;
    ``PEXPIRE`` reads the clock and makes a new argument per key); and the expiry so set is
    the hold's lease, from the server's clock."""
    from django_rlock.engine.holds import Hold
    from django_rlock.engine.renewal import RENEW_BATCH, renew_calls, results

    holds = []
    for i in range(2 * RENEW_BATCH + 10):  # three scripts
        h = Hold(r, ("s",), f"cost:{i}", f"cost:{i}", "owner-c:1")
        h.period, h.renew = 10.0, True  # a 30 s lease
        r.hset(h.key, h.owner, 1)
        holds.append(h)
    calls, order, shapes = renew_calls(holds, False, time.monotonic())
    r.config_resetstat()
    replies = [r.eval(script.source, len(keys), *keys, *args) for script, keys, args in calls]
    inner = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
    inner = {k: n for k, n in inner.items() if k.split("|")[0] not in {"eval", "info", "config"}}
    assert inner == {"hexists": len(holds), "pexpireat": len(holds), "time": 3}
    assert results(replies, shapes) == [1] * len(holds)
    ttls = [r.pttl(h.key) for h in holds]
    assert all(27_000 < ttl <= 30_000 for ttl in ttls), (min(ttls), max(ttls))


SHUTDOWN_SCRIPT = """
import sys, threading, time, redis
from django_rlock import RLock

client = redis.Redis(unix_socket_path=sys.argv[1])

def worker():
    lock = RLock(client, "after-main", watchdog_timeout=1.0)
    with lock:
        time.sleep(3.5)  # 3.5 leases, all of them after the main thread returned
        print("held", lock.is_held_by_current_thread(), "lost", lock.is_lost(), flush=True)

threading.Thread(target=worker).start()  # not a daemon, and never joined
time.sleep(0.3)
"""


def test_holds_of_threads_that_outlive_the_main_thread_are_renewed(redis_server):
    """A script that starts a (non-daemon) thread holding a lock and returns from its main
    thread: the interpreter shuts down around that thread, and ``concurrent.futures`` takes no
    more work. The watchdog thread once died there (RuntimeError) and the hold ran out under
    its holder; it renews on a thread of its own instead."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SHUTDOWN_SCRIPT, redis_server.socket],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "held True lost False", out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
