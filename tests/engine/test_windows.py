"""Time windows on holds (issue #21, section 3): ``max_hold`` (never renewed past it, lost,
told once), ``warn_held_after`` (one warning, one event), ``release_as_lease`` (the engine
side of ``@locked(hold_at_least=...)``), and bad input refused before any command."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from django_rlock import LockNotOwnedError, PermitExpirableSemaphore, RLock
from django_rlock.engine import FairLock, FencedLock, ReadWriteLock, events

ROOT = Path(__file__).parents[2]


@pytest.fixture
def seen():
    got: list[tuple[str, dict]] = []

    def listen(event: str, data: dict) -> None:
        got.append((event, data))

    events.add_listener(listen)
    yield got
    events.remove_listener(listen)


def commands(r) -> int:
    """Commands sent (a script counts once), not those run inside scripts."""
    stats = r.info("commandstats")
    return sum(stats.get(k, {}).get("calls", 0) for k in ("cmdstat_evalsha", "cmdstat_eval"))


def test_a_looping_holder_past_max_hold_loses_the_lock_to_another_process(r, redis_server, seen):
    waiter = subprocess.Popen([sys.executable, "-m", "tests.engine._windows_proc",
                               redis_server.socket, "mh"], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline().strip() == "ready"
        told: list[tuple[str, str]] = []
        lock = RLock(r, "mh", watchdog_timeout=3.0, max_hold=3.0,
                     on_lost=lambda name, reason: told.append((name, reason)))
        state: dict[str, float] = {}
        stop = threading.Event()

        def loop_forever() -> None:  # a holder that never finishes (a deadlock, a loop)
            before = time.monotonic()  # max_hold counts from the acquire's send, after this
            lock.lock()
            state["at"] = before
            while not stop.is_set():
                time.sleep(0.01)
            state["lost"] = lock.is_lost()
            state["reason"] = lock.lost_reason()

        holder = threading.Thread(target=loop_forever, daemon=True)
        holder.start()
        while "at" not in state:
            time.sleep(0.005)
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        line = waiter.stdout.readline().split()
        assert line[0] == "got", line
        after = float(line[1]) - state["at"]
        print(f"another process got the lock {after:.3f} s after the looping holder took it")
        # max_hold 3 s: no lease ends later than 3 s after the acquire was sent (nor, but for
        # a rounding to the ms, sooner); the bound on top is generous (a loaded machine).
        assert 2.99 <= after <= 4.5
        stop.set()
        holder.join(5)
        assert state["lost"] and state["reason"] == "max_hold"
        time.sleep(0.2)
        assert told == [("mh", "max_hold")]
        lost = [d for e, d in seen if e == "lost" and d["name"] == "mh"]
        assert len(lost) == 1 and lost[0]["reason"] == "max_hold"
    finally:
        waiter.kill()
        waiter.wait()


def test_a_grant_after_a_long_wait_counts_max_hold_from_the_grant(r, redis_server):
    """A waiter in another process granted the lock after waiting longer than its max_hold
    holds it for max_hold from the grant, not from when it began to wait."""
    waiter = subprocess.Popen([sys.executable, "-m", "tests.engine._windows_proc",
                               redis_server.socket, "gr", "1.5"], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline().strip() == "ready"
        lock = RLock(r, "gr", watchdog_timeout=3.0)
        lock.lock()
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        time.sleep(2.5)  # it waits longer than its max_hold
        lock.unlock()  # grants it the lock
        line = waiter.stdout.readline().split()
        assert line[0] == "got" and line[2] == "False", line
    finally:
        waiter.kill()
        waiter.wait()


@pytest.mark.parametrize("watchdog_timeout", [3.0, 1.0])
def test_no_lease_ever_outlives_max_hold(r, watchdog_timeout):
    """The first lease (watchdog 3 s) and every renewal (watchdog 1 s: renewed every 1/3 s)
    are cut to end by max_hold, so a waiter's park on the PTTL it read never sleeps past it
    (expiry publishes nothing)."""
    lock = RLock(r, "cut", watchdog_timeout=watchdog_timeout, max_hold=2.0)
    lock.lock()
    t0 = time.monotonic()  # max_hold counts from the acquire's send, before this
    try:
        deadline_ms = 2000
        while time.monotonic() - t0 < 1.5:
            elapsed_ms = (time.monotonic() - t0) * 1000  # before the read: a bound on it
            left = r.pttl("cut")
            assert 0 < left <= deadline_ms - elapsed_ms + 50, (left, elapsed_ms)
            time.sleep(0.1)
        lock.lock()  # a reentry never sets a lease past it either
        elapsed_ms = (time.monotonic() - t0) * 1000
        assert r.pttl("cut") <= deadline_ms - elapsed_ms + 50
        lock.unlock()
        time.sleep(max(0.0, 2.2 - (time.monotonic() - t0)))
        assert not r.exists("cut") and lock.is_lost()
    finally:
        with pytest.raises(LockNotOwnedError):
            lock.unlock()


def test_warn_held_after_warns_once_per_hold(r, seen, caplog):
    caplog.set_level(logging.WARNING, logger="django_rlock")
    lock = RLock(r, "slow", watchdog_timeout=1.5, warn_held_after=1.0, label="slow:{n}")
    with lock:
        time.sleep(3.0)
        assert not lock.is_lost()
    warnings = [rec for rec in caplog.records if "warn_held_after" in rec.getMessage()]
    assert len(warnings) == 1 and "'slow'" in warnings[0].getMessage()
    long = [d for e, d in seen if e == "held_long"]
    assert len(long) == 1 and long[0]["label"] == "slow:{n}" and long[0]["threshold"] == 1.0
    assert 1.0 <= long[0]["held"] < 2.5  # said on a pool thread just after
    with lock:  # a new hold, warned again only if it lasts
        pass
    time.sleep(0.1)
    assert len([d for e, d in seen if e == "held_long"]) == 1


def test_a_hold_shorter_than_its_windows_costs_no_extra_command(r):
    lock = RLock(r, "quick", watchdog_timeout=3.0, max_hold=5.0, warn_held_after=1.0)
    plain = RLock(r, "quick2", watchdog_timeout=3.0)
    r.config_resetstat()
    with lock:
        pass
    windowed = commands(r)
    r.config_resetstat()
    with plain:
        pass
    assert windowed == commands(r) == 2


def test_a_renewed_permit_past_max_hold_comes_back(r, seen):
    sem = PermitExpirableSemaphore(r, "pm", watchdog_timeout=1.5, max_hold=1.5)
    sem.try_set_permits(1)
    pid = sem.acquire()
    assert sem.try_acquire() is None
    t0 = time.monotonic()
    got = sem.try_acquire(wait_time=5)
    print(f"permit back after {time.monotonic() - t0:.2f} s")
    assert got is not None and time.monotonic() - t0 < 2.5
    time.sleep(0.2)  # told on a pool thread, just after the sweep
    assert [d["reason"] for e, d in seen if e == "lost"] == ["max_hold"]
    assert not sem.try_release(pid)
    sem.release(got)


def test_read_and_write_holds_honour_max_hold(r):
    rw = ReadWriteLock(r, "rwm", watchdog_timeout=3.0, max_hold=1.0)
    rw.read_lock().lock()
    writer = ReadWriteLock(r, "rwm").write_lock()
    got: list[float] = []

    def write() -> None:  # another owner (this thread asking would be an upgrade: refused)
        t0 = time.monotonic()
        if writer.try_lock(wait_time=5):
            got.append(time.monotonic() - t0)
            writer.unlock()

    t = threading.Thread(target=write)
    t.start()
    t.join(10)
    assert got and got[0] < 3.0 and rw.read_lock().is_lost()


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (0, ValueError),
                                        (float("nan"), ValueError), (float("inf"), ValueError),
                                        ("3", TypeError), (True, TypeError)])
def test_bad_windows_are_refused_before_any_command(r, bad, error):
    r.config_resetstat()
    for make in (lambda **kw: RLock(r, "bad", **kw), lambda **kw: FairLock(r, "bad", **kw),
                 lambda **kw: FencedLock(r, "bad", **kw),
                 lambda **kw: ReadWriteLock(r, "bad", **kw),
                 lambda **kw: PermitExpirableSemaphore(r, "bad", **kw)):
        for option in ("max_hold", "warn_held_after"):
            with pytest.raises(error, match="'bad'"):
                make(**{option: bad})
    with pytest.raises(ValueError, match="longer than max_hold"):
        RLock(r, "bad", max_hold=2).try_lock(lease_time=3)
    with pytest.raises(ValueError, match="longer than max_hold"):
        PermitExpirableSemaphore(r, "bad", max_hold=2).try_acquire(lease_time=3)
    with pytest.raises(TypeError, match="'bad'"):
        RLock(r, "bad").release_as_lease("1")
    assert commands(r) == 0


def test_a_hold_released_as_a_lease_keeps_everyone_out_until_it_ends(r):
    lock = RLock(r, "win")
    lock.lock()
    assert lock.release_as_lease(1.0) is True
    assert 900 <= r.pttl("win") <= 1000
    assert not lock.try_lock()  # the same thread too: nobody re-enters a lease
    with pytest.raises(LockNotOwnedError):
        lock.unlock()
    other = threading.Thread(target=lambda: out.append(RLock(r, "win").try_lock()))
    out: list[bool] = []
    other.start()
    other.join()
    assert out == [False]
    t0 = time.monotonic()
    assert lock.try_lock(wait_time=3)  # woken by the lease's end, not a longer park
    assert 0.7 < time.monotonic() - t0 < 2.5
    lock.unlock()


def test_a_reentrant_hold_is_never_turned_into_a_lease(r):
    lock = RLock(r, "re")
    lock.lock()
    lock.lock()
    assert lock.release_as_lease(5.0) is False  # one level off, the outer hold stays
    assert lock.hold_count() == 1 and r.pttl("re") > 5000
    lock.unlock()
    assert not r.exists("re")


@pytest.mark.parametrize("kind", ["fenced", "write", "non_reentrant", "fair"])
def test_every_exclusive_kind_can_leave_a_lease(r, kind):
    from django_rlock.engine.listing import Locks
    from django_rlock.lockkinds import lock_of_kind

    lock = lock_of_kind(kind, r, f"k-{kind}", "")
    assert lock.try_lock()
    assert lock.release_as_lease(1.0) is True
    fields = [f.decode() for f in r.hgetall(f"k-{kind}") if f != b"mode"]
    assert len(fields) == 1 and "~lease:" in fields[0]
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(lock_of_kind(kind, r, f"k-{kind}", "")
                                                   .try_lock()))
    t.start()
    t.join()
    assert out == [False] and not lock.try_lock()
    listed = Locks(r, prefix="").read([f"k-{kind}"])
    assert len(listed) == 1 and listed[0].holders[0].host is not None  # the index names it
    time.sleep(1.3)
    assert lock.try_lock()
    lock.unlock()


def test_an_asyncio_hold_honours_max_hold_and_leaves_a_lease(redis_server, r):
    import asyncio

    import redis.asyncio

    from django_rlock import AsyncRLock

    async def main() -> tuple[bool, str | None, bool, bool]:
        ar = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        try:
            lock = AsyncRLock(ar, "amh", watchdog_timeout=3.0, max_hold=1.0)
            await lock.lock()
            await asyncio.sleep(1.2)
            lost, reason = lock.is_lost(), lock.lost_reason()
            window = AsyncRLock(ar, "alease")
            await window.lock()
            leased = await window.release_as_lease(2.0)
            again = await window.try_lock()
            return lost, reason, leased, again
        finally:
            await ar.aclose()

    assert asyncio.run(main()) == (True, "max_hold", True, False)
    assert not r.exists("amh") and 1500 < r.pttl("alease") <= 2000


def test_a_lease_mode_hold_is_warned_about_too(r, seen):
    lock = RLock(r, "lw", warn_held_after=0.5)
    lock.lock(lease_time=1.5)
    time.sleep(0.8)
    lock.unlock()
    assert [d["name"] for e, d in seen if e == "held_long"] == ["lw"]
