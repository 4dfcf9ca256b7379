"""The hand-off between threads of one process: the next holder runs before the releasing
thread goes on (``wait.settings.HANDOVER_WAIT``), by either way a release of ours gives it the
lock (to a parked waiter it reserved, or to a registered waiter by token)."""

from __future__ import annotations

import threading
import time

import pytest

from django_rlock import RLock
from django_rlock.engine.wait import settings
from django_rlock.engine.wait.handoff import HandOffs


@pytest.mark.parametrize("threads", [2, 3])
def test_a_thread_handed_the_lock_runs_before_the_releasing_thread_goes_on(r, monkeypatch,
                                                                           threads):
    # Long enough that an unlock ending by the timeout, not by the heir, shows.
    monkeypatch.setattr(settings, "HANDOVER_WAIT", 2.0)
    ways = {"reserved": 0, "by token": 0}
    resolve, take_grant = HandOffs.resolve, HandOffs.take_grant

    def spy_resolve(self, channel, w, granted, *rest):
        ways["reserved"] += bool(granted)
        return resolve(self, channel, w, granted, *rest)

    def spy_take_grant(self, ch, w, grant_ms, since=None, by_release=False):
        ways["by token"] += by_release
        return take_grant(self, ch, w, grant_ms, since, by_release)

    monkeypatch.setattr(HandOffs, "resolve", spy_resolve)
    monkeypatch.setattr(HandOffs, "take_grant", spy_take_grant)

    log: list[tuple[str, int]] = []  # ("got" | "unlocked", thread), in the order they ran
    unlock_took: list[float] = []
    errors: list[BaseException] = []

    def contend(me: int) -> None:
        lock = RLock(r, "handover")
        try:
            for _ in range(12):
                assert lock.try_lock(wait_time=30)
                log.append(("got", me))  # (list.append: no switch of threads in between)
                time.sleep(0.02)  # the others queue meanwhile
                t = time.monotonic()
                lock.unlock()
                log.append(("unlocked", me))
                unlock_took.append(time.monotonic() - t)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=contend, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    assert not errors and len(unlock_took) == 12 * threads

    # Every hand-off: the heir's "got" against its releaser's "unlocked" of that hold (a
    # hand-off back to the same thread has no heir).
    heir_first = handoffs = 0
    holder, held_at = None, -1
    for i, (event, who) in enumerate(log):
        if event != "got":
            continue
        if holder is not None and holder != who:
            handoffs += 1
            released_at = log.index(("unlocked", holder), held_at)
            heir_first += released_at > i
        holder, held_at = who, i
    assert handoffs >= 10 * threads
    # The releasing thread waited for its heir: nearly always the heir ran first (a loaded
    # machine may deschedule a heir long enough for the interpreter to switch anyway).
    assert heir_first >= 0.8 * handoffs, (heir_first, handoffs, ways)
    # ... and went on as soon as the heir had run, not at the end of HANDOVER_WAIT.
    assert max(unlock_took) < 1.5, sorted(unlock_took)[-3:]
    # Two threads: the waiter registered in Redis with its first attempt, and the release
    # grants it by token. Three: the third thread parks behind the queued one without an
    # attempt, and the release hands it the lock as the heir it reserved.
    assert ways["by token" if threads == 2 else "reserved"] >= 0.8 * handoffs, (ways, handoffs)
    assert not r.exists("handover")

