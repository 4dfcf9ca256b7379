"""The asyncio hot path (issue #22): an uncontended pair costs the server what the sync pair
costs, its scripts go out from the calling task (no task per script), and a cancellation that
lands after a script was written still never cuts the round trip in half (invariant 8)."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest
import redis.asyncio

from django_rlock import AsyncRLock, RLock
from django_rlock.engine.clients import async_twin
from django_rlock.engine.watchdog import watchdog

PAIRS = 50


def commands(r) -> dict[str, int]:
    """Server commands so far, by name, without the test's own INFO and CONFIG."""
    stats = r.info("commandstats")
    return {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items()
            if k not in ("cmdstat_info", "cmdstat_config|resetstat")}


def per_pair(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    return {k: (after.get(k, 0) - before.get(k, 0)) / PAIRS for k in after
            if after.get(k, 0) != before.get(k, 0)}


@pytest.mark.parametrize("twin", [False, True], ids=["redis.asyncio client", "asyncio twin"])
def test_an_uncontended_async_pair_runs_what_the_sync_pair_runs(redis_server, r, twin):
    """Two EVALSHA and the commands inside them, exactly the sync pair's: no replica probe,
    no PING, no pool check that reaches the server, nothing sent twice."""
    sync = RLock(r, "fast:sync")
    for _ in range(5):
        sync.lock()
        sync.unlock()
    before = commands(r)
    for _ in range(PAIRS):
        sync.lock()
        sync.unlock()
    sync_pair = per_pair(before, commands(r))

    async def main() -> dict[str, float]:
        client = async_twin(r) if twin else redis.asyncio.Redis(
            unix_socket_path=redis_server.socket)
        lock = AsyncRLock(client, "fast:async", sync_client=r)
        for _ in range(5):  # the replica probe (INFO + WAIT 0 0) and connections: once
            await lock.lock()
            await lock.unlock()
        start = commands(r)
        for _ in range(PAIRS):
            await lock.lock()
            await lock.unlock()
        out = per_pair(start, commands(r))
        await client.aclose()
        return out

    async_pair = asyncio.run(main())
    assert async_pair["evalsha"] == 2
    assert async_pair == sync_pair
    assert sum(async_pair.values()) == 12  # 2 EVALSHA + 10 inside (docs/engine.md)


def test_an_uncontended_async_pair_starts_no_task(redis_server, r):
    """A task per script (what ``asyncio.shield`` needs) cost about 30 us a pair; the hot path
    sends from the calling task and only a cancellation starts one."""

    async def main() -> int:
        client = redis.asyncio.Redis(unix_socket_path=redis_server.socket, socket_timeout=5)
        lock = AsyncRLock(client, "fast:tasks", sync_client=r)
        await lock.lock()
        await lock.unlock()
        started = 0
        loop = asyncio.get_running_loop()

        def factory(loop, coro, **kwargs):
            nonlocal started
            started += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        for _ in range(PAIRS):
            await lock.lock()
            await lock.unlock()
        loop.set_task_factory(None)
        await client.aclose()
        return started

    assert asyncio.run(main()) == 0


def test_a_release_cancelled_after_it_was_written_is_booked_when_it_lands(own_server):
    """The release waits in the server (CLIENT PAUSE); the caller is cancelled meanwhile. The
    release still runs, and the process books it: the hold is not renewed behind it."""
    admin = own_server.client()
    ar = redis.asyncio.Redis(unix_socket_path=own_server.socket)

    async def main() -> None:
        lock = AsyncRLock(ar, "fast:cut", sync_client=admin)
        await lock.lock()
        await lock.unlock()
        await lock.lock()
        k = (lock.server, lock.key, lock.current_owner())
        assert watchdog().get(k) is not None
        admin.client_pause(600, all=False)  # the release waits in the server
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await lock.unlock()
        await asyncio.sleep(1.2)
        assert not admin.exists("fast:cut")
        assert watchdog().get(k) is None  # booked: nothing renews it
        assert await lock.try_lock()  # the connection was not left out of step
        await lock.unlock()
        await ar.aclose()

    asyncio.run(main())
    admin.close()


def test_an_acquire_cancelled_before_it_was_written_sends_nothing(redis_server, r):
    """A cancellation while the pool has no connection free: nothing was written, so nothing
    ran and nothing needs undoing."""

    async def main() -> None:
        from django_rlock.engine.aiopool import TwinPool

        pool = TwinPool(1, path=redis_server.socket,
                        connection_class=redis.asyncio.UnixDomainSocketConnection)
        client = redis.asyncio.Redis(connection_pool=pool)
        lock = AsyncRLock(client, "fast:pre", sync_client=r, sync_replicas=None)
        conn = await pool.get_connection()  # the only connection, taken
        r.config_resetstat()
        task = asyncio.ensure_future(lock.lock())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await pool.release(conn)
        await asyncio.sleep(0.2)
        assert r.info("commandstats").get("cmdstat_evalsha") is None
        assert not r.exists("fast:pre")
        await client.aclose()

    asyncio.run(main())


def test_the_connection_kept_for_lock_scripts_is_the_pools_and_closes_with_it(redis_server, r):
    """One connection serves a task's pairs (not one per script), it is counted by the pool,
    a second task running meanwhile borrows another, and ``aclose()`` closes them all."""

    def clients() -> int:
        return sum(1 for c in r.client_list() if c.get("name") == "fast-kept")

    async def main() -> None:
        base = 0
        client = redis.asyncio.Redis(unix_socket_path=redis_server.socket, client_name="fast-kept")
        lock = AsyncRLock(client, "fast:kept", sync_client=r, sync_replicas=None)
        for _ in range(PAIRS):
            await lock.lock()
            await lock.unlock()
        assert clients() == base + 1

        async def other(name: str) -> None:
            other_lock = AsyncRLock(client, name, sync_client=r, sync_replicas=None)
            for _ in range(20):
                await other_lock.lock()
                await asyncio.sleep(0)
                await other_lock.unlock()

        await asyncio.gather(other("fast:a"), other("fast:b"))
        assert not r.exists("fast:a") and not r.exists("fast:b")
        assert clients() >= base + 2  # the kept one was busy: the pool lent another
        await client.aclose()
        deadline = time.monotonic() + 5  # the server reads the closes when it gets to them
        while clients() != base and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert clients() == base

    asyncio.run(main())


def test_a_cancellation_while_the_connection_is_made_is_never_lost(redis_server, r):
    """The acquire connects in the calling task; redis-py's handshake write runs under
    ``asyncio.wait_for``, which on Python 3.11 returns normally when the task is cancelled
    just as the write ends. Cancelled at every step of the first acquire on a new client, the
    task must end cancelled, holding nothing (it once went on as if never cancelled: a fair
    lock's cancelled waiter stayed in line)."""
    async def one(step: int) -> str:
        client = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(client, f"cut:{step}", sync_client=r)
        got: list[bool] = []

        async def work() -> None:
            await lock.lock()
            got.append(True)
            await asyncio.Event().wait()  # holds until cancelled

        task = asyncio.create_task(work())
        for _ in range(step):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        await asyncio.sleep(0.05)  # a give-back of an acquire cut mid-way lands
        try:
            if not done:
                task.cancel()  # (the cancellation was lost: end it for the report)
                return "lost"
            assert task.cancelled()
            return "held" if r.exists(f"cut:{step}") else "ok"
        finally:
            await client.aclose()

    for step in range(40):
        assert asyncio.run(one(step)) == "ok", f"cancelled after {step} loop steps"



def test_a_script_is_packed_byte_for_byte_as_redis_py_packs_it():
    """The hot path packs its own EVALSHA (``aiopool.packed``): the same bytes as redis-py's
    ``pack_command`` for every argument type a caller can pass, in the client's encoding."""
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from django_rlock.engine.aiopool import packed

    args = ("EVALSHA", "a" * 40, 3, "k", "{k}:é", b"\x00\xffraw", 30000, -1, 0, 2.5,
            "x" * 10_000, "", memoryview(b"mv"))
    for encoding in ("utf-8", "latin-1"):
        conn = Connection(encoding=encoding)
        assert b"".join(packed(conn, args)) == b"".join(conn.pack_command(*args))
    with pytest.raises(DataError):
        packed(Connection(), ("EVALSHA", True))


def test_a_long_lived_task_keeps_nothing_of_a_lock_whose_release_was_cancelled(own_server):
    """A consumer task's release is cancelled while it waits in the server (a request
    timeout): once the release lands and is booked, the task keeps neither the hold nor the
    lock object, as after a release that was not cancelled."""
    admin = own_server.client()
    ar = redis.asyncio.Redis(unix_socket_path=own_server.socket)

    async def main() -> bool:
        lock = AsyncRLock(ar, "fast:cut-watch", sync_client=admin)
        await lock.lock()
        k = (lock.server, lock.key, lock.current_owner())
        admin.client_pause(400, all=False)  # the release waits in the server
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await lock.unlock()
        await asyncio.sleep(1.0)
        assert watchdog().get(k) is None and not admin.exists("fast:cut-watch")  # booked
        ref = weakref.ref(lock)
        del lock
        gc.collect()
        alive = ref() is not None
        await ar.aclose()
        return alive

    assert asyncio.run(main()) is False
    admin.close()
