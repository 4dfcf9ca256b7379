"""Wake lines: a thread that has waited before hears a grant on a subscription of its own.

The release publishes the grant on the heir's own channel only (no other process is woken),
and a heir whose process died is found by nobody hearing it: the next in line is granted at
once. Waiters in other processes are real processes (``_handoff_proc``).
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from django_rlock import RLock
from django_rlock.engine import identity, pubsub, wakeline
from django_rlock.engine.naming import grant_channel, wake_channel
from tests.conftest import script_calls
from tests.engine.test_handoff import (  # noqa: F401  (procs: a fixture)
    a_foreign_release_wakes_our_waiter,
    in_line,
    procs,
    until,
)


def numsub(r: redis.Redis, channel: str) -> int:
    return int(r.pubsub_numsub(channel)[0][1])


def wake_connections(r: redis.Redis) -> list[dict]:
    return [c for c in r.client_list() if c.get("name", "").startswith("rlock-wake:")]


def lined_waiter_in_line(r, redis_server, holders, procs, name: str):  # noqa: F811
    """A thread of ours holds ``name``; a process whose thread has a wake line waits in line.
    (lock, holder, waiter process, its wake channel)"""
    lock = RLock(r, name)
    holder = holders()
    holder.call(lock.lock)
    waiter = procs("wait_hold", redis_server.socket, name, "", "30", "line")
    channel = waiter.expect("waiting").split()[1]
    until(lambda: in_line(r, name) == 1, what="the waiter in line")
    time.sleep(0.3)  # parked on its line
    return lock, holder, waiter, channel


def test_the_grant_reaches_the_heir_alone_and_costs_no_command(r, redis_server, holders,
                                                               procs):  # noqa: F811
    lock, holder, waiter, channel = lined_waiter_in_line(r, redis_server, holders, procs, "wl")
    assert numsub(r, channel) == 1
    (token,) = [f for f in r.hkeys("rlock_handoff_waiters:{wl}") if b"#" in f]
    assert token.endswith(b"w")  # registered as a waiter with a line of its own
    spy = r.pubsub()  # hears what every django-rlock process's subscription would hear
    spy.subscribe(grant_channel("wl"))
    assert spy.get_message(timeout=2)["type"] == "subscribe"
    r.config_resetstat()
    holder.call(lock.unlock)
    waiter.expect("locked", timeout=5)
    assert script_calls(r) == 1  # the release; the heir took the lock without a command
    assert spy.get_message(timeout=0.5) is None  # no other process was woken by the grant
    stats = r.info("commandstats")
    assert stats.get("cmdstat_publish", {}).get("calls") == 1  # the one on its own channel
    waiter.send("unlock")
    waiter.expect("unlocked")
    assert not r.exists("wl")
    spy.close()


def test_a_sigkilled_heir_with_a_line_is_skipped_at_once(r, redis_server, holders,
                                                        procs):  # noqa: F811
    """Its subscription died with it: the release finds nobody on its channel and grants the
    next in line straight away, not after a grant lease."""
    lock, holder, dead, channel = lined_waiter_in_line(r, redis_server, holders, procs, "wk")
    nxt = holders().submit(lambda: (RLock(r, "wk").try_lock(wait_time=20), time.monotonic()))
    until(lambda: in_line(r, "wk") == 2, what="the second waiter in line")
    dead.kill()
    until(lambda: numsub(r, channel) == 0, what="the dead heir's subscription gone")
    time.sleep(0.2)
    t0 = time.monotonic()
    holder.call(lock.unlock)
    ok, when = nxt(30)
    assert ok
    assert when - t0 < pubsub.GRANT_LEASE / 3, when - t0
    assert in_line(r, "wk") == 0  # the dead one's entry went with the skip


def test_a_lost_line_is_reopened_and_its_waiter_put_back_in_line(r, redis_server, holders,
                                                                 procs):  # noqa: F811
    lock, holder, waiter, channel = lined_waiter_in_line(r, redis_server, holders, procs, "wr")
    (conn,) = [c for c in wake_connections(r) if c["name"].endswith(channel.split(":")[1])]
    r.client_kill_filter(_id=conn["id"])
    until(lambda: numsub(r, channel) == 1, what="the line reopened")
    until(lambda: in_line(r, "wr") == 1, what="the waiter back in line")
    time.sleep(0.2)
    t0 = time.monotonic()
    holder.call(lock.unlock)
    waiter.expect("locked", timeout=10)
    # Granted through its new line; without the reopen the grant would have skipped it and it
    # would sleep until the holder's 30 s lease.
    assert time.monotonic() - t0 < 2.0
    waiter.send("unlock")
    waiter.expect("unlocked")


def test_a_lined_thread_is_woken_by_our_release_and_by_a_foreign_one(r, holders):
    """A thread parked on its line hears this process's own grants (the releasing thread books
    them and pokes it) and a foreign client's "0" (the listener pokes it)."""
    waiter = holders()
    lock = RLock(r, "wt")
    assert waiter.call(lambda: wakeline.open_line(r, identity.thread_owner())) is not None
    holder = holders()
    held = RLock(r, "wt")
    holder.call(held.lock)
    got = waiter.submit(lambda: (lock.try_lock(wait_time=20), time.monotonic()))
    until(lambda: in_line(r, "wt") == 1, what="the lined waiter in line")
    time.sleep(0.3)
    t0 = time.monotonic()
    holder.call(held.unlock)
    ok, when = got(10)
    assert ok and when - t0 < 2.0
    assert waiter.call(lambda: wakeline.line_for(r, identity.thread_owner())) is not None
    waiter.call(lock.unlock)
    # A Redisson client holds it; its release (del + "0") wakes our lined thread.
    a_foreign_release_wakes_our_waiter(r, "wt",
                                       lambda: waiter.submit(lambda: lock.try_lock(wait_time=20)))
    waiter.call(lock.unlock)


def test_a_line_closes_when_its_thread_ends(r):
    out = []

    def body() -> None:
        out.append(wake_channel(identity.thread_owner()))
        assert wakeline.open_line(r, identity.thread_owner()) is not None

    t = threading.Thread(target=body)
    t.start()
    t.join()
    (channel,) = out
    until(lambda: numsub(r, channel) == 0, what="the ended thread's line closed")


def test_a_process_opens_at_most_max_lines(r, holders, monkeypatch):
    first, second = holders(), holders()
    assert first.call(lambda: wakeline.open_line(r, identity.thread_owner())) is not None
    monkeypatch.setattr(wakeline, "MAX_LINES", wakeline.open_count())
    assert second.call(lambda: wakeline.open_line(r, identity.thread_owner())) is None
    assert numsub(r, wake_channel(second.call(identity.thread_owner))) == 0


def test_lines_can_be_turned_off(r, holders, monkeypatch):
    monkeypatch.setattr(wakeline, "ENABLED", False)
    waiter = holders()
    before = len(wake_connections(r))
    assert waiter.call(lambda: wakeline.open_line(r, identity.thread_owner())) is None
    assert len(wake_connections(r)) == before
    assert numsub(r, wake_channel(waiter.call(identity.thread_owner))) == 0


def test_a_stray_poke_never_makes_a_parked_thread_spin(r, holders):
    """A poke can land its byte after the pipe was drained for it (its waiter saw ``pending``
    first): that byte, left over, must be read by the next park, not make it spin."""
    import os

    def body() -> float:
        line = wakeline.open_line(r, identity.thread_owner())
        assert line is not None
        os.write(line._wfd, b"x")  # the late byte, its flag already cleared
        w = pubsub.Waiter(handoff=pubsub.HandOff("", 0, line=line))
        t0, c0 = time.monotonic(), time.thread_time()
        line.park(w, 0.5, lambda token: None)
        assert time.monotonic() - t0 >= 0.45  # slept its timeout: nobody woke it
        return time.thread_time() - c0

    assert holders().call(body) < 0.2


def test_a_line_past_select_s_fd_limit_still_parks(r, holders):
    """A busy process (many sockets) gets file descriptors past 1024, where select() refuses
    to work: the line must still sleep its timeout on the same connection."""
    import os
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"RLIMIT_NOFILE is {soft}")
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        def body() -> tuple[float, bool, int]:
            line = wakeline.open_line(r, identity.thread_owner())
            assert line is not None and line.conn._sock.fileno() > 1024
            conn = line.conn
            t0 = time.monotonic()
            line.park(pubsub.Waiter(handoff=pubsub.HandOff("", 0, line=line)), 0.3, lambda token: None)
            return time.monotonic() - t0, line.conn is conn, line.conn._sock is not None

        slept, same, alive = holders().call(body)
        assert slept >= 0.25 and same and alive
    finally:
        for fd in filler:
            os.close(fd)
