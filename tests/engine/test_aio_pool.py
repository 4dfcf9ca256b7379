"""The asyncio side's connections (issue #23): a full pool is waited for, never a failure; an
idle connection the server closed (a restart) is replaced before a script is written to it."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio

from django_rlock import AsyncRLock
from django_rlock.engine import aiopool
from django_rlock.engine.aiopool import TwinPool
from django_rlock.engine.clients import async_twin


def test_two_acquires_with_a_server_restart_between_them_both_succeed(own_server):
    """The restart happens while the loop is blocked (the worst case: the loop never saw the
    EOF). The second acquire and release go out on a fresh connection: no request fails once
    the server is back, as on the sync path."""
    sync = own_server.client()

    async def main() -> None:
        for aclient in (async_twin(sync), redis.asyncio.Redis(unix_socket_path=own_server.socket)):
            lock = AsyncRLock(aclient, "restart", sync_client=sync)
            assert await lock.try_lock()
            await lock.unlock()
            own_server.restart()  # blocks the loop: its connections' EOF is not read yet
            assert await lock.try_lock()
            assert await lock.is_locked()
            await lock.unlock()
            assert not await lock.is_locked()

    asyncio.run(main())
    sync.close()


def test_the_twin_pool_takes_its_size_from_the_sync_pool_or_the_setting(redis_server, r,
                                                                        monkeypatch):
    async def cap(**kwargs) -> int:
        sync = redis.Redis(unix_socket_path=redis_server.socket, **kwargs)
        pool = async_twin(sync).connection_pool
        assert isinstance(pool, TwinPool)
        return pool.max_connections

    assert asyncio.run(cap(max_connections=7)) == 7
    assert asyncio.run(cap()) == 100  # redis-py's unbounded (or 100) default: 100
    monkeypatch.setattr(aiopool, "ASYNC_MAX_CONNECTIONS", 3)
    assert asyncio.run(cap(max_connections=7)) == 3


def test_many_tasks_on_a_small_pool_all_get_their_lock(own_server):
    sync = redis.Redis(unix_socket_path=own_server.socket, max_connections=2)
    r = own_server.client()

    async def main() -> list[bool]:
        aclient = async_twin(sync)

        async def one(i: int) -> bool:
            lock = AsyncRLock(aclient, f"small:{i}", sync_client=sync)
            got = await lock.try_lock()  # wait=0: one attempt, yet it waits for a connection
            await asyncio.sleep(0.001)
            await lock.unlock()
            return got

        got = await asyncio.gather(*(one(i) for i in range(200)))
        assert aclient.connection_pool.max_connections == 2
        return got

    assert asyncio.run(main()) == [True] * 200
    assert r.info("clients")["connected_clients"] <= 2 + 1 + 1 + 8  # + ours, the sync one's
    r.close()


def test_a_pool_full_past_the_budget_says_so(redis_server, r, monkeypatch):
    """Every connection taken and never given back: an acquire waits its budget (at least
    POOL_TIMEOUT), then a ConnectionError names the pool's size and the setting; one whose
    budget outlasts the shortage gets its connection and its lock."""
    monkeypatch.setattr(aiopool, "POOL_TIMEOUT", 0.3)
    sync = redis.Redis(unix_socket_path=redis_server.socket, max_connections=1)

    async def main() -> None:
        aclient = async_twin(sync)
        pool = aclient.connection_pool
        taken = await pool.get_connection()
        lock = AsyncRLock(aclient, "full", sync_client=sync)
        t0 = time.monotonic()
        with pytest.raises(redis.ConnectionError, match="all 1 in use.*ASYNC_MAX_CONNECTIONS"):
            await lock.try_lock()
        assert 0.25 < time.monotonic() - t0 < 5
        asyncio.get_running_loop().call_later(0.6, lambda: asyncio.ensure_future(
            pool.release(taken)))
        assert await lock.try_lock(wait_time=10)  # its budget outlasts the shortage
        await lock.unlock()

    asyncio.run(main())


def test_a_full_pool_serves_its_waiters_in_order_and_skips_those_that_left(redis_server, r):
    """One connection, taken; checkouts queue. One is cancelled while it waits; one is
    cancelled just after a release handed it the connection: it passes it on. Every freed
    connection goes to the oldest waiter still there, and none is lost."""
    sync = redis.Redis(unix_socket_path=redis_server.socket, max_connections=1)

    async def main() -> list[str]:
        pool = async_twin(sync).connection_pool
        taken = await pool.get_connection()
        order: list[str] = []

        async def checkout(name: str) -> None:
            conn = await pool.get_connection()
            try:
                order.append(name)
                await asyncio.sleep(0.01)
            finally:
                await pool.release(conn)

        tasks = {}
        for name in "abcd":
            tasks[name] = asyncio.ensure_future(checkout(name))
            await asyncio.sleep(0.01)  # in this order
        tasks["b"].cancel()  # leaves the line while it waits
        await asyncio.sleep(0.01)
        await pool.release(taken)  # handed to a ...
        tasks["a"].cancel()  # ... which leaves before it could run: on to c
        await asyncio.wait_for(tasks["c"], 10)
        await asyncio.wait_for(tasks["d"], 10)
        for name in "ab":
            with pytest.raises(asyncio.CancelledError):
                await tasks[name]
        again = await asyncio.wait_for(pool.get_connection(), 5)  # the one connection is back
        await pool.release(again)
        return order

    assert asyncio.run(main()) == ["c", "d"]


def test_a_loop_per_call_leaves_no_connection_behind(own_server):
    """Django runs an async view under WSGI in an event loop of its own per request: each
    loop's twin used to stay (it holds its loop, so the weak key never let go) with its
    connection open, one more per request, until the server's maxclients."""
    sync = own_server.client()
    admin = own_server.client()
    admin.ping()

    async def request(i: int) -> None:
        lock = AsyncRLock(async_twin(sync), f"loop:{i}", sync_client=sync)
        await lock.lock()
        await lock.unlock()

    for i in range(30):
        asyncio.run(request(i))
    # ours, the sync twin's (made by the lock's renewal side, if any), the last loop's twin
    assert admin.info("clients")["connected_clients"] <= 3
    sync.close()
    admin.close()

