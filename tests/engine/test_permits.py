"""PermitExpirableSemaphore / AsyncPermitExpirableSemaphore: Redisson's
RPermitExpirableSemaphore (RedissonPermitExpirableSemaphoreTest's behaviours), plus permits
renewed by the watchdog while their holder lives and returned when it is killed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio

from django_rlock import LockError
from django_rlock.engine import pubsub
from django_rlock.engine.errors import LockNotOwnedError
from django_rlock.engine.naming import index_key
from django_rlock.engine.semaphore import (
    RECHECK,
    AsyncPermitExpirableSemaphore,
    PermitExpirableSemaphore,
)
from django_rlock.engine.watchdog import watchdog

ROOT = Path(__file__).parents[2]


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def server_ms(r: redis.Redis) -> float:
    s, us = r.time()
    return s * 1000 + us / 1000


def expiry_ms(r: redis.Redis, sem: PermitExpirableSemaphore, pid: str) -> float | None:
    return r.zscore(sem.timeout_key, bytes.fromhex(pid))


# -- RedissonPermitExpirableSemaphoreTest --------------------------------------------------------
def test_not_existent(r):
    assert PermitExpirableSemaphore(r, "none").available_permits() == 0


def test_try_set_and_add_permits(r):
    sem = PermitExpirableSemaphore(r, "s")
    assert sem.try_set_permits(10)
    assert not sem.try_set_permits(15)
    assert sem.available_permits() == 10
    sem.add_permits(5)
    assert sem.available_permits() == 15
    sem.add_permits(-10)
    assert sem.available_permits() == 5
    sem.add_permits(-10)
    assert sem.available_permits() == -5


def test_blocking_acquire_and_id(r):
    sem = PermitExpirableSemaphore(r, "s")
    sem.try_set_permits(1)
    pid = sem.acquire()
    assert re.fullmatch(r"[0-9a-f]{32}", pid)
    threading.Timer(0.3, sem.release, (pid,)).start()
    t0 = time.monotonic()
    again = sem.acquire()
    assert 0.2 < time.monotonic() - t0 < RECHECK * 0.8  # woken by the release's message
    assert again != pid and sem.available_permits() == 0
    sem.release(again)
    assert sem.available_permits() == 1


def test_try_acquire_waits_its_budget(r):
    sem = PermitExpirableSemaphore(r, "s")
    sem.try_set_permits(1)
    sem.acquire()
    t0 = time.monotonic()
    assert sem.try_acquire(wait_time=0.5) is None
    assert 0.45 < time.monotonic() - t0 < 3
    assert sem.try_acquire() is None  # one attempt


def test_available_permits_after_leases_end(r):
    sem = PermitExpirableSemaphore(r, "s")
    sem.try_set_permits(2)
    assert sem.try_acquire(lease_time=0.5) and sem.try_acquire(lease_time=0.5)
    assert sem.available_permits() == 0
    assert sem.try_acquire() is None
    time.sleep(0.7)
    assert sem.available_permits() == 2  # reclaimed: counted back, ids gone
    assert r.zcard(sem.timeout_key) == 0


def test_a_waiter_gets_an_expired_permit_at_its_expiry(r):
    # testExpireTryAcquire: the failed attempt returns the nearest expiry as its wait bound
    # (expiry publishes nothing); the budget is shorter than the re-check.
    sem = PermitExpirableSemaphore(r, "s")
    sem.try_set_permits(1)
    old = sem.acquire(lease_time=1)
    t0 = time.monotonic()
    new = sem.try_acquire(wait_time=RECHECK * 0.8)
    assert new is not None and 0.8 < time.monotonic() - t0 < 3
    assert sem.try_release(old) is False  # expired, reclaimed, gone
    with pytest.raises(LockNotOwnedError, match=r"permit [0-9a-f]{32} of semaphore 's'"):
        sem.release(old)
    sem.release(new)
    assert sem.available_permits() == 1


def test_release_unknown_expired_and_twice(r):
    sem = PermitExpirableSemaphore(r, "s")
    sem.try_set_permits(10)
    with pytest.raises(LockError) as err:
        sem.release("0" * 32)
    assert err.value.name == "s"
    pids = [sem.acquire() for _ in range(4)] + [sem.acquire(lease_time=30) for _ in range(2)]
    assert sem.available_permits() == 4
    for pid in pids:
        sem.release(pid)
    assert sem.available_permits() == 10
    with pytest.raises(LockError):
        sem.release(pids[0])
    assert sem.try_release(pids[1]) is False
    short = sem.acquire(lease_time=0.2)
    time.sleep(0.4)
    assert sem.try_release(short) is False  # testReleaseExpired
    assert sem.available_permits() == 10


def test_update_lease_time(r):
    sem = PermitExpirableSemaphore(r, "s")
    sem.try_set_permits(1)
    assert sem.update_lease_time("f" * 32, 1) is False
    pid = sem.acquire(lease_time=0.5)
    assert sem.update_lease_time(pid, 2)
    time.sleep(0.8)
    assert sem.available_permits() == 0  # its old lease would have ended
    left = expiry_ms(r, sem, pid) - server_ms(r)
    assert 500 < left <= 1300
    time.sleep(left / 1000 + 0.3)
    assert sem.available_permits() == 1
    assert sem.update_lease_time(pid, 1) is False  # expired


def test_update_lease_time_stops_the_renewal(r):
    sem = PermitExpirableSemaphore(r, "s", watchdog_timeout=0.6)
    sem.try_set_permits(1)
    pid = sem.acquire()
    assert watchdog().get((sem._server, sem.key, pid)) is not None
    assert sem.update_lease_time(pid, 0.5)
    assert watchdog().get((sem._server, sem.key, pid)) is None
    time.sleep(1.2)  # two renewal periods: nobody renewed it past its new lease
    assert sem.available_permits() == 1


def test_layout_and_index(r, redis_server):
    sem = PermitExpirableSemaphore(r, "lay", prefix="p:", watchdog_timeout=10)
    assert sem.timeout_key == "{p:lay}:timeout" and sem.channel == "redisson_sc:{p:lay}"
    sub = redis_server.client().pubsub()
    sub.subscribe(sem.channel)
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    assert sem.try_set_permits(3)
    before = server_ms(r)
    pid = sem.acquire()  # no lease: the watchdog timeout
    leased = sem.acquire(lease_time=2)
    after = server_ms(r)
    assert r.get("p:lay") == b"1"
    members = dict(r.zrange(sem.timeout_key, 0, -1, withscores=True))
    assert set(members) == {bytes.fromhex(pid), bytes.fromhex(leased)}  # 16 raw bytes each
    assert before + 10_000 - 5 <= members[bytes.fromhex(pid)] <= after + 10_000 + 5
    assert before + 2_000 - 5 <= members[bytes.fromhex(leased)] <= after + 2_000 + 5
    sem.release(pid)
    sem.add_permits(-1)
    got = []
    while (m := sub.get_message(timeout=0.5)) is not None:
        got.append(m["data"])
    assert got == [b"3", b"2", b"1"]  # the permits free after each change
    entry = r.hget(index_key("p:"), "p:lay").decode()
    assert entry.split(" ", 1)[1] == '{"kind":"permits"}'
    sem.release(leased)
    assert sem.delete()
    assert not r.exists("p:lay", sem.timeout_key) and not r.hexists(index_key("p:"), "p:lay")
    sub.close()


def test_expired_permits_are_reclaimed_by_every_change_and_published(r, redis_server):
    sem = PermitExpirableSemaphore(r, "rec")
    sem.try_set_permits(2)
    sem.acquire(lease_time=0.2)
    sem.acquire(lease_time=0.2)
    time.sleep(0.4)
    sub = redis_server.client().pubsub()
    sub.subscribe(sem.channel)
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    sem.add_permits(0)  # reclaims first, publishes the count after that, then its own
    assert [sub.get_message(timeout=2)["data"] for _ in range(2)] == [b"2", b"2"]
    assert r.zcard(sem.timeout_key) == 0 and r.get("rec") == b"2"
    sub.close()


def test_try_set_permits_counts_live_permits_of_a_lost_count(r):
    sem = PermitExpirableSemaphore(r, "lost")
    sem.try_set_permits(3)
    sem.acquire(lease_time=30)
    r.delete("lost")  # the counter alone deleted, one permit still out
    assert sem.try_set_permits(3)
    assert sem.available_permits() == 2  # at most three out at once


def test_bad_input_raises_before_any_command():
    dead = redis.Redis(unix_socket_path="/nonexistent")
    sem = PermitExpirableSemaphore(dead, "bad")
    for call, exc in [
        (lambda: sem.acquire(lease_time=0), ValueError), (lambda: sem.acquire(-1), ValueError),
        (lambda: sem.try_acquire(wait_time=-1), ValueError),
        (lambda: sem.try_acquire(lease_time=True), TypeError),
        (lambda: sem.release(3), TypeError), (lambda: sem.release("xyz"), ValueError),
        (lambda: sem.try_release("g" * 32), ValueError),
        (lambda: sem.update_lease_time("0" * 32, None), TypeError),
        (lambda: sem.update_lease_time("0" * 32, -1), ValueError),
        (lambda: sem.try_set_permits(-1), ValueError), (lambda: sem.add_permits(2.0), TypeError),
    ]:
        with pytest.raises(exc, match="'bad'"):
            call()
    with pytest.raises(ValueError, match="watchdog_timeout"):
        PermitExpirableSemaphore(dead, "bad", watchdog_timeout=0)


# -- renewal by the watchdog ---------------------------------------------------------------------
def test_a_live_holders_permit_is_renewed_past_several_timeouts(r):
    sem = PermitExpirableSemaphore(r, "live", watchdog_timeout=0.9)
    sem.try_set_permits(1)
    pid = sem.acquire()
    first = expiry_ms(r, sem, pid)
    time.sleep(3.0)  # more than three watchdog timeouts
    assert sem.try_acquire() is None
    assert sem.available_permits() == 0
    assert expiry_ms(r, sem, pid) > first + 1500  # moved on by the renewals
    sem.release(pid)
    assert watchdog().get((sem._server, sem.key, pid)) is None
    assert sem.available_permits() == 1


def test_a_killed_holders_permit_returns_within_the_watchdog_timeout(r, redis_server):
    wd = 1.5
    sem = PermitExpirableSemaphore(r, "killed", watchdog_timeout=wd)
    sem.try_set_permits(1)
    proc = subprocess.Popen([sys.executable, "-m", "tests.engine._sem_proc", "hold",
                             redis_server.socket, "killed", str(wd)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = proc.stdout.readline().strip()
        assert re.fullmatch(r"[0-9a-f]{32}", pid), proc.stderr.read() if proc.poll() else pid
        time.sleep(wd * 2)  # the holder renews it: still taken
        assert sem.try_acquire() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        got = sem.try_acquire(wait_time=30)  # woken by the expiry bound, not a message
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert got is not None
    assert took <= wd + 1.0
    assert sem.try_release(pid) is False
    sem.release(got)


def test_never_over_subscribed_4_processes(r, redis_server):
    sem = PermitExpirableSemaphore(r, "over")
    sem.try_set_permits(2)
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine._sem_proc", "permits",
                               redis_server.socket, "over", "3", "8"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert json.loads(out) == 24
    assert int(r.get("peak")) == 2
    assert sem.available_permits() == 2 and r.zcard(sem.timeout_key) == 0


# -- AsyncPermitExpirableSemaphore ---------------------------------------------------------------
def test_async_permits(ar, r):
    async def main() -> None:
        sem = AsyncPermitExpirableSemaphore(ar, "ap", watchdog_timeout=0.9)
        assert await sem.try_set_permits(1)
        pid = await sem.acquire()
        assert re.fullmatch(r"[0-9a-f]{32}", pid)
        await asyncio.sleep(2.0)  # renewed by the watchdog (through the sync twin)
        assert await sem.try_acquire() is None
        assert await sem.available_permits() == 0
        asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(sem.release(pid)))
        t0 = time.monotonic()
        again = await sem.try_acquire(wait_time=RECHECK * 0.8, lease_time=5)
        assert again is not None and time.monotonic() - t0 < RECHECK * 0.8 - 0.5
        assert await sem.update_lease_time(again, 0.3)
        await asyncio.sleep(0.5)
        assert await sem.try_release(again) is False
        with pytest.raises(LockNotOwnedError):
            await sem.release(again)
        await sem.add_permits(2)
        assert await sem.available_permits() == 3
        assert await sem.delete()
        await ar.aclose()

    asyncio.run(main())


def test_an_async_permit_outlives_the_task_that_took_it(ar, r):
    async def main() -> None:
        sem = AsyncPermitExpirableSemaphore(ar, "task", watchdog_timeout=0.9)
        await sem.try_set_permits(1)
        pid = await asyncio.ensure_future(sem.acquire())  # taken in a task that then ends
        await asyncio.sleep(2.0)
        assert await sem.available_permits() == 0  # still renewed: not the task's
        await sem.release(pid)
        assert await sem.available_permits() == 1
        await ar.aclose()

    asyncio.run(main())


def test_a_cancelled_async_acquire_never_loses_a_permit(ar, r):
    async def main() -> None:
        sem = AsyncPermitExpirableSemaphore(ar, "cancel")
        task = asyncio.ensure_future(sem.acquire())
        for _ in range(500):
            mgr = pubsub.existing_manager(sem._sync_client)
            ch = mgr and mgr.channel(b"redisson_sc:{cancel}")
            if ch is not None and ch.queue and ch.confirmed.is_set():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        r.set("cancel", 1)  # a permit with no message, and scripts held up
        r.client_pause(1500, all=False)
        mgr.wake(b"redisson_sc:{cancel}", b"1")
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await sem.available_permits() == 1
        assert await ar.zcard(sem.timeout_key) == 0
        assert not [k for k in watchdog()._holds if k[1] == "cancel"]  # nothing renewed
        await ar.aclose()

    asyncio.run(main())


def test_renewed_permits_send_acquired_and_released_with_their_label(r, ar):
    """A renewed permit is a hold for the lock events (metrics, signals): ``acquired`` and
    ``released`` with the label and the permit id as owner, sync and asyncio; a leased one
    (not the watchdog's) sends none; a bad label is refused before any command."""
    from django_rlock.engine import events

    got: list[tuple[str, dict]] = []

    def listen(event: str, data: dict) -> None:
        if data["name"] == "ev":
            got.append((event, data))

    with pytest.raises(TypeError, match="label"):
        PermitExpirableSemaphore(r, "ev", label=3)  # type: ignore[arg-type]
    sem = PermitExpirableSemaphore(r, "ev", label="ev:{x}")
    sem.try_set_permits(2)
    events.add_listener(listen)
    try:
        pid = sem.acquire()
        sem.release(pid)
        leased = sem.acquire(lease_time=5)
        sem.release(leased)

        async def run() -> None:
            asem = AsyncPermitExpirableSemaphore(ar, "ev", label="ev:{x}", sync_client=r)
            apid = await asem.try_acquire(1)
            assert apid is not None
            await asem.release(apid)

        asyncio.run(run())
    finally:
        events.remove_listener(listen)
    assert [(e, d["owner"], d["label"], d["kind"] if e == "acquired" else d["reason"])
            for e, d in got][:2] == [("acquired", pid, "ev:{x}", "PermitExpirableSemaphore"),
                                      ("released", pid, "ev:{x}", "unlock")]
    assert [(e, d["kind"] if e == "acquired" else d["reason"]) for e, d in got[2:]] == [
        ("acquired", "AsyncPermitExpirableSemaphore"), ("released", "unlock")]
    assert got[2][1]["owner"] == got[3][1]["owner"] != pid
    assert all(d["lease"] is None and d["wait"] >= 0 for e, d in got if e == "acquired")
    assert all(d["held"] >= 0 for e, d in got if e == "released")
