"""Sharded pub/sub on a Redis 7+ / Valkey cluster (issue #10), as Redisson uses it since 3.22.

A release reaches its shard only (SPUBLISH on the slot's master), not every node; a
Redisson-style client listening with SSUBSCRIBE is woken by our releases, and our waiters by
its. On Redis 6.2 (no sharded pub/sub) these are skipped: classic pub/sub is used there.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import identity
from django_rlock.engine.clients import sharded
from django_rlock.engine.naming import (
    PROCESS_TOKEN_MARK,
    grant_channel,
    handoff_waiters,
    process_grant_channel,
)
from django_rlock.engine.scripts import RELEASE_SCRIPT
from tests.cluster_topology import ClusterTopology


@pytest.fixture
def rc(cluster: ClusterTopology):
    client = cluster.client()
    with cluster.node_client(cluster.masters()[0]) as c:
        if int(str(c.info("server")["redis_version"]).split(".")[0]) < 7:
            pytest.skip("no sharded pub/sub before Redis 7")
    return client


def _calls(cluster: ClusterTopology, server, command: str) -> int:
    with cluster.node_client(server) as c:
        return c.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def _message(pubsub, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = pubsub.get_sharded_message(timeout=0.1) if hasattr(
            pubsub, "get_sharded_message") else pubsub.get_message(timeout=0.1)
        if m is not None and m["type"] in ("smessage", "message"):
            return m
    return None


def test_a_release_reaches_its_shard_only(cluster: ClusterTopology, rc):
    name = "sharded-release"
    lock = RLock(rc, name)
    assert sharded(lock.client)
    master = cluster.node_for_key(name)
    others = [m for m in cluster.masters() if m.port != master.port]
    # A Redisson-style waiter on the lock's master (SSUBSCRIBE), and a classic subscriber of
    # the same channel on another master, which a broadcast PUBLISH would reach.
    with cluster.node_client(master) as mc, cluster.node_client(others[0]) as oc:
        shard_sub = mc.pubsub()
        shard_sub.ssubscribe(lock._channel)
        classic_sub = oc.pubsub()
        classic_sub.subscribe(lock._channel)
        time.sleep(0.2)
        for p in (shard_sub, classic_sub):  # the confirmations
            p.get_message(timeout=0.5)
        before = {m.port: (_calls(cluster, m, "publish"), _calls(cluster, m, "spublish"))
                  for m in cluster.masters()}
        lock.lock()
        lock.unlock()
        got = _message(shard_sub)
        assert got is not None and got["data"] == b"0", "a Redisson-style waiter was not woken"
        assert _message(classic_sub, timeout=0.5) is None  # no broadcast to other nodes
        after = {m.port: (_calls(cluster, m, "publish"), _calls(cluster, m, "spublish"))
                 for m in cluster.masters()}
        shard_sub.close()
        classic_sub.close()
    assert after[master.port][1] > before[master.port][1]
    for m in others:
        assert after[m.port] == before[m.port]


def test_our_waiter_wakes_on_a_foreign_clients_sharded_release(cluster: ClusterTopology, rc):
    name = "sharded-foreign"
    lock = RLock(rc, name)
    master = cluster.node_for_key(name)
    with cluster.node_client(master) as c:
        # A Redisson client's hold: its own owner field, a 30 s lease.
        c.hset(lock.key, "java-client-uuid:7", 1)
        c.pexpire(lock.key, 30_000)
        got = threading.Event()

        def waiter() -> None:
            if RLock(rc, name).try_lock(wait_time=20):
                got.set()

        t = threading.Thread(target=waiter)
        t.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not c.execute_command(
                "PUBSUB", "SHARDNUMSUB", lock._channel)[1]:
            time.sleep(0.01)
        assert c.execute_command("PUBSUB", "SHARDNUMSUB", lock._channel)[1] >= 1
        t0 = time.monotonic()
        c.delete(lock.key)  # the foreign unlock: delete, then Redisson's "0" on its channel
        c.execute_command("SPUBLISH", lock._channel, "0")
        assert got.wait(5), "our waiter slept on past the foreign release"
        assert time.monotonic() - t0 < 5  # woken, not at the 30 s lease
    t.join(5)


def test_an_asyncio_waiter_on_a_cluster_registers_for_the_shared_grant_channel(
        cluster: ClusterTopology, rc):
    """Invariant 44 is off on a cluster: a wait keeps the subscription it started with, so
    after a slot move a grant on the process's channel would never be heard there (sharded)
    or be heard while the new master skipped the waiter (classic pub/sub: two owners). An
    asyncio waiter's token has no ``p``; the release SPUBLISHes its grant on the lock's grant
    channel, which its process SSUBSCRIBEd with the lock's channel, and it takes the lock.
    The release here is another process's (sent by hand, with that process's id)."""
    name = "sharded-process-grant"
    master = cluster.node_for_key(name)

    async def body(arc) -> None:
        lock = AsyncRLock(arc, name)
        with cluster.node_client(master) as c:
            c.hset(lock.key, "other-process:7", 1)  # another process's hold
            c.pexpire(lock.key, 30_000)
            # A first wait that gives up: this process subscribes to the lock's channels.
            assert not await lock.try_lock(wait_time=0.3)

            async def wait_then_unlock() -> None:
                await lock.lock()
                await lock.unlock()

            task = asyncio.ensure_future(wait_then_unlock())
            channel = process_grant_channel(lock.key, identity.process_id())
            for _ in range(500):
                tokens = [t for t in c.hkeys(handoff_waiters(lock.key)) if b"#" in t
                          and not t.startswith(b"=")]
                if tokens:
                    break
                await asyncio.sleep(0.01)
            (token,) = tokens
            assert not token.decode().endswith(PROCESS_TOKEN_MARK)
            assert c.execute_command("PUBSUB", "SHARDNUMSUB", grant_channel(lock.key))[1] == 1
            assert c.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1  # unused here
            script = RELEASE_SCRIPT.sharded
            reply = c.eval(script.source, len(lock._release_keys), *lock._release_keys,
                           "other-process:7", 30_000, "0", "", 0, 0, "", "", "other-process")
            assert reply == token  # granted to it on the shared grant channel
            await asyncio.wait_for(task, 5)  # it took the lock (and gave it back)
            assert not c.exists(lock.key)

    cluster.run_async(body)
