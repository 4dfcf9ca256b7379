"""``get_lock(..., aio=True)``: the asyncio twin of every kind on a cache alias, and the
``RuntimeWarning`` of a sync lock taken where an event loop runs (its thread-owned
RLock would let every task of the loop in at once). On a real Redis."""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_rlock import (
    AsyncFairLock,
    AsyncFencedLock,
    AsyncMultiLock,
    AsyncNonReentrantLock,
    AsyncReadLock,
    AsyncRedLock,
    AsyncRLock,
    AsyncWriteLock,
    get_lock,
)
from django_rlock.factory import IN_EVENT_LOOP
from tests.cluster.conftest import cluster, cluster_support  # noqa: F401 - the fixtures

KEY = "demo:rlock:"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_two_tasks_on_one_loop_exclude_each_other():
    """The audit's case: two requests on one event loop. The second task is refused while the
    first holds the lock, then waits for it and gets in only after the first is out."""
    async def main() -> tuple[list[str], bool]:
        order: list[str] = []
        first_in = asyncio.Event()
        refused: list[bool] = []

        async def first() -> None:
            async with get_lock("shared", aio=True):
                order.append("first in")
                first_in.set()
                await asyncio.sleep(0.3)  # the second task tries, then waits, meanwhile
                order.append("first out")

        async def second() -> None:
            await first_in.wait()
            lock = get_lock("shared", aio=True)
            refused.append(not await lock.try_lock())
            async with lock:
                order.append("second in")

        await asyncio.gather(first(), second())
        return order, refused == [True]

    order, refused = run(main())
    assert refused
    assert order == ["first in", "first out", "second in"]


def test_the_async_lock_is_the_sync_lock_of_that_name(db1, hold):
    """Same key, same prefix: a sync holder in another thread keeps the async one out."""
    hold(get_lock("both"), thread="sync-holder")

    async def main() -> bool:
        return await get_lock("both", aio=True).try_lock()

    assert run(main()) is False
    assert db1.exists(f"{KEY}both")


@pytest.mark.parametrize(("kind", "cls"), [
    (None, AsyncRLock), ("fair", AsyncFairLock), ("read", AsyncReadLock),
    ("write", AsyncWriteLock), ("fenced", AsyncFencedLock),
    ("non_reentrant", AsyncNonReentrantLock)])
def test_each_kind_has_its_asyncio_twin_at_the_cache_prefix(db1, kind, cls):
    async def main() -> tuple[Any, bool, bool]:
        lock = get_lock(f"k-{kind}", kind=kind, aio=True, label="lbl")
        async with lock:
            held = await lock.is_held_by_current_task()
            # Another task of the same loop is another owner (a write and a read exclude).
            other = await asyncio.create_task(
                get_lock(f"k-{kind}", kind="write" if kind == "read" else kind,
                         aio=True).try_lock())
        return lock, held, other

    lock, held, other = run(main())
    assert type(lock) is cls
    assert (lock.name, lock.key, lock.label) == (f"k-{kind}", f"{KEY}k-{kind}", "lbl")
    assert held and other is False
    assert not db1.exists(f"{KEY}k-{kind}")  # released on the way out of ``async with``


def test_settings_and_per_call_windows_apply(settings):
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 7, "MAX_HOLD": 60}

    async def main() -> tuple[Any, Any]:
        return (get_lock("w", aio=True, warn_held_after=5),
                get_lock("w", cache="builtin", kind="fair", aio=True))

    lock, other = run(main())
    assert (lock.watchdog_timeout, lock.max_hold, lock.warn_held_after) == (7.0, 60.0, 5.0)
    assert other.key == "site2:rlock:w" and other.watchdog_timeout == 7.0


def test_several_caches_make_an_async_multilock_or_redlock(db1, redis_server):
    async def main() -> tuple[Any, Any, bool]:
        multi = get_lock("m", cache=["default", "builtin"], aio=True)
        red = get_lock("m", cache=["default", "builtin"], quorum=True, aio=True)
        async with multi:
            keys = [m.key for m in multi.locks]
            busy = await asyncio.create_task(red.try_lock())  # another task: another owner
            assert db1.exists(f"{KEY}m")
            with redis_server.client(db=2) as c:
                assert c.exists("site2:rlock:m")
        return multi, red, (keys, busy)

    multi, red, (keys, busy) = run(main())
    assert type(multi) is AsyncMultiLock and type(red) is AsyncRedLock
    assert keys == [f"{KEY}m", "site2:rlock:m"] and busy is False


def test_bad_input_is_refused_before_any_command(db1):
    before = db1.info("commandstats")

    async def main() -> None:
        with pytest.raises(ValueError, match="cannot span several caches.*'n'"):
            get_lock("n", kind="fair", cache=["default", "builtin"], aio=True)
        with pytest.raises(ValueError, match="quorum=True needs a list.*'n'"):
            get_lock("n", quorum=True, aio=True)
        with pytest.raises(ValueError, match="kind must be"):
            get_lock("n", kind="nope", aio=True)

    run(main())
    with pytest.raises(RuntimeError, match="needs a running event loop.*'n'"):
        get_lock("n", aio=True)
    after = db1.info("commandstats")
    assert {k: v["calls"] for k, v in after.items() if k != "cmdstat_info"} == \
           {k: v["calls"] for k, v in before.items() if k != "cmdstat_info"}


# -- the warning --------------------------------------------------------------------------------
def sync_lock_warnings(call: Any) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if w.category is RuntimeWarning]


def test_a_sync_lock_taken_in_a_running_loop_warns_at_the_call_site():
    async def main() -> None:
        with get_lock("loop"):
            pass

    got = sync_lock_warnings(lambda: run(main()))
    assert [str(w.message) for w in got] == [IN_EVENT_LOOP]
    assert got[0].filename == __file__  # points at the caller, not at django_rlock
    assert "aio=True" in IN_EVENT_LOOP


def test_a_lock_made_outside_the_loop_warns_when_taken_in_it_every_way():
    """The case a warning where the lock is made missed: a module's lock, taken by a
    coroutine. ``with``, ``lock()``, ``try_lock()``, ``acquire()``, every sync kind and a
    MultiLock (once per member, at the caller's line)."""
    locks = [get_lock("mod"), get_lock("mod-fair", kind="fair"), get_lock("mod-w", kind="write"),
             get_lock("mod-multi", cache=["default", "builtin"])]

    async def main() -> None:
        with locks[0]:
            pass
        locks[1].lock()
        locks[1].unlock()
        assert locks[2].try_lock(1)
        locks[2].unlock()
        assert locks[3].acquire(blocking=False)
        locks[3].release()

    got = sync_lock_warnings(lambda: run(main()))
    assert [w.filename for w in got] == [__file__] * 5
    assert {str(w.message) for w in got} == {IN_EVENT_LOOP}


def test_no_warning_where_no_loop_runs_or_with_aio():
    """A plain thread, ``sync_to_async`` (a thread of its own), a lock made in the loop and
    taken in such a thread, and the asyncio twin: no warning."""
    def take(name: str) -> None:
        with get_lock(name):
            pass

    def in_thread() -> None:
        t = threading.Thread(target=take, args=("thread",))
        t.start()
        t.join()

    async def main() -> None:
        await sync_to_async(take)("s2a")  # thread_sensitive: a thread of its own
        await sync_to_async(take, thread_sensitive=False)("s2a-free")
        made_here = get_lock("made-in-loop")
        await sync_to_async(made_here.acquire)()
        await sync_to_async(made_here.release)()
        async with get_lock("aio", aio=True):
            pass

    assert sync_lock_warnings(lambda: take("plain")) == []
    assert sync_lock_warnings(in_thread) == []
    assert sync_lock_warnings(lambda: run(main())) == []


def test_on_a_cluster_it_runs_on_the_slots_master(settings, cluster):  # noqa: F811
    """With ``RLOCK["CLUSTER"]`` the settings give a sync cluster client: the asyncio lock gets
    an asyncio cluster client of the same nodes, and its hold is on its slot's master."""
    settings.RLOCK = {"REDIS_URL": f"redis://127.0.0.1:{cluster.masters()[0].port}/0",
                      "CLUSTER": True, "PREFIX": "dj:"}
    master = cluster.node_for_key("dj:report")

    async def main() -> None:
        for kind in (None, "fair", "write"):
            lock = get_lock("report", aio=True, kind=kind)
            async with lock:
                assert await lock.is_locked()
                with cluster.node_client(master) as c:
                    assert c.exists("dj:report")
            assert not await lock.is_locked()

    run(main())
