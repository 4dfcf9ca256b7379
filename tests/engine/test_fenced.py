"""FencedLock / AsyncFencedLock: Redisson's RFencedLock (a token on every acquire: the counter's
INCR, or the server clock in microseconds when the counter is behind it)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path

import pytest
import redis
import redis.asyncio

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine import replicas
from django_rlock.engine.fenced import AsyncFencedLock, FencedLock
from django_rlock.engine.identity import thread_owner
from django_rlock.engine.lockinfo import describes, parse_entry
from django_rlock.engine.naming import index_key
from django_rlock.testing import RedisServer, free_port

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def increasing(tokens: list[int]) -> bool:
    return all(a < b for a, b in pairwise(tokens))


def test_token_increase(r):
    # RedissonFencedLockTest.testTokenIncrease: 1, 2, lock() -> 3, lock(10 s) -> 4, try -> 5.
    # Here tokens start from the server clock (issue #25): larger each time, not consecutive.
    lock = FencedLock(r, "lock")
    assert lock.get_token() is None
    tokens = [lock.lock_and_get_token()]
    lock.unlock()
    tokens.append(lock.lock_and_get_token())
    lock.unlock()
    lock.lock()
    tokens.append(lock.get_token())
    lock.unlock()
    lock.lock(lease_time=10)
    tokens.append(lock.get_token())
    lock.unlock()
    tokens.append(lock.try_lock_and_get_token())
    lock.unlock()
    assert lock.try_lock()
    tokens.append(lock.get_token())  # plain try_lock counts too
    lock.unlock()
    assert increasing(tokens)
    assert not lock.is_locked()


def test_a_reentrant_acquire_gets_a_new_larger_token(r):
    lock = FencedLock(r, "re")
    tokens = [lock.lock_and_get_token(), lock.lock_and_get_token()]
    lock.lock()
    tokens += [lock.get_token(), lock.try_lock_and_get_token(lease_time=5)]
    assert increasing(tokens)
    assert lock.hold_count() == 4
    for _ in range(4):
        lock.unlock()
    assert not lock.is_locked()
    with pytest.raises(LockNotOwnedError):
        lock.unlock()


def test_a_failed_attempt_hands_out_no_token_and_a_wait_gets_the_next(r, holders):
    lock = FencedLock(r, "busy")
    h = holders()
    first = h.call(lock.lock_and_get_token)
    assert lock.try_lock_and_get_token() is None  # one attempt
    assert lock.try_lock() is False
    assert lock.try_lock_and_get_token(wait_time=0.2) is None  # a timed-out wait
    assert lock.get_token() == first  # refused attempts raised nothing
    threading.Timer(0.3, lambda: h.call(lock.unlock)).start()
    assert lock.try_lock_and_get_token(wait_time=30) > first
    lock.unlock()


def test_lock_and_get_token_honours_the_lease(r):
    lock = FencedLock(r, "lease", watchdog_timeout=30)
    first = lock.lock_and_get_token(lease_time=3)
    assert 2_000 < r.pttl("lease") <= 3_000
    lock.unlock()
    assert lock.lock_and_get_token() > first
    assert 29_000 < r.pttl("lease") <= 30_000  # watchdog mode
    lock.unlock()


def test_an_expired_lease_lets_the_next_holder_in_with_a_larger_token(r, holders):
    lock = FencedLock(r, "exp")
    h = holders()
    t1 = h.call(lambda: lock.lock_and_get_token(lease_time=0.2))
    t2 = lock.lock_and_get_token()  # waits for the lease to run out (no message comes)
    assert t2 > t1
    lock.unlock()
    with pytest.raises(LockNotOwnedError):
        h.call(lock.unlock)


def test_layout_redisson_names_and_kind_in_the_index(r):
    lock = FencedLock(r, "doc", prefix="app:")
    lock.lock()
    token = str(lock.get_token()).encode()
    assert r.hgetall("app:doc") == {thread_owner().encode(): b"1"}
    assert r.get("redisson_lock_token:{app:doc}") == token
    assert r.ttl("redisson_lock_token:{app:doc}") == -1  # no expiry, ever
    entry = parse_entry(r.hget(index_key("app:"), "app:doc"))[1]
    assert entry["kind"] == "fenced" and describes(entry, thread_owner())
    assert RLock(r, "doc", prefix="app:").is_held_by_current_thread()  # the same hash
    lock.unlock()
    assert not r.exists("app:doc") and not r.hexists(index_key("app:"), "app:doc")
    assert r.get("redisson_lock_token:{app:doc}") == token  # outlives the lock
    tagged = FencedLock(r, "{user:1}doc")
    tagged_token = tagged.lock_and_get_token()
    assert r.get("redisson_lock_token:{user:1}doc") == str(tagged_token).encode()  # keeps the tag
    tagged.unlock()


def test_a_holder_whose_key_has_no_expiry_is_not_a_grant(r):
    # Redisson reads the PTTL -1 of such a key as "acquired"; here it is someone's lock.
    r.hset("forever", "other-client:1", 1)
    lock = FencedLock(r, "forever")
    assert lock.try_lock_and_get_token() is None
    assert lock.try_lock_and_get_token(wait_time=0.2) is None
    assert lock.get_token() is None
    assert r.hgetall("forever") == {b"other-client:1": b"1"}


def test_excludes_rlock_holders_of_the_same_name(r, holders):
    h = holders()
    plain = RLock(r, "mixed")
    h.call(plain.lock)
    fenced = FencedLock(r, "mixed")
    assert fenced.try_lock_and_get_token() is None
    h.call(plain.unlock)
    assert fenced.try_lock_and_get_token() is not None
    assert h.call(lambda: plain.try_lock()) is False
    fenced.unlock()


def test_a_waiter_is_never_granted_by_an_rlock_release_in_its_process(r, holders):
    # RLock's release hands the lock to this process's first waiter on the channel; for a
    # fenced waiter that grant skipped the token (and held nothing): it must acquire itself.
    h = holders()
    plain = RLock(r, "mixh")
    h.call(plain.lock)
    fenced = FencedLock(r, "mixh")
    waiter = holders()
    got = waiter.submit(lambda: fenced.try_lock_and_get_token(wait_time=30))
    deadline = time.monotonic() + 30
    while r.pubsub_numsub("redisson_lock__channel:{mixh}")[0][1] == 0:  # it is waiting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    h.call(plain.unlock)
    assert got(30) == fenced.get_token()  # its own acquire's token
    assert waiter.call(fenced.is_held_by_current_thread)
    assert waiter.call(fenced.hold_count) == 1
    waiter.call(fenced.unlock)
    assert not r.exists("mixh")


def test_threads_sharing_one_object_each_get_their_own_token(r):
    lock = FencedLock(r, "shared")
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work() -> None:
        try:
            start.wait()
            for _ in range(10):
                token = lock.lock_and_get_token()
                try:
                    seen.append((token, lock.get_token()))  # no other acquire can run now
                finally:
                    lock.unlock()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert all(mine == last for mine, last in seen)
    assert len(seen) == 60 and increasing([t for t, _ in seen])  # in holding order


def test_no_two_callers_get_one_token_even_when_leases_run_out_under_them(r):
    # 1 ms leases on one shared object: the next thread gets in while the previous one is
    # still on its way out of the acquire call. Each must come back with its own token.
    lock = FencedLock(r, "short")
    got: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work() -> None:
        try:
            start.wait()
            for _ in range(25):
                token = lock.try_lock_and_get_token(wait_time=30, lease_time=0.001)
                assert token is not None
                got.append(token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert len(got) == len(set(got)) == 150


def test_tokens_strictly_increase_across_4_processes_x_2_threads(r, redis_server):
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine._fenced_proc",
                               redis_server.socket, "fence", "2", "12"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    got: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0
        got += json.loads(out.strip().splitlines()[-1])
    # 4 x 2 x 12 holds, every other one with a reentrant acquire inside: 144 acquires.
    order = [int(t) for t in r.lrange("order", 0, -1)]
    assert len(got) == len(order) == 144
    assert sorted(got) == sorted(order)
    assert len(set(got)) == 144  # each token went to exactly one acquire
    assert increasing(order)  # in acquisition order, strictly increasing
    assert not r.exists("fence")


def test_bad_input_raises_before_any_redis_command():
    dead = redis.Redis(unix_socket_path="/nonexistent/redis.sock")  # any command would fail
    lock = FencedLock(dead, "bad")
    with pytest.raises(ValueError, match="lease_time.*'bad'"):
        lock.lock_and_get_token(lease_time=0)
    with pytest.raises(ValueError, match="wait_time"):
        lock.try_lock_and_get_token(wait_time=-1)
    with pytest.raises(TypeError, match="wait_time"):
        lock.try_lock_and_get_token(wait_time="1")
    with pytest.raises(TypeError, match="lease_time"):
        lock.try_lock_and_get_token(lease_time=True)
    with pytest.raises(ValueError, match="name"):
        FencedLock(dead, "")
    with pytest.raises(TypeError, match="prefix"):
        FencedLock(dead, "x", prefix=None)


# -- asyncio ----------------------------------------------------------------------------
def test_async_token_increase_and_reentry(ar, r):
    async def main() -> None:
        lock = AsyncFencedLock(ar, "alock")
        assert await lock.get_token() is None
        tokens = [await lock.lock_and_get_token()]
        await lock.unlock()
        tokens.append(await lock.lock_and_get_token())
        await lock.unlock()
        await lock.lock()
        tokens.append(await lock.get_token())
        await lock.unlock()
        await lock.lock(lease_time=10)
        tokens.append(await lock.get_token())
        assert 9_000 < await ar.pttl("alock") <= 10_000
        await lock.unlock()
        tokens.append(await lock.try_lock_and_get_token())
        tokens.append(await lock.lock_and_get_token(lease_time=20))  # reentrant
        assert increasing(tokens)
        assert await lock.hold_count() == 2
        await lock.unlock()
        await lock.unlock()
        assert not await lock.is_locked()
        await ar.aclose()

    asyncio.run(main())


def test_async_tasks_sharing_one_object_each_get_their_own_token(ar, r):
    async def main() -> list[tuple[int, int | None]]:
        lock = AsyncFencedLock(ar, "atasks")
        seen: list[tuple[int, int | None]] = []

        async def work() -> None:
            for _ in range(5):
                token = await lock.lock_and_get_token()
                try:
                    await asyncio.sleep(0)
                    seen.append((token, await lock.get_token()))
                finally:
                    await lock.unlock()

        holder = await lock.try_lock_and_get_token()
        assert holder is not None
        other = asyncio.create_task(lock.try_lock_and_get_token(wait_time=0.2))
        assert await other is None  # another task: refused, no token spent
        assert await lock.get_token() == holder
        await lock.unlock()
        await asyncio.gather(*(work() for _ in range(4)))
        assert min(t for t, _ in seen) > holder
        await ar.aclose()
        return seen

    seen = asyncio.run(main())
    assert all(mine == last for mine, last in seen)
    assert len({t for t, _ in seen}) == len(seen) == 20


def test_async_and_sync_holders_exclude_each_other_and_share_the_counter(ar, r):
    async def main() -> None:
        sync_lock = FencedLock(r, "both")
        first = sync_lock.lock_and_get_token()
        alock = AsyncFencedLock(ar, "both")
        assert await alock.try_lock_and_get_token() is None
        sync_lock.unlock()
        assert await alock.try_lock_and_get_token() > first
        entry = parse_entry(await ar.hget(index_key(""), "both"))[1]
        assert entry["kind"] == "fenced"
        await alock.unlock()
        await ar.aclose()

    asyncio.run(main())


def test_async_bad_input_raises_before_any_redis_command(r):
    async def main() -> None:
        lock = AsyncFencedLock(redis.asyncio.Redis(unix_socket_path="/nonexistent/redis.sock"),
                               "abad", sync_client=r)
        with pytest.raises(ValueError, match="lease_time"):
            await lock.lock_and_get_token(lease_time=-1)
        with pytest.raises(TypeError, match="wait_time"):
            await lock.try_lock_and_get_token(wait_time=None)

    t0 = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - t0 < 5


# -- tokens survive a lost counter (issue #25) ------------------------------------------------
def test_tokens_keep_growing_across_a_restart_that_lost_every_key(own_server):
    client = own_server.client()
    lock = FencedLock(client, "restarted")
    before = []
    for _ in range(5):
        before.append(lock.lock_and_get_token())
        lock.unlock()
    client.close()
    own_server.restart()  # no persistence: the counter (and the script cache) are gone
    # A new connection: a lock script is never sent again after a failed send (it may have
    # run), so the first one on a connection the restart broke raises ConnectionError.
    client = own_server.client()
    lock = FencedLock(client, "restarted")
    assert client.get(lock.token_key) is None
    after = []
    for _ in range(5):
        after.append(lock.lock_and_get_token())
        lock.unlock()
    assert before == sorted(set(before)) and after == sorted(set(after))
    assert min(after) > max(before)
    client.close()


def test_a_counter_behind_the_tokens_handed_out_still_gives_a_larger_token(r):
    # A promoted replica that missed the last INCRs: its counter is below tokens already out.
    lock = FencedLock(r, "lagging")
    handed = []
    for _ in range(3):
        handed.append(lock.lock_and_get_token())
        lock.unlock()
    for behind in (b"1", str(handed[0] - 1).encode(), str(handed[-1]).encode()):
        r.set(lock.token_key, behind)
        token = lock.lock_and_get_token()
        lock.unlock()
        assert token > max(handed)
        handed.append(token)
    assert handed == sorted(set(handed))


def test_a_promoted_replica_that_missed_the_last_tokens_hands_out_larger_ones():
    # A real failover's data loss: the replica is promoted (REPLICAOF NO ONE) while the old
    # master goes on handing out tokens it never sees. Same host, so the same clock.
    master = RedisServer(port=free_port(), args=["--repl-diskless-sync-delay", "0"]).start()
    replica = RedisServer(port=free_port(),
                          args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    m, rep = master.client(), replica.client()
    try:
        deadline = time.monotonic() + 10
        while (replicas.online(m.info("replication")) != 1  # online on both sides
               or rep.info("replication")["master_link_status"] != "up"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        lock = FencedLock(m, "failover", sync_replicas=1)  # each acquire WAITs for the replica
        synced = []
        for _ in range(3):
            synced.append(lock.lock_and_get_token())
            lock.unlock()
        assert int(rep.get(lock.token_key)) == synced[-1]  # written as digits, replicated
        rep.replicaof("NO", "ONE")
        lost = FencedLock(m, "failover", sync_replicas=0)
        missed = []
        for _ in range(3):
            missed.append(lost.lock_and_get_token())
            lost.unlock()
        assert int(rep.get(lock.token_key)) == synced[-1] < min(missed)  # the replica lags
        promoted = FencedLock(rep, "failover", sync_replicas=0)
        after = []
        for _ in range(3):
            after.append(promoted.lock_and_get_token())
            promoted.unlock()
        assert increasing(synced + missed) and increasing(after)
        assert min(after) > max(synced + missed)
    finally:
        m.close()
        rep.close()
        for server in (replica, master):
            server.stop()
            shutil.rmtree(server.dir, ignore_errors=True)


def test_a_redisson_client_incr_between_acquires_keeps_tokens_growing(r):
    # A Java Redisson client's acquire is a plain INCR of the same counter.
    lock = FencedLock(r, "mixed-clients")
    seen = []
    for _ in range(4):
        seen.append(lock.lock_and_get_token())
        lock.unlock()
        seen.append(r.incr(lock.token_key))
        seen.append(r.incr(lock.token_key))
    seen.append(lock.lock_and_get_token())
    lock.unlock()
    assert seen == sorted(set(seen))
    assert lock.get_token() == seen[-1]


def test_a_counter_ahead_of_the_clock_is_incremented(r):
    # More than one token per microsecond (or an old counter set by hand far ahead): INCR.
    lock = FencedLock(r, "ahead")
    r.set(lock.token_key, 2**52)
    assert lock.lock_and_get_token() == 2**52 + 1
    assert lock.lock_and_get_token() == 2**52 + 2  # reentrant: a new, larger token
    lock.unlock()
    lock.unlock()
    assert r.get(lock.token_key) == str(2**52 + 2).encode()


def test_a_counter_that_is_not_an_integer_is_refused_like_incr_and_nothing_is_held(r):
    lock = FencedLock(r, "garbage")
    r.set(lock.token_key, "x")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        lock.lock_and_get_token()
    assert not r.exists("garbage")
    assert r.get(lock.token_key) == b"x"


def test_a_token_is_the_servers_clock_in_microseconds_written_as_an_integer(r):
    lock = FencedLock(r, "clock")
    sec, usec = r.time()
    token = lock.lock_and_get_token()
    sec2, usec2 = r.time()
    lock.unlock()
    assert sec * 10**6 + usec <= token <= sec2 * 10**6 + usec2
    assert r.get(lock.token_key) == str(token).encode()  # digits: no 1.7e+15, INCR works on it
    assert r.incr(lock.token_key) == token + 1


def test_async_tokens_keep_growing_across_a_restart(own_server):
    async def main() -> tuple[list[int], list[int]]:
        client = redis.asyncio.Redis(unix_socket_path=own_server.socket)
        lock = AsyncFencedLock(client, "arestarted", sync_client=own_server.client())
        before = []
        for _ in range(3):
            before.append(await lock.lock_and_get_token())
            await lock.unlock()
        await client.aclose()
        own_server.restart()
        client = redis.asyncio.Redis(unix_socket_path=own_server.socket)  # a new connection
        lock = AsyncFencedLock(client, "arestarted", sync_client=own_server.client())
        after = []
        for _ in range(3):
            after.append(await lock.lock_and_get_token())
            await lock.unlock()
        await client.aclose()
        return before, after

    before, after = asyncio.run(main())
    assert before == sorted(set(before)) and after == sorted(set(after))
    assert min(after) > max(before)
