"""Never a silent second holder: grants that went stale before their waiter could use them.

A heir whose process was frozen (SIGSTOP) past its grant lease, a grant to a wait that had
already ended, a withdrawal whose round trip failed: each used to leave someone believing it
held a lock that another owner had, or holding one nobody could take (issue #25).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import redis

from django_rlock import RLock
from django_rlock.engine import identity, withdrawals
from django_rlock.engine.naming import handoff_queue, handoff_waiters, index_key
from django_rlock.engine.scripts import ACQUIRE_SCRIPT, call_once
from tests.engine.test_handoff import in_line, procs, until  # noqa: F401  (procs: a fixture)

GRANT_LEASE = 1.0  # the frozen heirs' grant lease (their process's pubsub.GRANT_LEASE)


def _frozen_heir(r, redis_server, holders, procs, name: str, budget: float,  # noqa: F811
                 line: bool, mode: str = "try_report"):
    """A thread of ours holds ``name``; a waiter process is in line for it, SIGSTOPped; the
    release grants it the lock; the grant runs out while it is frozen; another owner of ours
    takes the lock; the heir is let go (SIGCONT). Returns (heir process, the new holder, its
    lock)."""
    lock = RLock(r, name)
    first = holders()
    first.call(lock.lock)
    args = (redis_server.socket, name, str(budget)) + (("line",) if line else ())
    heir = procs(mode, *args, grant_lease=GRANT_LEASE)
    owner = heir.expect("waiting").split()[1]
    until(lambda: in_line(r, name) == 1, what="the heir in line")
    os.kill(heir.p.pid, signal.SIGSTOP)
    try:
        first.call(lock.unlock)
        assert r.hkeys(name) == [owner.encode()], "the release granted the lock to the heir"
        until(lambda: not r.exists(name), timeout=GRANT_LEASE + 5, what="the grant running out")
        second = holders()
        assert second.call(lambda: lock.try_lock()), "another owner takes the free lock"
        assert second.call(identity.thread_owner).encode() in r.hkeys(name)
    finally:
        os.kill(heir.p.pid, signal.SIGCONT)
    return heir, second, lock


@pytest.mark.parametrize("mode", ["try_report", "atry_report"])
def test_a_frozen_heir_keeps_waiting_and_takes_the_lock_only_when_it_is_free(
        r, redis_server, holders, procs, mode):  # noqa: F811
    name = f"frozen:{mode}"
    heir, second, lock = _frozen_heir(r, redis_server, holders, procs, name, 20.0,
                                      line=False, mode=mode)
    # Its grant, read now, is older than its lease: checked, found gone, and it waits on.
    time.sleep(1.5)
    assert heir.p.poll() is None
    assert len(r.hkeys(name)) == 1  # the second owner's field only
    second.call(lock.unlock)
    result = json.loads(heir.expect("result", timeout=10).split(" ", 1)[1])
    assert result["got"] and result["held"] and not result["lost"], result
    assert len(result["fields"]) == 1
    heir.send("unlock")
    heir.expect("unlocked")
    assert not r.exists(name)


def test_a_frozen_heir_with_a_wake_line_is_not_told_it_holds_the_lock(
        r, redis_server, holders, procs):  # noqa: F811
    heir, second, lock = _frozen_heir(r, redis_server, holders, procs, "frozen:line", 6.0,
                                      line=True)
    result = json.loads(heir.expect("result", timeout=15).split(" ", 1)[1])
    # Before the fix: got True, held False, lost False (a silent second holder).
    assert result == {**result, "got": False, "held": False}, result
    assert result["fields"] == [second.call(identity.thread_owner)]
    assert r.hkeys("frozen:line") == [second.call(identity.thread_owner).encode()]
    second.call(lock.unlock)


def _stale_entry(r, name: str, owner: str, token: str) -> None:
    """What a registering attempt leaves in line (invariant 20), for a wait that is over."""
    keys = (name, index_key(""), handoff_queue(name), handoff_waiters(name))
    assert call_once(r, ACQUIRE_SCRIPT, keys, (30000, owner, "{}", "", token, -1, 5000, 3000))


def test_a_grant_to_a_wait_that_ended_is_taken_as_a_fresh_hold(r, holders):
    """The owner's next lock() takes such a grant at count 1: its unlock frees the lock (it
    used to count on top of the grant and keep a phantom hold alive forever)."""
    name = "stale:fresh"
    lock = RLock(r, name)
    holder, late = holders(), holders()
    holder.call(lock.lock)
    owner = late.call(identity.thread_owner)
    _stale_entry(r, name, owner, owner + "#1")
    holder.call(lock.unlock)  # granted to the wait that is over
    assert r.hgetall(name) == {owner.encode(): b"1"}
    late.call(lock.lock)
    assert late.call(lock.hold_count) == 1
    late.call(lock.lock)  # a real reentry still counts
    assert late.call(lock.hold_count) == 2
    late.call(lock.unlock)
    late.call(lock.unlock)
    assert not r.exists(name)


def test_a_withdrawal_whose_round_trip_failed_is_sent_again(r, redis_server, holders):
    """A wait that ends on an error (its retry timed out) with its withdrawal failing too
    leaves its entry in line; it is withdrawn once the server answers again, not granted the
    lock by the next release for nobody to take."""
    name = "stale:withdraw"
    holder = holders()
    holder.call(lambda: RLock(r, name).lock(lease_time=2.0))
    waiter_client = redis.Redis(unix_socket_path=redis_server.socket, socket_timeout=0.3)
    waiter = RLock(waiter_client, name)
    got: list[object] = []

    def wait() -> None:
        try:
            waiter.lock()  # no budget: its entry lives until the holder's PTTL + slack
            got.append(True)
        except redis.TimeoutError as exc:
            got.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    until(lambda: in_line(r, name) == 1, what="the waiter in line")
    time.sleep(1.0)
    # Its retry at the holder's expiry, and then its withdrawal, time out.
    r.execute_command("CLIENT", "PAUSE", 2500, "WRITE")
    t.join(5)
    assert len(got) == 1 and isinstance(got[0], redis.TimeoutError)
    assert withdrawals.pending() == 1
    assert in_line(r, name) == 1  # the failed withdrawal did not land
    until(lambda: in_line(r, name) == 0, timeout=6, what="the entry withdrawn at last")
    until(lambda: withdrawals.pending() == 0, timeout=3, what="nothing left to withdraw")
    waiter_client.close()


def test_an_acquire_whose_reply_came_after_its_lease_is_not_a_hold(r, redis_server, holders):
    """The acquire ran, but its reply reached the owner only after the lease it set had run
    out and another owner took the lock (a process frozen between send and read, a stalled
    network): one renewal checks it, and the caller is told it did not get the lock."""
    from tests.faultproxy import FaultProxy

    proxy = FaultProxy(redis_server.socket)
    slow = redis.Redis(port=proxy.port)
    try:
        late, waiter = RLock(slow, "stale:late", watchdog_timeout=1.0), holders()
        warm = RLock(slow, "stale:warm")
        waiter.call(lambda: warm.try_lock() and warm.unlock())  # its thread's connection made
        proxy.delay_next_reply = 1.6
        attempt = waiter.submit(late.try_lock)
        until(lambda: r.exists("stale:late"), what="the acquire run on the server")
        until(lambda: not r.exists("stale:late"), timeout=3, what="its 1 s lease run out")
        other, owner = holders(), None
        assert other.call(RLock(r, "stale:late").try_lock)
        owner = other.call(identity.thread_owner)
        assert attempt(10) is False  # before the fix: True, with another owner in the hash
        assert r.hkeys("stale:late") == [owner.encode()]
        assert not late.is_lost()  # it never held it, so it lost nothing
        other.call(RLock(r, "stale:late").unlock)
    finally:
        slow.close()
        proxy.close()


def test_an_orphaned_heirs_entry_goes_at_once_not_at_the_next_tick(r, monkeypatch):
    """Our release put a heir of ours in line (invariant 44) that had left meanwhile: its
    entry is withdrawn right away (``at_once``), since the next release would grant the lock
    to nobody; a failed withdrawal's retry still waits for the tick (found in review: the
    orphan's entry waited a whole ``RETRY_EVERY``)."""
    monkeypatch.setattr(withdrawals, "RETRY_EVERY", 5.0)
    r.hset("orphaned-waiters", mapping={"gone:1#1p": "x", "gone:2#2p": "y"})
    withdrawals.later(r, "orphaned-waiters", "gone:1#1p", time.monotonic() + 30, at_once=True)
    until(lambda: not r.hexists("orphaned-waiters", "gone:1#1p"), timeout=2,
          what="the orphan's entry withdrawn at once")
    withdrawals.later(r, "orphaned-waiters", "gone:2#2p", time.monotonic() + 30)
    time.sleep(1.0)
    assert r.hexists("orphaned-waiters", "gone:2#2p")  # a retry: at the next tick
    withdrawals.later(r, "orphaned-waiters", "gone:2#2p", time.monotonic() + 30, at_once=True)
    until(lambda: not r.exists("orphaned-waiters"), timeout=2, what="both withdrawn")
