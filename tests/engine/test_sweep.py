"""The index sweep (invariant 11, ``engine/sweep.py``): entries of locks that ended without a
release (a lease ran out) leave the index without anybody listing, a live lock's entry never
does, and a round costs a bounded number of commands whatever the size of the index.

The period is shortened here (``sweep.PERIOD``/``HURRY``, read at each round); costs are
counted with INFO commandstats, not timed."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock import RLock
from django_rlock.engine import sweep
from django_rlock.engine.listing import Locks
from django_rlock.engine.naming import index_key
from django_rlock.engine.watchdog import watchdog
from django_rlock.testing import RedisServer, free_port


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(sweep, "PERIOD", 0.05)
    monkeypatch.setattr(sweep, "HURRY", 0.05)


def until(check, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def calls(r) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def expire_all(r, keys) -> None:
    """The leases run out now (PEXPIRE 1 ms): what a lease's end or a killed holder leaves."""
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.pexpire(k, 1)
    pipe.execute()
    assert until(lambda: not r.exists(*keys))


def test_expired_leases_leave_the_index_within_a_few_rounds_without_any_listing(r, fast):
    names = [f"lease-{i}" for i in range(300)]
    for n in names:
        RLock(r, n, prefix="sw1:").lock(lease_time=30)
    idx = index_key("sw1:")
    assert r.hlen(idx) == 300
    assert "sw1:" in {p for _, p in watchdog().sweeper.targets()}
    expire_all(r, ["sw1:" + n for n in names])
    rounds = watchdog().sweeper.rounds
    assert until(lambda: r.hlen(idx) == 0), r.hlen(idx)
    # 300 entries, COUNT 100 a page: a few rounds (walks of other tests' targets share them).
    assert watchdog().sweeper.rounds - rounds <= 3 * 300 // sweep.COUNT + 10
    assert not calls(r).get("scan")  # never the keyspace: the index alone


def test_a_live_lock_keeps_its_entry_through_many_rounds(r, fast):
    held = RLock(r, "held", prefix="sw2:", watchdog_timeout=3)
    held.lock()  # watchdog mode
    long_lease = RLock(r, "long", prefix="sw2:")
    long_lease.lock(lease_time=60)
    # Many more live entries than a page, the dead ones among them: the walk goes on from its
    # cursor (a sweep that started over at 0 each round would never get past the live ones).
    live = [f"live-{i}" for i in range(300)]
    dead = [f"dead-{i}" for i in range(250)]
    for n in live + dead:
        RLock(r, n, prefix="sw2:").lock(lease_time=60)
    expire_all(r, ["sw2:" + n for n in dead])
    idx = index_key("sw2:")
    rounds = watchdog().sweeper.rounds
    assert until(lambda: r.hlen(idx) == 302), r.hlen(idx)
    # Whole walks of the index (the cursor back to 0) more than once: still listed.
    assert until(lambda: watchdog().sweeper.rounds - rounds >= 12)
    assert r.hexists(idx, "sw2:held") and r.hexists(idx, "sw2:long")
    assert Locks(r, "sw2:").names() == sorted(["held", "long"] + live)
    held.unlock()
    long_lease.unlock()


def test_a_lock_taken_again_between_the_page_and_the_prune_keeps_its_entry(r):
    lock = RLock(r, "again", prefix="sw3:")
    lock.lock(lease_time=30)
    expire_all(r, ["sw3:again"])
    cursor, gone = sweep.page(r, "sw3:", 0)
    assert cursor == 0 and [k for _, k in gone] == [b"sw3:again"]  # read as gone
    lock.lock(lease_time=30)  # taken again before the prune runs
    r.script_flush()  # and the prune script is not loaded (NOSCRIPT is taken care of)
    assert sweep.prune(r, gone) == 0
    assert Locks(r, "sw3:").names() == ["again"]
    lock.unlock()
    # Gone for real: the same pair is pruned.
    r.hset(index_key("sw3:"), "sw3:again", "x")
    assert sweep.prune(r, gone) == 1 and not r.exists(index_key("sw3:"))


def test_a_round_costs_the_same_few_commands_at_20000_entries(r):
    idx = index_key("sw4:")
    pipe = r.pipeline(transaction=False)
    for i in range(20_000):  # what 20,000 expired leases leave behind (their keys are gone)
        pipe.hset(idx, f"sw4:gone-{i}", "1764000000.000000 {}")
    pipe.execute()
    cursor = 0
    for _ in range(5):
        before = r.hlen(idx)
        r.config_resetstat()
        cursor, gone = sweep.page(r, "sw4:", cursor)
        pruned = sweep.prune(r, gone)
        n = calls(r)
        shrunk = before - r.hlen(idx)
        # One page: at least COUNT entries (HSCAN collects that many), never the whole index.
        assert sweep.COUNT <= pruned == shrunk == len(gone) <= 2 * sweep.COUNT
        assert n["hscan"] == 1 and n["evalsha"] == 1
        # EXISTS of the page, and the script's own EXISTS and HDEL of each entry gone.
        assert n["exists"] == 2 * len(gone) and n["hdel"] == len(gone)
        assert sum(n.values()) <= 2 + 3 * 2 * sweep.COUNT + 2  # (+ CONFIG, INFO)
        assert cursor != 0


def test_a_process_that_never_locked_sweeps_nothing(redis_server):
    code = f"""
import time, redis
from django_rlock import RLock
from django_rlock.engine import sweep
from django_rlock.engine.listing import Locks
from django_rlock.engine.watchdog import watchdog
from django_rlock.testing import RedisServer, free_port
sweep.PERIOD = sweep.HURRY = 0.01
r = redis.Redis(unix_socket_path={redis_server.socket!r})
Locks(r, "sw5:").names()  # listing, and a lock object never used, start nothing
RLock(r, "never", prefix="sw5:")
time.sleep(0.2)
print(len(watchdog().sweeper.targets()), watchdog().thread_alive(), watchdog().sweeper.rounds)
RLock(r, "once", prefix="sw5:").lock(lease_time=0.05)  # a lease: nothing to renew
time.sleep(0.5)
print(len(watchdog().sweeper.targets()), watchdog().sweeper.rounds > 3,
      r.hexists("rlock-index:sw5:", "sw5:once"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["0 None 0", "1 True False"]


def test_a_server_that_is_down_is_reported_once_and_renewals_go_on(r, own_server, fast,
                                                                   caplog):
    # This client gives up at once (no retries): a round on the dead server ends in a moment
    # (with the default retries it takes seconds, on a pool thread: nothing waits for it).
    other = own_server.client(retry=Retry(NoBackoff(), 0))
    RLock(other, "there", prefix="sw6:").lock(lease_time=30)
    own_server.stop()
    held = RLock(r, "renewed", prefix="sw6:", watchdog_timeout=0.6)
    held.lock()
    rounds = watchdog().sweeper.rounds
    with caplog.at_level(logging.DEBUG, logger="django_rlock"):
        assert until(lambda: watchdog().sweeper.rounds - rounds >= 10)
        time.sleep(0.7)  # past the first lease: renewed meanwhile
        assert until(lambda: watchdog().sweeper.rounds - rounds >= 20)
    assert not held.is_lost() and r.pttl("sw6:renewed") > 0
    failed = [rec for rec in caplog.records if "index sweep" in rec.getMessage()]
    assert failed and sum(rec.levelno >= logging.WARNING for rec in failed) <= 1
    held.unlock()



def test_a_server_turned_replica_fails_its_rounds_quietly(own_server, fast, caplog):
    """A failover made the server this process locked on a replica: its prune is refused
    (READONLY); the round fails, is logged rarely, and nothing else changes."""
    other = own_server.client()
    RLock(other, "there", prefix="sw7:").lock(lease_time=0.05)
    with RedisServer(port=free_port(), args=["--repl-diskless-sync-delay", "0"]) as master:
        m = master.client()
        m.hset(index_key("sw7:"), "sw7:gone", "x")  # a stale entry the replica copies
        other.replicaof("127.0.0.1", master.port)
        assert until(lambda: other.hexists(index_key("sw7:"), "sw7:gone"))
        rounds = watchdog().sweeper.rounds
        with caplog.at_level(logging.DEBUG, logger="django_rlock"):
            assert until(lambda: watchdog().sweeper.rounds - rounds >= 5)
        failed = [rec.getMessage() for rec in caplog.records if "index sweep" in rec.getMessage()]
        # ReadOnlyError on Redis 7; Redis 6.2 answers the pipelined script a ResponseError
        assert any("ReadOnlyError" in msg or "READONLY" in msg for msg in failed), failed
        assert sum(rec.levelno >= logging.WARNING for rec in caplog.records
                   if "index sweep" in rec.getMessage()) <= 1
        assert other.hexists(index_key("sw7:"), "sw7:gone")  # refused, not half done
        other.replicaof("no", "one")
        m.close()
