"""Grants to asyncio waiters read by their own event loop (``wait.aioreader``, invariant 44).

A grant to an asyncio waiter is published on its process's channel for the lock; that channel
is subscribed by a connection of the waiter's event loop (named ``rlock-pubsub:<process>:<db>:aio``),
not by the process's shared subscription, and the grant is booked on the loop's thread. A
reader whose loop closed is shut, so a release skips its waiters; a reader whose connection
was killed connects again and subscribes again.

The "other process" whose release grants the lock is the release script sent by hand with
another process's owner and token prefix (as ``tests/cluster/test_sharded.py`` does).
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis.asyncio as aredis

from django_rlock import AsyncRLock
from django_rlock.engine import events, identity
from django_rlock.engine.naming import PROCESS_TOKEN_MARK, handoff_waiters, process_grant_channel
from django_rlock.engine.scripts import RELEASE_SCRIPT
from tests.engine.test_handoff import until

OTHER = "other-process:7"


def _held_elsewhere(r, lock: AsyncRLock) -> None:
    r.hset(lock.key, OTHER, 1)  # another process's hold
    r.pexpire(lock.key, 30_000)


def _release_elsewhere(r, lock: AsyncRLock):
    """The other process's release: grants the lock to the first live waiter in line."""
    return r.eval(RELEASE_SCRIPT.source, len(lock._release_keys), *lock._release_keys,
                  OTHER, 30_000, "0", "", 0, 0, "", "", "other-process")


def _tokens(r, lock: AsyncRLock) -> list[bytes]:
    return [t for t in r.hkeys(handoff_waiters(lock.key))
            if b"#" in t and not t.startswith(b"=")]


def _subs(r) -> dict[str, int]:
    """This process's subscription connections: name -> channels subscribed."""
    mine = f"rlock-pubsub:{identity.process_id()}:"
    return {c["name"]: int(c["sub"]) for c in r.client_list() if c["name"].startswith(mine)}


async def _in_line(r, lock: AsyncRLock) -> asyncio.Task:
    """A first wait that gives up (the process and this loop subscribe the lock's channels),
    then a task in line for it with a token ending in PROCESS_TOKEN_MARK (it unlocks as soon
    as it has the lock)."""
    assert not await lock.try_lock(wait_time=0.3)

    async def wait() -> None:
        await lock.lock()
        await lock.unlock()

    task = asyncio.ensure_future(wait())
    for _ in range(500):
        if _tokens(r, lock):
            break
        await asyncio.sleep(0.01)
    (token,) = _tokens(r, lock)
    assert token.decode().endswith(PROCESS_TOKEN_MARK)
    return task


def test_a_grant_to_an_asyncio_waiter_is_read_and_booked_by_its_own_event_loop(
        r, redis_server):
    name = "xrd-own"
    booked: list[int] = []

    def listener(event: str, data: dict) -> None:
        if event == "acquired" and data["name"] == name:
            booked.append(threading.get_ident())

    async def main() -> None:
        ac = aredis.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ac, name, sync_client=r)
        _held_elsewhere(r, lock)
        task = await _in_line(r, lock)
        channel = process_grant_channel(lock.key, identity.process_id())
        # One subscriber to our process channel: this loop's reader; the shared subscription
        # has the lock channel and the grant channel only.
        assert r.pubsub_numsub(channel) == [(channel.encode(), 1)]
        subs = _subs(r)
        assert subs[f"rlock-pubsub:{identity.process_id()}:0:aio"] == 1, subs
        assert subs[f"rlock-pubsub:{identity.process_id()}:0"] == 2, subs

        (token,) = _tokens(r, lock)
        assert _release_elsewhere(r, lock) == token  # granted to our waiter
        await asyncio.wait_for(task, 5)  # granted (and given back), without an attempt
        assert booked == [threading.get_ident()]  # booked on this loop's thread
        await ac.aclose()

    events.add_listener(listener)
    try:
        asyncio.run(main())
    finally:
        events.remove_listener(listener)
    assert not r.exists(name)


def test_a_closed_loops_waiter_is_skipped_by_the_next_release(r, redis_server):
    """The loop of a waiter in line is closed under it (its task never ends): its reader is
    shut within about a second, so a release finds nobody on its channel and frees the lock
    at once instead of granting it to a waiter that can never take it."""
    name = "xrd-closed"
    loop = asyncio.new_event_loop()
    ac = aredis.Redis(unix_socket_path=redis_server.socket)
    lock = AsyncRLock(ac, name, sync_client=r)
    _held_elsewhere(r, lock)
    loop.run_until_complete(_in_line(r, lock))
    loop.close()  # (the task in line is left pending: its wait never ends)
    channel = process_grant_channel(lock.key, identity.process_id())
    until(lambda: r.pubsub_numsub(channel) == [(channel.encode(), 0)],
          what="the closed loop's reader shut")
    reply = _release_elsewhere(r, lock)
    assert reply == 1  # released, not granted: the waiter was skipped as gone
    assert not r.exists(name)


def test_a_killed_reader_connects_again_and_its_waiters_are_granted(r, redis_server):
    name = "xrd-kill"

    async def main() -> None:
        ac = aredis.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ac, name, sync_client=r)
        _held_elsewhere(r, lock)
        task = await _in_line(r, lock)
        channel = process_grant_channel(lock.key, identity.process_id())
        aio = f"rlock-pubsub:{identity.process_id()}:0:aio"
        r.client_kill_filter(_id=next(c["id"] for c in r.client_list() if c["name"] == aio))
        # Its waiter was woken to attempt again (it stays in line); the reader is back.
        for _ in range(500):
            if r.pubsub_numsub(channel) == [(channel.encode(), 1)]:
                break
            await asyncio.sleep(0.01)
        assert r.pubsub_numsub(channel) == [(channel.encode(), 1)]
        t0 = time.monotonic()
        while not _tokens(r, lock) and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.01)
        _release_elsewhere(r, lock)
        await asyncio.wait_for(task, 5)
        await ac.aclose()

    asyncio.run(main())
    assert not r.exists(name)
