"""The contended hand-off as asyncio waiters see it (invariant 44): a grant to an asyncio
waiter of another process is published on that process's own channel for the lock, which no
other process hears; a waiter whose process died is skipped in the same release; and a
release that grants the lock to someone in line puts the releasing process's next waiter in
line too, so that waiter sends no attempt of its own (and takes a grant that reaches it
before that release's reply is booked).

Waiters in other processes are real processes (``_handoff_proc``), killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import pubsub
from django_rlock.engine.naming import (
    PROCESS_TOKEN_MARK,
    grant_channel,
    handoff_queue,
    handoff_waiters,
    process_grant_channel,
)
from django_rlock.engine.scripts import RELEASE_SCRIPT
from django_rlock.engine.wait import settings
from django_rlock.engine.wait.channel import Channel, Channels
from django_rlock.engine.wait.handoff import HandOffs
from django_rlock.engine.wait.waiter import HandOff, State, Waiter
from tests.conftest import script_calls
from tests.engine.test_handoff import in_line, procs, until

__all__ = ["procs"]  # (the fixture, shared with test_handoff)


def _in_line_waiters(r, redis_server, holders, procs, name: str, n: int):
    """A thread of ours holds ``name``; ``n`` asyncio waiter processes are in line for it, in
    the order started. (lock, holder, [(proc, its process uuid)])"""
    lock = RLock(r, name)
    holder = holders()
    holder.call(lock.lock)
    waiting = []
    for i in range(n):
        p = procs("await_hold", redis_server.socket, name)
        uuid = p.expect("waiting").split()[1]
        until(lambda: in_line(r, name) == i + 1, what=f"waiter {i + 1} in line")
        waiting.append((p, uuid))
    return lock, holder, waiting


def _line(r, name: str) -> list[str]:
    """The tokens in line, in order (a withdrawn one stays in the list, without an entry)."""
    entries = set(r.hkeys(handoff_waiters(name)))
    return [t.decode() for t in r.lrange(handoff_queue(name), 0, -1) if t in entries]


def _messages(listener, seconds: float = 0.3) -> list[tuple[str, str]]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        m = listener.get_message(timeout=0.05)
        if m is not None and m["type"] == "pmessage":
            out.append((m["channel"].decode(), m["data"].decode()))
    return out


def test_a_grant_to_an_asyncio_waiter_is_heard_by_its_own_process_alone(r, redis_server,
                                                                        holders, procs):
    name = "xap"
    lock, holder, waiting = _in_line_waiters(r, redis_server, holders, procs, name, 2)
    (b, b_uuid), (c, c_uuid) = waiting
    tokens = _line(r, name)
    assert [t[-1] for t in tokens] == [PROCESS_TOKEN_MARK] * 2, tokens
    assert [t.split(":")[0] for t in tokens] == [b_uuid, c_uuid]
    # Each process's channel for the lock has one subscriber: that process's subscription.
    for uuid in (b_uuid, c_uuid):
        channel = process_grant_channel(name, uuid)
        assert r.pubsub_numsub(channel) == [(channel.encode(), 1)]
    # Every grant channel of the lock, the shared one and each process's (a pattern
    # subscriber is not counted by NUMSUB, so the releases decide as they would without it).
    listener = r.pubsub()
    listener.psubscribe(grant_channel(name) + "*")
    assert listener.get_message(timeout=2)["type"] == "psubscribe"
    time.sleep(0.2)  # both parked on their grant

    holder.call(lock.unlock)
    b.expect("locked")
    assert _messages(listener) == [(process_grant_channel(name, b_uuid), tokens[0])]
    b.send("unlock")
    c.expect("locked")
    assert _messages(listener) == [(process_grant_channel(name, c_uuid), tokens[1])]
    c.send("unlock")
    c.expect("unlocked")
    assert _messages(listener) == []  # the last release frees it: no grant
    listener.close()
    assert not r.exists(name)


def test_a_sigkilled_asyncio_waiter_in_line_is_skipped_by_the_same_release(r, redis_server,
                                                                          holders, procs):
    """Its process's subscription died with it: the release finds nobody on its channel and
    grants the next in line at once, not after the dead one's grant lease."""
    name = "xak"
    lock, holder, waiting = _in_line_waiters(r, redis_server, holders, procs, name, 2)
    (dead, dead_uuid), (nxt, nxt_uuid) = waiting
    time.sleep(0.2)
    dead.kill()
    channel = process_grant_channel(name, dead_uuid)
    until(lambda: r.pubsub_numsub(channel) == [(channel.encode(), 0)],
          what="the dead process's subscription gone")
    assert in_line(r, name) == 2  # still in line in Redis: nobody withdrew it

    holder.call(lock.unlock)
    # Granted to the live waiter by that very release (no lease of the dead one's ran out).
    (field,) = r.hkeys(name)
    assert field.decode().startswith(nxt_uuid + ":")
    assert r.pttl(name) <= pubsub.GRANT_LEASE * 1000
    assert in_line(r, name) == 0
    nxt.expect("locked", timeout=pubsub.GRANT_LEASE)
    nxt.send("unlock")
    nxt.expect("unlocked")
    assert not r.exists(name)


def test_a_release_that_grants_puts_its_processs_next_waiter_in_line(r, redis_server, procs):
    """Task 2 holds, task 3 (same process) parks behind it without an attempt, a waiter of
    another process is in line. Task 2's release grants the lock to that waiter and puts task
    3 in line in the same script: task 3 then sends nothing until its grant reaches it."""
    name = "xar"

    async def main() -> None:
        ac = aredis.Redis(unix_socket_path=redis_server.socket)
        events = {k: asyncio.Event() for k in ("got1", "go1", "got2", "go2", "done2",
                                                "got3", "go3")}

        async def hold(n: int) -> str:
            lock = AsyncRLock(ac, name, sync_client=r)
            await lock.lock()
            events[f"got{n}"].set()
            await events[f"go{n}"].wait()
            owner = lock._field()
            await lock.unlock()
            if n == 2:
                events["done2"].set()
            return owner

        async def settle(cond, what: str) -> None:
            end = time.monotonic() + 10
            while not cond():
                assert time.monotonic() < end, what
                await asyncio.sleep(0.01)

        t1 = asyncio.create_task(hold(1))
        await events["got1"].wait()
        t2 = asyncio.create_task(hold(2))
        await settle(lambda: in_line(r, name) == 1, "task 2 in line")
        other = procs("wait_hold", redis_server.socket, name)
        other.expect("waiting")
        await settle(lambda: in_line(r, name) == 2, "the other process in line")
        t3 = asyncio.create_task(hold(3))
        await asyncio.sleep(0.3)
        assert in_line(r, name) == 2  # task 3 parks behind task 2, with no attempt

        events["go1"].set()  # task 1's release grants task 2 (ours)
        await events["got2"].wait()
        r.config_resetstat()
        events["go2"].set()  # task 2's release: the other process, and task 3 in line
        await events["done2"].wait()
        other.expect("locked")
        assert in_line(r, name) == 1
        (token,) = _line(r, name)
        await asyncio.sleep(0.3)
        assert script_calls(r) == 1  # task 2's release; task 3 sent nothing
        assert not events["got3"].is_set()

        other.send("unlock")  # its release grants task 3
        await events["got3"].wait()
        assert script_calls(r) == 2
        owner3 = r.hkeys(name)[0].decode()
        assert token.startswith(owner3 + "#")
        events["go3"].set()
        await asyncio.gather(t1, t2, t3)
        await ac.aclose()

    asyncio.run(main())
    assert not r.exists(name)


def _reserved_heir() -> tuple[HandOffs, Channel, Waiter, list[object]]:
    """This process's bookkeeping of one lock channel with one parked waiter, reserved as
    the heir of a release of ours (what ``Releasing._release_plan`` does)."""
    channels = Channels()
    handoffs = HandOffs(channels)
    ch = channels.by_name[b"chan"] = Channel(b"chan")
    booked: list[object] = []
    w = Waiter("key", HandOff("owner:1", 30_000, lambda *a: booked.append(a), token=b"owner:1#7p",
                              grant_ms=3_000))
    with channels.lock:
        ch.join(w)
        handoffs.join(ch, w)
    assert handoffs.reserve(b"chan", "key", lambda _ch: True) is w
    return handoffs, ch, w, booked


def test_a_heir_put_in_line_by_our_release_parks_on_registered_first_in_our_queue():
    handoffs, ch, w, booked = _reserved_heir()
    assert handoffs.resolve(b"chan", w, False, None, registered=True)
    assert w.state is State.QUEUED and w.registered and ch.queue[0] is w and ch.active == 0
    assert booked == []
    # Its grant, when it comes, is its own.
    handoffs.granted(b"chan", b"owner:1#7p")
    assert w.state is State.GRANTED and len(booked) == 1


def test_a_heir_granted_before_our_release_was_booked_takes_that_grant():
    """Our release put it in line, the next release (another process's) granted it at once,
    and that grant reached us before our own reply was booked: the grant is not dropped
    (the lock would sit for the grant lease)."""
    handoffs, ch, w, booked = _reserved_heir()
    assert handoffs.granted(b"chan", b"owner:1#7p") is None  # still reserved: kept
    assert handoffs.resolve(b"chan", w, False, None, registered=True)
    assert w.state is State.GRANTED and len(booked) == 1 and ch.active == 0


def test_a_waiter_parked_before_any_attempt_looks_again_within_a_grant_lease(
        r, redis_server, monkeypatch):
    """A release of its process may put such a waiter in line with an entry valid for a grant
    lease plus the slack (plus a grant lease): it must renew it by then, so its first park
    (behind a waiter of ours, here under a 30 s holder) lasts at most a grant lease."""
    monkeypatch.setattr(settings, "GRANT_LEASE", 0.3)
    name = "xafirst"

    async def main() -> None:
        ac = aredis.Redis(unix_socket_path=redis_server.socket)
        holder = AsyncRLock(ac, name, sync_client=r)
        await holder.lock()  # 30 s lease
        second = asyncio.ensure_future(AsyncRLock(ac, name, sync_client=r).try_lock(5))
        end = time.monotonic() + 5
        while in_line(r, name) < 1:
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        third = asyncio.ensure_future(AsyncRLock(ac, name, sync_client=r).try_lock(5))
        await asyncio.sleep(0.1)
        assert in_line(r, name) == 1  # it parks behind the second, with no attempt
        t0 = time.monotonic()
        while in_line(r, name) < 2:  # its own attempt puts it in line
            assert time.monotonic() - t0 < 2.0, "the first park outlived a grant lease"
            await asyncio.sleep(0.01)
        for t in (second, third):
            t.cancel()
        await asyncio.gather(second, third, return_exceptions=True)
        await holder.unlock()
        await ac.aclose()

    asyncio.run(main())


def test_a_grant_to_a_waiter_whose_loop_closed_wakes_another_waiter_when_it_lapses(
        r, redis_server, monkeypatch):
    """A loop closed under its waiter (its task never resumed, never withdrawn) and granted
    the lock by another process's release: nobody can take that grant, and its short lease
    ends unannounced. Another waiter of the process, on a live loop, asks again just after it
    (invariant 23), not at its own park bound (the old holder's 30 s here)."""
    monkeypatch.setattr(settings, "GRANT_LEASE", 0.5)
    monkeypatch.setattr(settings, "GRANT_WATCH", 0.6)
    name, other = "xaclosed", "another-process:7"
    key = RLock(r, name).key  # (the same key as the asyncio lock's)
    r.hset(key, other, 1)
    r.pexpire(key, 30_000)
    loop_a = asyncio.new_event_loop()
    ac_a = aredis.Redis(unix_socket_path=redis_server.socket)
    lock_a = AsyncRLock(ac_a, name, sync_client=r)

    async def a_in_line() -> None:
        assert not await lock_a.try_lock(0.3)  # (its process's subscription is confirmed)
        loop_a.create_task(lock_a.lock())
        while in_line(r, name) < 1:
            await asyncio.sleep(0.01)

    loop_a.run_until_complete(a_in_line())
    first = [t for t in r.hkeys(handoff_waiters(key)) if b"#" in t and not t.startswith(b"=")]
    assert len(first) == 1 and first[0].endswith(PROCESS_TOKEN_MARK.encode())
    out: dict[str, object] = {}

    async def b() -> None:
        ac = aredis.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ac, name, sync_client=r)

        async def take() -> None:
            await lock.lock()
            out["waited"] = time.monotonic() - t0
            await lock.unlock()

        task = asyncio.ensure_future(take())
        while in_line(r, name) < 2:
            await asyncio.sleep(0.01)
        loop_a.close()  # A's waiter is gone with its loop, still first in line
        keys = lock._release_keys  # another process's release of its hold
        t0 = time.monotonic()
        out["granted"] = r.evalsha(r.script_load(RELEASE_SCRIPT.source), len(keys), *keys,
                                   other, 30_000, "0", "", 0, 0, "", "", "another-process")
        await asyncio.wait_for(task, 40)
        await ac.aclose()

    asyncio.run(b())
    assert out["granted"] == first[0]  # the grant went to the closed loop's waiter
    assert out["waited"] < 5.0, out  # the grant's lease (0.5 s), then a look: not ~30 s
