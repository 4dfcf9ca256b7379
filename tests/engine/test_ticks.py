"""The beat's progress script (``engine/ticks.py``, ``lua/beat_advance.lua``) against real
``Leader`` terms: a tick is advanced, once, only by a term Redis still has; a stale or
deposed term changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from django_rlock.engine import Leader
from django_rlock.engine.ticks import NOT_YET, PAST, SEND, STALE, TickProgress

S = 1_000_000


@pytest.fixture
def leaders(r: redis.Redis) -> Iterator[list[Leader]]:
    made: list[Leader] = []
    yield made
    for leader in made:
        leader.stop(timeout=5)


def elected(r: redis.Redis, leaders: list[Leader]) -> Leader:
    leader = Leader(r, "ticks", "t:", watchdog_timeout=5.0).start()
    leaders.append(leader)
    assert leader.wait_elected(10)
    return leader


def test_a_due_tick_is_sent_once_and_the_progress_follows(r: redis.Redis,
                                                          leaders: list[Leader]) -> None:
    a = elected(r, leaders)
    progress = TickProgress(a.client, a.key, a.token_key)
    now = progress.now()
    term, owner = a.term, a.owner
    assert term is not None and owner is not None
    first = progress.advance(term, owner, "e", now - 5 * S, now - 6 * S)
    assert (first.code, first.progress) == (SEND, now - 5 * S)
    assert progress.advance(term, owner, "e", now - 5 * S, now - 6 * S).code == PAST
    assert progress.advance(term, owner, "e", now - 6 * S, now - 7 * S).code == PAST
    ahead = progress.advance(term, owner, "e", now + 60 * S, now - 5 * S)
    assert (ahead.code, ahead.progress) == (NOT_YET, now - 5 * S)
    assert progress.load() == {"e": now - 5 * S}
    assert abs(progress.now() - ahead.now) < 2 * S  # the estimate follows the server's TIME


def test_an_entry_without_progress_is_anchored_at_the_base_even_when_not_due(
        r: redis.Redis, leaders: list[Leader]) -> None:
    a = elected(r, leaders)
    progress = TickProgress(a.client, a.key, a.token_key)
    now = progress.now()
    assert progress.advance(a.term, a.owner, "new", now + 60 * S, now - S).code == NOT_YET
    assert progress.load() == {"new": now - S}


def test_a_term_that_ended_is_refused_and_writes_nothing(r: redis.Redis,
                                                         leaders: list[Leader]) -> None:
    a = elected(r, leaders)
    old_term, old_owner = a.term, a.owner
    progress = TickProgress(a.client, a.key, a.token_key)
    now = progress.now()
    assert progress.advance(old_term, old_owner, "e", now - 3 * S, now - 4 * S).code == SEND
    b = Leader(r, "ticks", "t:", watchdog_timeout=5.0).start()
    leaders.append(b)
    a.stop(timeout=5)  # hands over
    assert b.wait_elected(10)
    assert b.term > old_term
    stale = progress.advance(old_term, old_owner, "e", now - S, now - 3 * S)
    assert (stale.code, stale.progress) == (STALE, None)
    assert progress.advance(old_term, old_owner, "other", now - S, now - 3 * S).code == STALE
    assert progress.load() == {"e": now - 3 * S}
    # The new term goes on from the progress the old one left.
    assert progress.advance(b.term, b.owner, "e", now - 3 * S, now - 4 * S).code == PAST
    assert progress.advance(b.term, b.owner, "e", now - S, now - 3 * S).code == SEND


def test_a_deposed_leader_is_refused_before_it_hears_of_it(r: redis.Redis,
                                                           leaders: list[Leader]) -> None:
    a = elected(r, leaders)
    term, owner = a.term, a.owner
    progress = TickProgress(a.client, a.key, a.token_key)
    now = progress.now()
    a.lock.force_unlock()  # `locks clear`: whatever the process still believes
    assert progress.advance(term, owner, "e", now - S, now - 2 * S).code == STALE
    assert progress.load() == {}


def test_the_same_owner_with_another_token_is_refused(r: redis.Redis,
                                                      leaders: list[Leader]) -> None:
    a = elected(r, leaders)
    progress = TickProgress(a.client, a.key, a.token_key)
    now = progress.now()
    assert progress.advance(a.term - 1, a.owner, "e", now - S, now - 2 * S).code == STALE
    with pytest.raises(TypeError, match="term must be an int"):
        progress.advance(str(a.term), a.owner, "e", now - S, now - 2 * S)  # type: ignore[arg-type]
