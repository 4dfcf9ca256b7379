"""MultiLock (all of N servers) and RedLock (a majority), on independent redis-servers."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine.multi import MultiLock, MultiLockError, RedLock
from django_rlock.testing import RedisServer

ROOT = Path(__file__).parents[2]


@pytest.fixture
def servers() -> Iterator[list[RedisServer]]:
    """Five servers of the test's own (tests kill and restart them)."""
    started = [RedisServer().start() for _ in range(5)]
    yield started
    for s in started:
        s.stop()
        shutil.rmtree(s.dir, ignore_errors=True)


def clients(servers: list[RedisServer]) -> list[redis.Redis]:
    # No client-side retries: a dead server answers "refused" at once instead of after backoff.
    return [s.client(socket_timeout=5, retry=Retry(NoBackoff(), 0)) for s in servers]


def members(cs: list[redis.Redis], name: str = "m") -> list[RLock]:
    return [RLock(c, name) for c in cs]


def kill(server: RedisServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    server.proc = None


def test_multilock_is_all_or_nothing(servers, holders):
    cs = clients(servers[:3])
    multi = MultiLock(*members(cs))
    other = holders()
    other.call(members(cs)[1].lock)  # someone holds the middle one
    assert multi.try_lock() is False
    assert not cs[0].exists("m") and not cs[2].exists("m")  # what it took, it gave back
    other.call(members(cs)[1].unlock)
    assert multi.try_lock() is True
    assert all(c.exists("m") for c in cs) and multi.is_held_by_current_thread()
    assert holders().call(lambda: MultiLock(*members(cs)).try_lock(wait_time=0.2)) is False
    multi.unlock()
    assert not any(c.exists("m") for c in cs)
    with pytest.raises(LockNotOwnedError):
        multi.unlock()


def test_multilock_waits_within_its_budget_and_gets_all(servers, holders):
    cs = clients(servers[:3])
    h = holders()
    h.call(members(cs)[2].lock)
    h.submit(lambda: (time.sleep(0.3), members(cs)[2].unlock()))
    start = time.monotonic()
    multi = MultiLock(*members(cs))
    assert multi.try_lock(wait_time=5, lease_time=10) is True
    assert time.monotonic() - start < 4
    # Every member got the lease from the moment the whole lock was held.
    assert all(9_000 < c.pttl("m") <= 10_000 for c in cs)
    multi.unlock()


def test_multilock_excludes_across_4_processes(servers):
    socks = [s.socket for s in servers[:3]]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine._multi_proc", "multi", "15",
                               *socks], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "done" in out
    c0 = servers[0].client()
    assert int(c0.get("counter")) == 4 * 15
    assert not any(s.client().exists("multi:counter") for s in servers[:3])


def test_multilock_with_a_member_down_raises_its_error_and_holds_nothing(servers):
    cs = clients(servers[:3])
    kill(servers[1])
    multi = MultiLock(*members(cs))
    with pytest.raises(redis.ConnectionError):  # an error, not "busy" (test_multi_errors.py)
        multi.try_lock()
    with pytest.raises(redis.ConnectionError):
        multi.try_lock(wait_time=0.3)
    assert not cs[0].exists("m") and not cs[2].exists("m")


def test_redlock_survives_two_of_five_down_and_excludes(servers, holders):
    cs = clients(servers)
    kill(servers[0])
    kill(servers[3])
    red = RedLock(*members(cs))
    assert red.quorum == 3
    assert red.try_lock(wait_time=1) is True and red.is_held_by_current_thread()
    assert holders().call(lambda: RedLock(*members(cs)).try_lock(wait_time=0.3)) is False
    red.unlock()  # the dead members' failures are the minority's: ignored
    assert not any(c.exists("m") for i, c in enumerate(cs) if i not in (0, 3))
    assert holders().call(lambda: RedLock(*members(cs)).try_lock(wait_time=0.3)) is True


def test_redlock_with_three_down_raises_and_holds_nothing(servers):
    cs = clients(servers)
    for i in (0, 2, 4):
        kill(servers[i])
    red = RedLock(*members(cs))
    with pytest.raises(redis.ConnectionError):  # a majority down: no wait mends it
        red.try_lock(wait_time=0.3)
    assert not cs[1].exists("m") and not cs[3].exists("m")


def test_a_server_restarting_empty_does_not_let_a_second_holder_in(servers, holders):
    cs = clients(servers)
    first = holders()
    first.call(RedLock(*members(cs)).lock)
    servers[2].restart()  # the lock is gone from one of five
    rival = holders().call(lambda: RedLock(*members(cs)).try_lock(wait_time=0.5))
    assert rival is False  # it can take one member at most: no majority
    assert first.call(lambda: RedLock(*members(cs)).is_held_by_current_thread())
    first.call(RedLock(*members(cs)).unlock)


def test_redlock_with_no_validity_left_is_undone(servers):
    cs = clients(servers[:3])
    red = RedLock(*members(cs))
    assert red.try_lock(lease_time=0.001) is False  # drift alone exceeds the lease
    assert not any(c.exists("m") for c in cs)


def test_a_lost_member_makes_the_multilock_lost_once(servers):
    cs = clients(servers[:3])
    lost: list[str] = []
    multi = MultiLock(*(RLock(c, "m", watchdog_timeout=0.6) for c in cs), on_lost=lost.append)
    multi.lock()
    cs[1].delete("m")
    deadline = time.monotonic() + 3
    while not lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lost == ["m"] and multi.is_lost()
    with pytest.raises(MultiLockError) as err:
        multi.unlock()  # the others are released; the lost one is reported
    assert not cs[0].exists("m") and not cs[2].exists("m")
    assert list(err.value.failures) == [1] and "member 1 'm'" in str(err.value)


def test_bad_input(servers):
    cs = clients(servers[:2])
    with pytest.raises(ValueError):
        MultiLock()
    with pytest.raises(TypeError):
        MultiLock("not a lock")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twice"):
        MultiLock(RLock(cs[0], "a"), RLock(cs[0], "a"))
    with pytest.raises(ValueError, match="wait_time"):
        MultiLock(*members(cs)).try_lock(wait_time=-1)
    with pytest.raises(ValueError, match="lease_time"):
        RedLock(*members(cs)).try_lock(lease_time=0)
    assert not any(c.exists("m") for c in cs)


def test_a_dead_server_never_delays_renewals_on_the_others(servers):
    """redis-py's default retries make a dead server cost seconds per renewal attempt; renewals
    of other servers' locks go on beside it, never behind it."""
    doomed = RLock(servers[0].client(), "a", watchdog_timeout=1.5)  # default client retries
    kept = RLock(servers[1].client(), "b", watchdog_timeout=1.5)
    doomed.lock()
    kept.lock()
    kill(servers[0])
    time.sleep(4)  # more than two leases
    assert servers[1].client().exists("b") and not kept.is_lost()
    kept.unlock()
    assert doomed.is_lost()


def test_a_dead_thread_s_lock_on_a_dead_server_never_delays_renewals_on_the_others(servers):
    """The release of an ended thread's hold goes to its server like a renewal does: beside
    the others, not on the sweep. CI saw the sweep wait out redis-py's retries (seconds) on a
    server a failed test had left dead, and a 1 s lease elsewhere in the process expired."""
    import threading

    kept = RLock(servers[1].client(), "b", watchdog_timeout=1.5)
    kept.lock()
    held, end = threading.Event(), threading.Event()

    def owner() -> None:  # a live thread while the server dies, then ended holding the lock
        RLock(servers[0].client(), "a", watchdog_timeout=1.5).lock()  # default client retries
        held.set()
        end.wait()

    t = threading.Thread(target=owner)
    t.start()
    assert held.wait(10)
    kill(servers[0])
    end.set()
    t.join()
    time.sleep(4)  # the sweep finds the ended thread; its release costs seconds of retries
    assert servers[1].client().exists("b") and not kept.is_lost()
    kept.unlock()


def test_async_multilock_takes_its_members_concurrently_as_the_calling_task(servers):
    import asyncio

    import redis.asyncio

    from django_rlock import AsyncMultiLock, AsyncRedLock, AsyncRLock

    async def main():
        acs = [redis.asyncio.Redis(unix_socket_path=s.socket) for s in servers[:3]]
        multi = AsyncMultiLock(*(AsyncRLock(c, "am") for c in acs))
        await multi.try_lock()  # warm: subscriptions, scripts
        await multi.unlock()
        for s in servers[:3]:
            s.client().client_pause(400)  # every member answers 0.4 s late
        start = time.monotonic()
        assert await multi.try_lock(wait_time=5) is True
        took = time.monotonic() - start
        # The holds are this task's: reentrant here, not another task's to release.
        assert await multi.is_held_by_current_task()
        assert all([await m.hold_count() for m in multi.locks])

        async def other() -> None:
            with pytest.raises(LockNotOwnedError):
                await AsyncMultiLock(*(AsyncRLock(c, "am") for c in acs)).unlock()
            assert await AsyncMultiLock(*(AsyncRLock(c, "am") for c in acs)).try_lock() is False

        await asyncio.create_task(other())
        await multi.unlock()
        assert not any([await c.exists("am") for c in acs])
        red = AsyncRedLock(*(AsyncRLock(c, "ar") for c in acs))
        async with red:
            assert await red.is_held_by_current_task()
        for c in acs:
            await c.aclose()
        return took

    took = asyncio.run(main())
    assert took < 1.0, took  # one paused round trip of wall time, not three (1.2 s)


def test_a_lease_never_cuts_a_watchdog_hold_the_caller_already_had(servers):
    cs = clients(servers[:3])
    outer = RLock(cs[0], "m")
    outer.lock()  # watchdog mode
    multi = MultiLock(*members(cs))
    assert multi.try_lock(wait_time=1, lease_time=0.3) is True  # 2x wait, then cut to 0.3 s
    assert cs[0].pttl("m") > 20_000  # the reentered member keeps its watchdog lease
    assert all(0 < c.pttl("m") <= 300 for c in cs[1:])
    time.sleep(0.5)
    assert cs[0].exists("m") and not cs[1].exists("m") and not cs[2].exists("m")
    with pytest.raises(MultiLockError) as err:
        multi.unlock()  # the two leases ran out: reported, the reentry undone
    assert sorted(err.value.failures) == [1, 2]
    assert outer.hold_count() == 1 and not outer.is_lost()
    outer.unlock()


def test_redlock_unlock_ignores_a_minority_only(servers):
    cs = clients(servers[:3])
    red = RedLock(*members(cs))
    red.lock()
    cs[0].delete("m")
    red.unlock()  # one of three gone: ignored
    red.lock()
    cs[0].delete("m")
    cs[2].delete("m")
    with pytest.raises(MultiLockError) as err:
        red.unlock()  # a majority gone: the caller must know
    assert sorted(err.value.failures) == [0, 2]
    assert not cs[1].exists("m")
    with pytest.raises(LockNotOwnedError):
        red.unlock()


def _async_members(servers: list[RedisServer], name: str) -> list[Any]:
    import redis.asyncio

    from django_rlock import AsyncRLock

    return [AsyncRLock(redis.asyncio.Redis(unix_socket_path=s.socket, socket_timeout=5,
                                           retry=Retry(NoBackoff(), 0)), name,
                       sync_client=s.client(socket_timeout=5, retry=Retry(NoBackoff(), 0)))
            for s in servers]


def test_async_multilock_gives_back_what_it_took_on_failure_and_cancellation(servers, holders):
    from django_rlock import AsyncMultiLock

    cs = clients(servers[:3])
    holders().call(members(cs)[1].lock)  # the middle member is someone else's

    async def main() -> None:
        multi = AsyncMultiLock(*_async_members(servers[:3], "m"))
        start = time.monotonic()
        assert await multi.try_lock(wait_time=0.4) is False
        assert 0.35 < time.monotonic() - start < 2
        assert not cs[0].exists("m") and not cs[2].exists("m")
        # Cancelled while the busy member waits: the others are given back first.
        attempt = asyncio.ensure_future(multi.try_lock(wait_time=10))
        await asyncio.sleep(0.3)
        assert cs[0].exists("m") and cs[2].exists("m")  # taken concurrently, not one by one
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
        assert not cs[0].exists("m") and not cs[2].exists("m")

    asyncio.run(main())
    kill(servers[2])  # a member down: its error at once, nothing left on the others

    async def down() -> None:
        multi = AsyncMultiLock(*_async_members(servers[:3], "d"))
        with pytest.raises(redis.ConnectionError):
            await multi.try_lock(wait_time=0.3)
        assert not cs[0].exists("d") and not cs[1].exists("d")
        with pytest.raises(TypeError, match="async with"):
            with multi:
                pass

    asyncio.run(down())


def test_async_redlock_does_not_wait_out_a_busy_minority(servers, holders):
    from django_rlock import AsyncRedLock

    cs = clients(servers)
    holders().call(members(cs)[4].lock)  # one of five is someone else's
    kill(servers[3])  # and one is down

    async def main() -> float:
        red = AsyncRedLock(*_async_members(servers, "m"))
        start = time.monotonic()
        assert await red.try_lock(wait_time=10, lease_time=5) is True
        took = time.monotonic() - start
        assert await red.is_held_by_current_task()
        assert all(c.exists("m") for c in cs[:3])
        assert all(0 < c.pttl("m") <= 5_000 for c in cs[:3])  # cut from 2x wait to the lease
        await red.unlock()  # the busy and the dead member's failures are the minority's
        assert not any(c.exists("m") for c in cs[:3])
        return took

    assert asyncio.run(main()) < 2  # not the 10 s budget the busy member could wait
