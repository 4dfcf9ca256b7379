"""MultiLock / RedLock (and the asyncio twins) when a member fails rather than refuses.

Only a refusal (held elsewhere) is waited out. A member's server down, a wrong password or
WRONGTYPE at the key once counted as "not held": ``lock()`` spun forever, silently, and
``try_lock()`` said False as if the lock were busy (a user audit). Now the error propagates,
unchanged, once errors leave too few members to hold, and nothing is left on the servers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock import AsyncMultiLock, AsyncRedLock, AsyncRLock, MultiLock, RedLock, RLock
from django_rlock.testing import RedisServer

NO_RETRY: dict[str, Any] = {"socket_timeout": 5, "retry": Retry(NoBackoff(), 0)}


@pytest.fixture
def three() -> Iterator[list[RedisServer]]:
    """Three servers of the test's own: one is killed, one gets a password."""
    started = [RedisServer().start() for _ in range(3)]
    yield started
    for s in started:
        s.stop()
        shutil.rmtree(s.dir, ignore_errors=True)


def kill(server: RedisServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    server.proc = None


def with_password(server: RedisServer) -> None:
    server.client().config_set("requirepass", "secret")


def admin(server: RedisServer) -> redis.Redis:
    """A client that gets in whatever the fault (the right password if one is set)."""
    c = server.client(password="secret")
    try:
        c.ping()
    except redis.AuthenticationError:
        c = server.client()
    return c


def failing(three: list[RedisServer], fault: str) -> int:
    """Make the last server fail the way named; the index of the failing member."""
    if fault == "down":
        kill(three[2])
    elif fault == "password":
        with_password(three[2])
    else:
        admin(three[2]).set("m", "a cache value")  # not a lock: WRONGTYPE for the scripts
    return 2


def sync_members(three: list[RedisServer], fault: str) -> list[RLock]:
    return [RLock(s.client(**NO_RETRY, **({"password": "wrong"} if fault == "password" and i == 2
                                          else {})), "m") for i, s in enumerate(three)]


def left(three: list[RedisServer], fault: str) -> list[Any]:
    """What is at ``m`` on each live server (the failing one's cache value stays its own)."""
    out = []
    for i, s in enumerate(three):
        if fault == "down" and i == 2:
            continue
        out.append(admin(s).get("m") if admin(s).type("m") == b"string" else admin(s).exists("m"))
    return out


ERRORS = {"down": redis.ConnectionError, "password": redis.AuthenticationError,
          "wrongtype": redis.ResponseError}
FAULTS = sorted(ERRORS)
#: redis.asyncio reports a wrong password as the ConnectionError (AuthenticationError's base).
ASYNC_ERRORS = {**ERRORS, "password": redis.ConnectionError}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_multilock_member_that_fails_raises_its_error_and_leaves_nothing(three, holders, fault):
    failing(three, fault)
    multi = MultiLock(*sync_members(three, fault))
    t0 = time.monotonic()
    # lock() once spun here forever: run it where a hang is a failure, not a stuck suite.
    with pytest.raises(ERRORS[fault]) as err:
        holders().submit(multi.lock)(15)
    assert "member 2 'm' failed with this error" in "".join(err.value.__notes__)
    with pytest.raises(ERRORS[fault]):
        multi.try_lock(wait_time=5)  # not False after 5 s, as if the lock were busy
    with pytest.raises(ERRORS[fault]):
        multi.try_lock()
    assert time.monotonic() - t0 < 4
    # The first two were taken before the third failed: given back each time.
    assert left(three, fault)[:2] == [0, 0]
    if fault == "wrongtype":
        assert admin(three[2]).get("m") == b"a cache value"  # never touched


@pytest.mark.parametrize("fault", FAULTS)
def test_a_redlock_tolerates_one_failing_member_of_three(three, holders, fault):
    failing(three, fault)
    red = RedLock(*sync_members(three, fault))
    assert red.try_lock(wait_time=1) is True and red.is_held_by_current_thread()
    assert holders().call(lambda: RedLock(*sync_members(three, fault)).try_lock()) is False
    red.unlock()  # the failing member's error is the minority's
    assert left(three, fault)[:2] == [0, 0]
    red.lock()  # lock() too
    red.unlock()


def test_a_redlock_whose_failures_leave_no_majority_raises_and_leaves_nothing(three, holders):
    admin(three[1]).set("m", "a cache value")
    kill(three[2])
    members = [RLock(s.client(**NO_RETRY), "m") for s in three]
    red = RedLock(*members)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE") as err:
        holders().submit(red.lock)(15)
    notes = "".join(err.value.__notes__)
    assert "member 1 'm' failed with this error; so did member 2 'm' (ConnectionError" in notes
    with pytest.raises(redis.ResponseError):
        red.try_lock(wait_time=5)
    assert not admin(three[0]).exists("m")  # the one it took, given back


def test_a_redlock_refused_by_one_with_one_down_waits_as_for_a_busy_lock(three, holders):
    """Errors alone leave a majority possible: the refusal decides, so it is "busy"."""
    h = holders()
    h.call(RLock(three[0].client(), "m").lock)  # someone else's
    kill(three[2])
    red = RedLock(*(RLock(s.client(**NO_RETRY), "m") for s in three))
    assert red.try_lock(wait_time=0.3) is False
    assert not admin(three[1]).exists("m")
    h.call(RLock(three[0].client(), "m").unlock)
    assert red.try_lock(wait_time=1) is True
    red.unlock()


def async_members(three: list[RedisServer], fault: str) -> list[AsyncRLock]:
    out = []
    for i, s in enumerate(three):
        kw = {**NO_RETRY, **({"password": "wrong"} if fault == "password" and i == 2 else {})}
        out.append(AsyncRLock(redis.asyncio.Redis(unix_socket_path=s.socket, **kw), "m",
                              sync_client=s.client(**kw)))
    return out


@pytest.mark.parametrize("fault", FAULTS)
def test_an_async_multilock_member_that_fails_raises_and_an_async_redlock_tolerates_it(
        three, fault):
    failing(three, fault)

    async def main() -> None:
        multi = AsyncMultiLock(*async_members(three, fault))
        with pytest.raises(ASYNC_ERRORS[fault]) as err:
            async with asyncio.timeout(15):  # once: forever
                await multi.lock()
        assert "member 2 'm' failed with this error" in "".join(err.value.__notes__)
        t0 = time.monotonic()
        with pytest.raises(ASYNC_ERRORS[fault]):
            await multi.try_lock(wait_time=5)
        assert time.monotonic() - t0 < 4
        assert left(three, fault)[:2] == [0, 0]
        red = AsyncRedLock(*async_members(three, fault))
        assert await red.try_lock(wait_time=1) is True
        assert await red.is_held_by_current_task()
        await red.unlock()
        assert left(three, fault)[:2] == [0, 0]

    asyncio.run(main())


def test_an_async_redlock_whose_failures_leave_no_majority_raises(three):
    admin(three[1]).set("m", "a cache value")
    kill(three[2])

    async def main() -> None:
        red = AsyncRedLock(*async_members(three, "none"))
        with pytest.raises((redis.ResponseError, redis.ConnectionError)) as err:
            async with asyncio.timeout(15):
                await red.lock()
        notes = "".join(err.value.__notes__)
        assert "failed with this error; so did member" in notes
        assert not admin(three[0]).exists("m")

    asyncio.run(main())
