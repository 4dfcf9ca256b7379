"""Enqueue de-duplication and the calls it must not swallow (audit 5, items 2-5).

The first identical call waits on the queue "idle", which no worker consumes (as behind busy
workers); the calls under test go to the in-process threads worker.
"""

from __future__ import annotations

import time

import pytest
from celery import chain, chord, group

from tests.celery.conftest import entries


@pytest.fixture
def idle(redis_server):
    """Options for a call that stays queued; the queue is emptied afterwards."""
    yield {"queue": "idle"}
    broker = redis_server.client(db=3)
    broker.delete("idle")
    broker.close()


def test_chain_chord_and_link_are_not_lost_to_a_queued_duplicate(threads_worker, locks, log,
                                                                   idle):
    from tests.celery.crash_tasks import after, block, collect

    queued = block.apply_async((1,), **idle)
    assert block.delay(1).id == queued.id  # a plain duplicate is refused
    assert chain(block.s(1), after.s()).apply_async().get(timeout=20) == 2
    assert chord([block.s(1), block.s(2)], collect.s()).apply_async().get(timeout=20) == 3
    linked = block.apply_async((1,), link=after.s())
    assert linked.id != queued.id
    assert linked.get(timeout=20) == 1
    deadline = time.monotonic() + 20
    while len(entries(log, "after", "1")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(entries(log, "after", "1")) == 2  # the chain's step and the link both ran
    assert entries(log, "chord", "1,2")


def test_calls_whose_id_is_kept_elsewhere_are_not_turned_away(threads_worker, locks, idle):
    """A chain's last step (sent with an empty ``chain``), a group's members (the group's
    result holds their ids) and a call given its ``task_id``: turned away, their id would
    never get a result and ``.get()`` would hang."""
    from tests.celery.crash_tasks import after, block

    for n in (1, 3, 4):
        block.apply_async((n,), **idle)
    assert block.apply_async((3,), task_id="chosen-3").get(timeout=20) == 3
    assert group(block.s(3), block.s(4)).apply_async().get(timeout=20) == [3, 4]
    assert chain(after.s(0), block.s()).apply_async().get(timeout=20) == 1


def test_a_mark_lives_past_the_countdown(locks, idle):
    from tests.celery.crash_tasks import short_mark  # dedupe_ttl=2

    first = short_mark.apply_async((5,), countdown=4, **idle)
    time.sleep(2.5)  # past dedupe_ttl, before the task may start
    assert short_mark.apply_async((5,), **idle).id == first.id


def test_an_expired_call_does_not_refuse_a_new_one(threads_worker, locks, idle):
    from tests.celery.crash_tasks import short_mark

    first = short_mark.apply_async((6,), expires=0.5, **idle)
    time.sleep(0.7)
    again = short_mark.delay(6)
    assert again.id != first.id
    assert again.get(timeout=20) == 6


def test_revoke_call_frees_the_mark_at_once(threads_worker, locks, idle, celery_app):
    from tests.celery.crash_tasks import short_mark

    first = short_mark.apply_async((7,), **idle)
    assert short_mark.delay(7).id == first.id
    assert short_mark.revoke_call((7,)) == first.id
    assert short_mark.revoke_call((7,)) is None  # nothing left to revoke
    again = short_mark.delay(7)
    assert again.id != first.id
    assert again.get(timeout=20) == 7


def test_mixed_key_dict_is_a_clear_error_before_enqueueing(locks):
    from tests.celery.crash_tasks import short_mark

    with pytest.raises(TypeError, match=r"'tests.celery.crash_tasks.short_mark'.*'when'"):
        short_mark.delay(1, when={1: "a", "b": 2})
    assert not list(locks.scan_iter("ct:rlock:dedupe:*"))


def test_a_mark_lives_past_a_retry_countdown(threads_worker, locks, log):
    from tests.celery.crash_tasks import retry_later  # dedupe_ttl=1, retries after 3 s

    first = retry_later.delay(8)
    started = time.monotonic()
    while not entries(log, "rtc", "8") and time.monotonic() - started < 20:
        time.sleep(0.02)
    time.sleep(1.5)  # past dedupe_ttl, before the retry runs
    assert retry_later.delay(8).id == first.id
    assert first.get(timeout=20) == 8
    assert [e[1] for e in entries(log, "rtc", "8")] == ["0", "1"]  # one task, run twice
