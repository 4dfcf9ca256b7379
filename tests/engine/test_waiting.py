"""Waiters sleep on the shared subscription and wake on release, on PTTL, or at budget end."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from django_rlock import LockNotOwnedError, RLock
from django_rlock.engine import pubsub
from tests.conftest import script_calls


def timed_lock(lock: RLock, **kw) -> tuple[bool, float]:
    start = time.monotonic()
    if kw:
        ok = lock.try_lock(**kw)
    else:
        lock.lock()
        ok = True
    return ok, time.monotonic() - start


def test_waiter_wakes_on_unlock_without_polling(r, holders):
    lock = RLock(r, "wake")
    holder, waiter = holders(), holders()
    holder.call(lambda: lock.lock())  # watchdog mode: PTTL 30 s, so only a message wakes early
    r.config_resetstat()
    result = waiter.submit(lambda: timed_lock(lock))
    time.sleep(2.0)
    time.monotonic()
    holder.call(lock.unlock)
    ok, waited = result(20)
    assert ok and 1.9 < waited < 3.5
    # The waiter's acquire attempts: first try, the retry after subscribing, the one after
    # the wake-up; plus the holder's one release.
    assert script_calls(r) - 1 <= 3
    waiter.call(lock.unlock)


def test_waiter_wakes_when_the_holders_lease_expires(r, holders):
    lock = RLock(r, "expire")
    holder, waiter = holders(), holders()
    holder.call(lambda: lock.lock(lease_time=1.5))  # never unlocked: expiry publishes nothing
    r.config_resetstat()
    ok, waited = waiter.call(lambda: timed_lock(lock), timeout=20)
    assert ok and 1.0 < waited < 4.0
    assert script_calls(r) <= 4  # it slept on the PTTL, it did not poll
    waiter.call(lock.unlock)


def test_try_lock_gives_up_after_its_budget(r, holders):
    lock = RLock(r, "budget")
    holders().call(lambda: lock.lock())
    r.config_resetstat()
    ok, waited = timed_lock(lock, wait_time=1.0)
    assert ok is False and 0.95 <= waited < 3.0
    # Its attempts (one before, one after its subscription is confirmed), and its entry in
    # the hand-off queue taken back as it gives up.
    assert script_calls(r) <= 4
    ok, waited = timed_lock(lock, wait_time=0)
    assert ok is False and waited < 1.0


def test_force_unlock_wakes_waiters(r, holders):
    lock = RLock(r, "forced")
    holder, waiter = holders(), holders()
    holder.call(lambda: lock.lock())
    result = waiter.submit(lambda: timed_lock(lock))
    time.sleep(0.5)
    assert lock.force_unlock() is True
    ok, waited = result(20)
    assert ok and waited < 3.0  # the lock's PTTL was 30 s
    assert waiter.call(lock.is_held_by_current_thread)
    waiter.call(lock.unlock)


def test_release_in_another_process_wakes_our_waiter(r, holders):
    """The message path alone (no local shortcut): a release by a different client id."""
    lock = RLock(r, "remote")
    r.hset("remote", "another-process:1", 1)
    r.pexpire("remote", 60_000)
    result = holders().submit(lambda: timed_lock(lock))
    time.sleep(0.5)
    r.eval("redis.call('del', KEYS[1]); return redis.call('publish', KEYS[2], '0')", 2,
           "remote", "redisson_lock__channel:{remote}")
    ok, waited = result(20)
    assert ok and waited < 3.0


def test_many_waiters_share_one_pubsub_connection(r, holders):
    locks = [RLock(r, f"shared:{i}") for i in range(3)]
    owner = holders()
    for lock in locks:
        owner.call(lambda lock=lock: lock.lock())
    waiters = [holders() for _ in range(6)]
    results = [w.submit(lambda i=i: timed_lock(locks[i % 3], wait_time=20))
               for i, w in enumerate(waiters)]
    time.sleep(1.0)
    ours = [c for c in r.client_list() if c.get("name") == pubsub.subscriber_name()]
    assert len(ours) == 1  # one connection for every waiter of every key
    assert int(ours[0]["sub"]) >= 3
    channels = set(r.pubsub_channels())
    assert {f"redisson_lock__channel:{{shared:{i}}}".encode() for i in range(3)} <= channels
    for lock in locks:
        owner.call(lock.unlock)
    # Each winner releases so the next waiter of its key gets in.
    done = 0
    deadline = time.monotonic() + 20
    pending = list(zip(waiters, results, strict=False))
    while pending and time.monotonic() < deadline:
        for w, res in list(pending):
            try:
                ok, _ = res(0.05)
            except TimeoutError:
                continue
            assert ok
            w.call(lambda w=w: [lk.unlock() for lk in locks if lk.is_held_by_current_thread()])
            pending.remove((w, res))
            done += 1
    assert done == 6


def test_idle_channels_are_unsubscribed(r, holders):
    lock = RLock(r, "idle")
    holder = holders()
    holder.call(lambda: lock.lock())
    result = holders().submit(lambda: timed_lock(lock, wait_time=0.3))
    assert result(10)[0] is False
    channel = b"redisson_lock__channel:{idle}"
    assert channel in r.pubsub_channels()
    deadline = time.monotonic() + pubsub.LINGER + 5
    while channel in r.pubsub_channels() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert channel not in r.pubsub_channels()
    holder.call(lock.unlock)


def test_waiter_survives_a_killed_pubsub_connection(r, holders):
    lock = RLock(r, "killed")
    holder, waiter = holders(), holders()
    holder.call(lambda: lock.lock())
    result = waiter.submit(lambda: timed_lock(lock))
    time.sleep(0.5)
    assert r.client_kill_filter(_type="pubsub") >= 1
    time.sleep(0.5)
    assert b"redisson_lock__channel:{killed}" in r.pubsub_channels()  # subscribed again
    holder.call(lock.unlock)
    ok, waited = result(20)
    assert ok and waited < 5.0  # well before the 30 s PTTL
    waiter.call(lock.unlock)


def test_waiters_in_one_process_take_turns(r):
    """Eight threads, one key: every thread gets the lock, exclusion holds, no polling."""
    lock = RLock(r, "turns")
    counter = [0]
    inside = [0]
    overlap = []
    per_thread = 25

    def work() -> None:
        for _ in range(per_thread):
            with lock:
                inside[0] += 1
                if inside[0] != 1:
                    overlap.append(True)
                v = counter[0]
                time.sleep(0.0005)
                counter[0] = v + 1
                inside[0] -= 1

    r.config_resetstat()
    threads = [threading.Thread(target=work) for _ in range(8)]
    assert not r.exists("turns")
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert counter[0] == 8 * per_thread and not overlap
    # No hold is orphaned: a hand-off racing the heir's own acquire once left a count of 2.
    assert not r.exists("turns")
    # One attempt and one release per acquisition, plus few failed retries.
    assert script_calls(r) <= 3.5 * 8 * per_thread


def test_hand_off_to_a_waiter_of_this_process_takes_one_round_trip(r, holders):
    """The release script gives the lock to the queued thread: never free, no publish,
    no acquire attempt by the waiter; and the new holder is renewed by our watchdog."""
    lock = RLock(r, "handoff", watchdog_timeout=1.0)
    holder, waiter = holders(), holders()
    holder.call(lambda: lock.lock())
    result = waiter.submit(lambda: timed_lock(lock))
    time.sleep(0.5)  # the waiter is parked
    spy = r.pubsub()
    spy.subscribe("redisson_lock__channel:{handoff}")
    assert spy.get_message(timeout=2)["type"] == "subscribe"
    # The spy is a second subscriber, as another process's waiter would be: it is gone
    # before the release, so the release sees only this process and hands off.
    spy.unsubscribe()
    spy.get_message(timeout=2)
    r.config_resetstat()
    holder.call(lock.unlock)
    ok, _ = result(10)
    assert ok and script_calls(r) == 1  # the release; the waiter sent nothing
    assert r.info("commandstats").get("cmdstat_publish") is None
    assert waiter.call(lock.hold_count) == 1
    time.sleep(2.0)  # twice the watchdog timeout: the new holder is renewed
    assert waiter.call(lock.is_held_by_current_thread)
    waiter.call(lock.unlock)
    assert not r.exists("handoff")
    spy.close()


def test_no_hand_off_while_another_process_waits(r, holders):
    lock = RLock(r, "fair")
    holder, waiter = holders(), holders()
    holder.call(lambda: lock.lock())
    result = waiter.submit(lambda: timed_lock(lock, wait_time=10))
    time.sleep(0.5)
    other = r.pubsub()  # another process's waiter
    other.subscribe("redisson_lock__channel:{fair}")
    assert other.get_message(timeout=2)["type"] == "subscribe"
    holder.call(lock.unlock)
    msg = other.get_message(timeout=2)
    assert msg is not None and msg["type"] == "message"  # the lock was freed and announced
    ok, _ = result(10)
    assert ok
    waiter.call(lock.unlock)
    other.close()


@pytest.mark.parametrize("case", ["other database", "braced key"])
def test_hand_off_never_crosses_databases_or_shared_channels(redis_server, r, holders, case):
    """{K} and K share a channel, and a channel names no database: a release of one lock
    must never hand another lock's waiter a lock (two holders)."""
    name = "cx1" if case == "other database" else "cx2"  # separate channels per case
    client = redis_server.client(db=3) if case == "other database" else r
    key = name if case == "other database" else "{" + name + "}"
    client.delete(key)
    client.hset(key, "another-process:1", 1)  # held elsewhere for the test's length
    client.pexpire(key, 60_000)
    mine = RLock(r, name)
    holder = holders()
    holder.call(mine.lock)
    waiter = holders().submit(lambda: timed_lock(RLock(client, key), wait_time=1.5))
    time.sleep(0.5)
    holder.call(mine.unlock)
    assert waiter(10)[0] is False
    assert not r.exists(name)  # freed, not handed to a waiter of another lock
    assert client.hkeys(key) == [b"another-process:1"]


def test_a_waiters_claim_never_counts_a_handed_lock_twice(r):
    from django_rlock.engine.scripts import ACQUIRE_SCRIPT, CLAIMED, call_once

    r.hset("claimed", "me:1", 1)  # handed to "me" by a release whose reply was lost
    keys, args = ("claimed", "rlock-index:"), (5000, "me:1", "{}", "claim")
    assert call_once(r, ACQUIRE_SCRIPT, keys, args) == CLAIMED  # held: taken as it is
    assert call_once(r, ACQUIRE_SCRIPT, keys, args) == CLAIMED
    assert r.hget("claimed", "me:1") == b"1" and 4000 < r.pttl("claimed") <= 5000


def test_a_waiter_that_gives_up_during_a_hand_off_gives_it_back_itself(redis_server, r, holders):
    """The releaser's reply is late: the heir's budget ends while the hand-off is in flight.
    The heir waits for the outcome (one round trip) instead of leaving the hand-off to be
    undone later on its behalf, so no hold it believes it has is ever released by another."""
    from tests.faultproxy import FaultProxy

    proxy = FaultProxy(redis_server.socket)
    slow = redis.Redis(port=proxy.port)
    # One client for all three: a hand-off happens only within one manager (one "process").
    releaser_lock = RLock(slow, "aba")
    heir_lock = RLock(slow, "aba")
    releaser, heir, other = holders(), holders(), holders()
    releaser.call(releaser_lock.lock)
    first = heir.submit(lambda: heir_lock.try_lock(wait_time=0.6))
    time.sleep(0.3)
    third = other.submit(lambda: timed_lock(RLock(slow, "aba"), wait_time=5))  # queued behind
    r.config_resetstat()
    proxy.delay_next_reply = 0.8  # the release runs now; its reply comes after the heir gave up
    releaser.call(releaser_lock.unlock)
    assert "cmdstat_publish" not in r.info("commandstats")  # it was a hand-off

    # It either waited out the in-flight hand-off and holds the lock (True), or gave up and
    # takes it again now; either way nobody may take the lock from it while it is inside.
    got = first(5)

    def again() -> str:
        if not got and not heir_lock.try_lock(wait_time=3):
            return "not acquired"
        time.sleep(0.5)
        try:
            heir_lock.unlock()
        except LockNotOwnedError:
            return "lost"
        return "ok"

    assert heir.call(again, timeout=10) == "ok"
    assert third(10)[0] is True
    other.call(lambda: RLock(slow, "aba").unlock())
    proxy.close()
    slow.close()
