"""Reentrancy, ownership, expiry, inspection and the threading.RLock protocol."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_rlock import LockError, LockNotOwnedError, RLock
from django_rlock.engine.watchdog import watchdog
from tests.conftest import inner_commands, script_calls


def test_reentrancy_counts(r):
    lock = RLock(r, "re")
    assert lock.hold_count() == 0
    lock.lock()
    assert lock.hold_count() == 1
    lock.unlock()
    assert lock.hold_count() == 0
    lock.lock()
    lock.lock()
    assert lock.hold_count() == 2
    assert r.hgetall("re") == {f"{lock_owner()}".encode(): b"2"}
    lock.unlock()
    assert lock.hold_count() == 1 and lock.is_locked()
    lock.unlock()
    assert lock.hold_count() == 0 and not lock.is_locked()


def lock_owner() -> str:
    from django_rlock.engine.identity import thread_owner

    return thread_owner()


def test_partial_unlock_resets_ttl_to_the_lease_in_force(r):
    lock = RLock(r, "ttl")
    for _ in range(3):
        lock.lock(lease_time=10)
    time.sleep(0.3)
    lock.unlock()
    lock.unlock()
    assert 9_500 <= r.pttl("ttl") <= 10_000  # re-PEXPIREd with the 10 s lease, not 30 s
    lock.unlock()
    assert not r.exists("ttl")


def test_partial_unlock_in_watchdog_mode_uses_the_watchdog_timeout(r):
    lock = RLock(r, "ttlw", watchdog_timeout=5)
    lock.lock()
    lock.lock()
    lock.unlock()
    assert 4_500 < r.pttl("ttlw") <= 5_000
    lock.unlock()


def test_other_threads_are_excluded_and_see_the_lock(r, holders):
    lock = RLock(r, "excl")
    h = holders()
    h.call(lambda: lock.lock())
    assert lock.is_locked()
    assert not lock.is_held_by_current_thread()
    assert h.call(lock.is_held_by_current_thread)
    assert lock.try_lock() is False
    assert lock.acquire(blocking=False) is False
    h.call(lock.unlock)
    assert lock.try_lock() is True
    assert lock.is_held_by_current_thread()
    lock.unlock()


def test_non_owner_unlock_raises_and_leaves_the_lock_intact(r, holders):
    lock = RLock(r, "owned")
    h = holders()
    h.call(lambda: lock.lock(lease_time=20))
    before = r.hgetall("owned")
    with pytest.raises(LockNotOwnedError) as err:
        lock.unlock()
    assert isinstance(err.value, RuntimeError) and isinstance(err.value, LockError)
    assert err.value.name == "owned" and "owned" in str(err.value)
    assert r.hgetall("owned") == before
    assert r.pttl("owned") > 19_000
    h.call(lock.unlock)


def test_unlock_of_a_lock_never_taken_raises(r):
    with pytest.raises(LockNotOwnedError):
        RLock(r, "never").unlock()


def test_lease_expiry_frees_the_lock_and_the_old_owner_cannot_unlock(r, holders):
    lock = RLock(r, "lease")
    lock.lock(lease_time=0.5)
    h = holders()
    got = h.submit(lambda: (lock.try_lock(wait_time=5), time.monotonic()))
    start = time.monotonic()
    ok, when = got(10)
    assert ok and when - start < 3
    with pytest.raises(LockNotOwnedError):
        lock.unlock()
    h.call(lock.unlock)


def test_remaining_ttl(r):
    lock = RLock(r, "rt")
    assert lock.remaining_ttl() is None
    lock.lock(lease_time=3)
    assert 2.5 < lock.remaining_ttl() <= 3
    lock.unlock()
    r.hset("rt", "someone:1", 1)  # a hash without expiry
    assert lock.remaining_ttl() == float("inf")


def test_threading_protocol(r, holders):
    lock = RLock(r, "proto")
    assert lock.acquire() is True
    assert lock.acquire(blocking=False) is True  # reentrant
    lock.release()
    lock.release()
    h = holders()
    h.call(lock.acquire)
    start = time.monotonic()
    assert lock.acquire(timeout=0.5) is False
    assert 0.4 < time.monotonic() - start < 3
    with pytest.raises(ValueError):
        lock.acquire(False, 1)
    h.call(lock.release)


def test_context_manager_releases_on_exception(r):
    lock = RLock(r, "ctx")
    with pytest.raises(KeyError):
        with lock:
            assert lock.is_held_by_current_thread()
            raise KeyError("boom")
    assert not r.exists("ctx")
    with lock as same:
        assert same is lock
    assert not r.exists("ctx")


def test_a_lost_lock_does_not_mask_the_blocks_exception(r):
    lock = RLock(r, "mask")
    with pytest.raises(KeyError):
        with lock:
            lock.force_unlock()
            raise KeyError("the real error")
    # Without an exception in the block, losing exclusion is reported.
    with pytest.raises(LockNotOwnedError):
        with lock:
            lock.force_unlock()


def test_force_unlock(r, holders):
    lock = RLock(r, "force")
    assert lock.force_unlock() is False
    h = holders()
    h.call(lambda: lock.lock())
    assert lock.force_unlock() is True
    assert not r.exists("force")
    assert h.call(lock.is_lost) is True
    with pytest.raises(LockNotOwnedError):
        h.call(lock.unlock)


def test_decode_responses_client(redis_server):
    c = redis_server.client(decode_responses=True)
    lock = RLock(c, "dec")
    lock.lock()
    lock.lock()
    assert lock.hold_count() == 2
    lock.unlock()
    lock.unlock()
    assert not lock.is_locked()
    c.close()


def test_churn_leaves_no_renewal_behind(r):
    """Many threads locking and unlocking: no key and no renewal entry survives (Redisson #7272)."""
    lock = RLock(r, "churn")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(150):
                if lock.try_lock():
                    lock.unlock()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not r.exists("churn")
    assert watchdog().renewing() == 0


BAD_CALLS = [
    (lambda r: RLock(r, ""), ValueError),
    (lambda r: RLock(r, 42), TypeError),
    (lambda r: RLock(r, None), TypeError),
    (lambda r: RLock(r, b"bytes"), TypeError),
    (lambda r: RLock(object(), "x"), TypeError),
    (lambda r: RLock(r, "x", prefix=3), TypeError),
    (lambda r: RLock(r, "x", watchdog_timeout=0), ValueError),
    (lambda r: RLock(r, "x", watchdog_timeout=-1), ValueError),
    (lambda r: RLock(r, "x", watchdog_timeout=float("nan")), ValueError),
    (lambda r: RLock(r, "x", watchdog_timeout="30"), TypeError),
    (lambda r: RLock(r, "x", on_lost="no"), TypeError),
    (lambda r: RLock(r, "x").lock(lease_time=0), ValueError),
    (lambda r: RLock(r, "x").lock(lease_time=-1), ValueError),
    (lambda r: RLock(r, "x").lock(lease_time=float("inf")), ValueError),
    (lambda r: RLock(r, "x").lock(lease_time=True), TypeError),
    (lambda r: RLock(r, "x").try_lock(wait_time=-0.1), ValueError),
    (lambda r: RLock(r, "x").try_lock(wait_time="1"), TypeError),
    (lambda r: RLock(r, "x").try_lock(1, 0), ValueError),
    (lambda r: RLock(r, "x").acquire(timeout=-2), ValueError),
    (lambda r: RLock(r, "x").acquire(False, 3), ValueError),
]


@pytest.mark.parametrize("call,error", BAD_CALLS)
def test_bad_input_is_refused_before_any_redis_command(r, call, error):
    r.config_resetstat()
    with pytest.raises(error):
        call(r)
    stats = r.info("commandstats")
    # Only the INFO / CONFIG calls of this test itself reached the server.
    assert all(k.split("|")[0] in ("cmdstat_config", "cmdstat_info") for k in stats), stats


def test_bad_input_messages_name_the_lock(r):
    with pytest.raises(ValueError, match="'orders:9'"):
        RLock(r, "orders:9").lock(lease_time=0)
    with pytest.raises(ValueError, match="'orders:9'"):
        RLock(r, "orders:9", watchdog_timeout=-1)
    with pytest.raises(TypeError, match="'orders:9'"):
        RLock(r, "orders:9").try_lock(wait_time=None)


def test_redis_errors_propagate_unchanged(own_server):
    # One retry, no backoff: redis-py's default retries would spend ~10 s on the same answer.
    c = own_server.client(retry=Retry(NoBackoff(), 1))
    lock = RLock(c, "down")
    own_server.stop()
    with pytest.raises(redis.ConnectionError):
        lock.try_lock()
    with pytest.raises(redis.ConnectionError):
        lock.unlock()
    c.close()


def test_engine_imports_without_django():
    code = ("import sys, redis, django_rlock; from django_rlock import RLock, LockError, "
            "LockNotOwnedError; assert 'django' not in sys.modules, 'django imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2],
                   env={"PATH": "/usr/bin:/bin"})
    engine = Path(__file__).parents[2] / "django_rlock" / "engine"
    for path in engine.glob("*.py"):
        assert "import django" not in path.read_text() and "from django" not in path.read_text()


def test_script_calls_are_one_per_attempt_and_release(r):
    lock = RLock(r, "count")
    r.config_resetstat()
    lock.lock()
    lock.unlock()
    assert script_calls(r) == 2


def test_an_uncontended_pair_runs_ten_commands_inside_its_two_scripts(r):
    """The hot path's server cost, counted: the acquire checks the key, counts the hold, sets
    the lease and lists the holder (stamped with the server's TIME); the release reads the
    count, looks for anyone in line, deletes the key and its listing, and tells Redisson-style
    waiters."""
    lock = RLock(r, "inner-cost")
    lock.lock()
    lock.unlock()  # scripts loaded, replica count probed
    r.config_resetstat()
    lock.lock()
    lock.unlock()
    assert inner_commands(r) == {"exists": 2, "hincrby": 1, "pexpire": 1, "time": 1, "hset": 1,
                     "hget": 1, "del": 1, "hdel": 1, "publish": 1}


def test_a_client_of_the_wrong_flavour_is_refused_before_any_command(redis_server, r):
    """A ``redis.asyncio`` client given to a sync kind (or a sync one to an asyncio kind)
    failed at first use, deep in redis-py, with "coroutine never awaited" warnings."""
    import redis.asyncio

    from django_rlock.engine import (
        AsyncFairLock,
        AsyncRLock,
        AsyncSemaphore,
        CountDownLatch,
        FairLock,
        PermitExpirableSemaphore,
        Semaphore,
    )

    aclient = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
    r.config_resetstat()
    for make in (RLock, FairLock, Semaphore, PermitExpirableSemaphore, CountDownLatch):
        with pytest.raises(TypeError, match=r"is an asyncio client; \w+ 'w' takes a sync"):
            make(aclient, "w")
    for make in (AsyncRLock, AsyncFairLock, AsyncSemaphore):
        with pytest.raises(TypeError, match=r"is a sync client; \w+ 'w' takes an asyncio"):
            make(r, "w")
    # An asyncio kind's sync_client= is a sync one: accepted, as it is.
    AsyncSemaphore(aclient, "w", sync_client=r)
    AsyncRLock(aclient, "w", sync_client=r)
    calls = {k: v["calls"] for k, v in r.info("commandstats").items()
             if k.split("|")[0] not in ("cmdstat_info", "cmdstat_config")}  # (6.2: no "|sub")
    assert calls == {}, calls
