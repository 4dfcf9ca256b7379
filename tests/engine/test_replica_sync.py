"""Replica sync: an acquire on a master with replicas WAITs for them in the same round trip,
and is undone when too few acknowledge (Redisson's checkLockSyncedSlaves)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import replicas
from django_rlock.engine.errors import LockNotSyncedError
from django_rlock.engine.naming import index_key
from django_rlock.engine.scripts import ACQUIRE_SCRIPT, RELEASE_SCRIPT
from django_rlock.engine.watchdog import watchdog
from django_rlock.testing import RedisServer, free_port


def _until(cond, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    master = RedisServer(port=free_port(), args=["--repl-diskless-sync-delay", "0"]).start()
    replica = RedisServer(port=free_port(),
                          args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    with master.client() as m, replica.client() as rep:
        # Online on the master's side too: a replica still in its first sync is not counted.
        _until(lambda: replicas.online(m.info("replication")) == 1
               and rep.info("replication")["master_link_status"] == "up")
    yield master, replica
    for s in (replica, master):
        s.stop()
        shutil.rmtree(s.dir, ignore_errors=True)


@pytest.fixture
def m(pair) -> Iterator[redis.Redis]:
    client = pair[0].client()
    client.flushall()
    replicas._counts.clear()
    for script in (ACQUIRE_SCRIPT, RELEASE_SCRIPT):
        client.script_load(script.source)  # so first use is not counted as NOSCRIPT + EVAL
    client.config_resetstat()
    yield client
    client.close()


def calls(client: redis.Redis, cmd: str) -> int:
    return client.info("commandstats").get(f"cmdstat_{cmd}", {}).get("calls", 0)


class paused:
    """SIGSTOP a server (a replica that stops acknowledging), SIGCONT on exit."""

    def __init__(self, server: RedisServer) -> None:
        self.pid = server.proc.pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def test_acquire_is_on_the_replica_when_it_returns(pair, m):
    rep = pair[1].client()
    lock = RLock(m, "synced")
    for _ in range(20):
        lock.lock()
        # WAIT rode with the acquire: the replica has the very same hash already.
        assert rep.hgetall("synced") == m.hgetall("synced") != {}
        lock.unlock()
    assert calls(m, "wait") == 1 + 40  # the probe's WAIT 0 0, then one per acquire and release
    assert calls(m, "evalsha") == 40  # no extra script round trip
    rep.close()


def test_a_paused_replica_fails_the_acquire_and_leaves_no_trace(pair, m):
    lock = RLock(m, "paused", sync_timeout=0.5)
    lock.lock()
    lock.unlock()  # probed: one replica
    with paused(pair[1]):
        start = time.monotonic()
        with pytest.raises(LockNotSyncedError) as err:
            lock.try_lock()
        elapsed = time.monotonic() - start
    assert 0.4 < elapsed < 3.0, elapsed
    e = err.value
    assert (e.name, e.connected, e.acknowledged, e.required) == ("paused", 1, 0, 1)
    assert "'paused'" in str(e) and "0 of 1 replica" in str(e)
    assert not m.exists("paused") and m.hget(index_key(""), "paused") is None
    assert watchdog().get((lock._server, "paused", lock._owner())) is None  # nothing renewed
    # Resumed: works again (the replica catches up; the count is probed afresh).
    _until(lambda: pair[1].client().info("replication")["master_link_status"] == "up")
    assert lock.try_lock(wait_time=5) is True
    lock.unlock()


def test_a_reentrant_acquire_that_fails_to_sync_undoes_only_itself(pair, m):
    lock = RLock(m, "reentry", sync_timeout=0.3)
    lock.lock()
    with paused(pair[1]), pytest.raises(LockNotSyncedError):
        lock.lock()
    assert lock.hold_count() == 1 and m.ttl("reentry") > 0
    lock.unlock()
    assert not m.exists("reentry")


def test_an_explicit_count_above_the_replicas_fails_and_zero_turns_it_off(m):
    with pytest.raises(LockNotSyncedError) as err:
        RLock(m, "two", sync_replicas=2, sync_timeout=0.2).try_lock()
    assert (err.value.connected, err.value.required) == (1, 2)
    assert not m.exists("two")
    before = calls(m, "wait")
    for off in (0, None):
        lock = RLock(m, "off", sync_replicas=off)
        lock.lock()
        lock.unlock()
    assert calls(m, "wait") == before


def test_no_replica_means_nothing_extra_after_one_probe(r):
    replicas._counts.clear()
    r.config_resetstat()
    lock = RLock(r, "alone")
    for _ in range(50):
        lock.lock()
        lock.unlock()
    stats = r.info("commandstats")  # (this INFO is counted after the read)
    assert stats["cmdstat_wait"]["calls"] == 1 and stats["cmdstat_info"]["calls"] == 1  # the probe
    assert stats["cmdstat_evalsha"]["calls"] == 100


def test_a_server_without_wait_turns_the_check_off_with_one_info_log(caplog):
    caplog.set_level(logging.INFO, logger="django_rlock")
    with RedisServer(args=["--rename-command", "WAIT", ""]) as server:
        client = server.client()
        for i in range(3):
            lock = RLock(client, f"nowait:{i}")
            lock.lock()
            lock.unlock()
        client.close()
    logs = [rec for rec in caplog.records if "does not support WAIT" in rec.getMessage()]
    assert len(logs) == 1 and logs[0].levelno == logging.INFO


def test_async_lock_syncs_and_undoes_too(pair, m):
    async def main():
        am = redis.asyncio.Redis(unix_socket_path=pair[0].socket)
        lock = AsyncRLock(am, "async-synced", sync_timeout=0.5)
        await lock.lock()
        assert pair[1].client().hgetall("async-synced") != {}
        await lock.unlock()
        with paused(pair[1]):
            with pytest.raises(LockNotSyncedError):
                await lock.try_lock()
        assert not await am.exists("async-synced")
        await am.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("bad", ["all", -1, 1.5, True])
def test_bad_sync_options_are_refused_before_any_command(r, bad):
    r.config_resetstat()
    with pytest.raises(ValueError, match="sync_replicas"):
        RLock(r, "x", sync_replicas=bad)
    with pytest.raises(ValueError, match="sync_timeout"):
        RLock(r, "x", sync_timeout=0)
    assert calls(r, "evalsha") == 0


def test_only_online_replicas_are_counted():
    # A replica still loading its first full sync is connected but acknowledges nothing.
    info = {"connected_slaves": 2, "slave0": {"ip": "127.0.0.1", "state": "online"},
            "slave1": {"ip": "127.0.0.1", "state": "wait_bgsave"}}
    assert replicas.online(info) == 1
    assert replicas.online({"connected_slaves": 0}) == 0


def test_renewals_reach_the_replica_or_the_holder_is_in_doubt(pair, m):
    lock = RLock(m, "renewed", watchdog_timeout=1.5, sync_timeout=0.3)
    lock.lock()
    before = calls(m, "wait")
    time.sleep(1.2)  # two renewal periods
    assert calls(m, "wait") > before  # renewals carried WAIT
    assert not lock.is_lost()
    with paused(pair[1]):
        deadline = time.monotonic() + 3
        while not lock.is_lost() and time.monotonic() < deadline:
            time.sleep(0.02)
        # The master still renews it, but a failover now could lose it: not vouched for.
        assert lock.is_lost() and m.exists("renewed")
    _until(lambda: not lock.is_lost(), 5)  # a renewal reached the replica again
    lock.unlock()
