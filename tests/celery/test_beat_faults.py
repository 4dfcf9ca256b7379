"""Celery beat on every replica, the faults and gaps ``test_beat.py``'s sequence does not
cover, each on real ``celery beat`` processes and a Redis of the test's own:

- a catch-up after a month-long gap in a crontab of an app not on UTC: one send, the latest
  tick, on the grid, at the app's hour (Celery 5.5 reads a crontab's hour in whatever
  timezone it is given; CI runs this file again on Celery 5.5);
- the leadership's token key lost (evicted, deleted by hand): the term is given up, ticks go
  on within a lease, none twice;
- SIGTERM delivered to another thread between a tick's progress and its send: the message
  goes out, then beat exits.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from django_rlock.engine import Leader
from django_rlock.engine.ticks import TickProgress
from django_rlock.testing import RedisServer

from .beat_harness import BROKER_DB, GROUP, SECOND, WATCHDOG, Beats, Reader, beat_env, wait_for

MINUTE = 60 * SECOND
DAY = 86400 * SECOND


@pytest.fixture
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.stop()


def server_now(client: object) -> int:
    secs, micros = client.time()  # type: ignore[attr-defined]
    return int(secs) * SECOND + int(micros)


def test_a_month_long_gap_in_a_crontab_is_one_send_at_the_app_s_hour(
        server: RedisServer, tmp_path: Path) -> None:
    """``crontab(minute="*", hour=H)``, H the hour now in Asia/Kolkata (UTC+5:30), the app's
    timezone; the entry's progress 30 days old (1,800 ticks since). The leader sends once, the
    minute now (not each tick, nor one message per 1,000 of them; not H o'clock UTC, 5.5 h
    away), then keeps the grid."""
    client = server.client(db=BROKER_DB)
    zone = "Asia/Kolkata"
    hour = datetime.now(ZoneInfo(zone)).hour
    leader = Leader(client, GROUP, "rlock:")
    progress = TickProgress(client, leader.key, leader.token_key)
    client.hset(progress.key, "minutely", str(server_now(client) - 30 * DAY + 17 * SECOND))
    reader = Reader(server.client(db=BROKER_DB))
    beats = Beats("django_rlock.beat:LeaderScheduler",
                  beat_env(server, RLOCK_BEAT_TZ=zone, RLOCK_BEAT_HOUR=str(hour)), tmp_path, n=1)
    try:
        wait_for(lambda: reader.messages, 60, f"the catch-up send\n{beats.text()}")
        time.sleep(3.0)  # a backlog would follow within milliseconds
        now = server_now(client)
    finally:
        beats.stop()
        reader.stop()
    msgs = reader.messages
    report = "\n".join(m.raw_tick for m in msgs)
    first = msgs[0].tick
    assert first % MINUTE == 0, report  # on the grid
    assert now - 2 * MINUTE <= first <= now, f"not the latest tick: {report}"
    assert datetime.fromtimestamp(first / SECOND, ZoneInfo(zone)).hour == hour, report
    # At most the next minute's tick after it (the test's 3 s may cross a minute).
    assert len(msgs) <= 2 and all(b.tick - a.tick == MINUTE
                                  for a, b in zip(msgs, msgs[1:], strict=False)), report
    assert int(client.hget(progress.key, "minutely")) == msgs[-1].tick


def test_a_lost_token_key_gives_the_term_up_and_ticks_go_on_once_each(
        server: RedisServer, tmp_path: Path) -> None:
    """Two beats, an every-second entry; the leadership's token key (only) is deleted. The
    leader's next tick is refused by Redis: it gives the term up (WARNING), and a leader with
    a new term (either process) sends the following ticks: within a lease, none twice."""
    client = server.client(db=BROKER_DB)
    leader = Leader(client, GROUP, "rlock:")  # never started: reads who leads
    reader = Reader(server.client(db=BROKER_DB))
    beats = Beats("django_rlock.beat:LeaderScheduler", beat_env(server), tmp_path, n=2)
    try:
        wait_for(lambda: len(reader.messages) >= 3, 60, f"three ticks\n{beats.text()}")
        old = reader.messages[-1].term
        assert client.delete(leader.token_key) == 1
        lost = time.monotonic()
        wait_for(lambda: len(reader.since(lost)) >= 3, WATCHDOG + 10,
                 f"three ticks after the token key was deleted\n{beats.text()}")
    finally:
        beats.stop()
        reader.stop()
    msgs = reader.messages
    report = "\n".join(f"{m.at - msgs[0].at:7.3f} term {m.term} tick {m.raw_tick}" for m in msgs)
    dup = [t for t, n in Counter(m.tick for m in msgs).items() if n > 1]
    assert not dup, f"ticks sent twice: {dup}\n{report}"
    assert [m.tick for m in msgs] == sorted(m.tick for m in msgs), report
    after = reader.since(lost)
    assert after[0].term > old, report
    assert after[0].at - lost <= WATCHDOG + 1.0, report  # a lease, at most
    assert "refused by Redis" in beats.text() and "giving the term up" in beats.text()


def test_sigterm_between_a_tick_s_progress_and_its_send_waits_for_the_send(
        server: RedisServer, tmp_path: Path) -> None:
    """Beat's SIGTERM handler (``SystemExit``) runs after the message is out, though the
    signal came from another thread while the main thread was inside the window; then the beat
    exits as usual (0), its tick's progress in Redis and the tick in the broker agree."""
    client = server.client(db=BROKER_DB)
    leader = Leader(client, GROUP, "rlock:")
    progress = TickProgress(client, leader.key, leader.token_key)
    reader = Reader(server.client(db=BROKER_DB))
    beats = Beats("tests.celery.beat_sigterm:SigtermInSend", beat_env(server), tmp_path, n=1)
    proc = beats.procs[0]
    try:
        code = proc.wait(60)
        time.sleep(0.5)  # the reader's last pop
    finally:
        beats.stop()
        reader.stop()
    text = beats.text()
    sent = client.hget(progress.key, "every-second")
    assert sent is not None, text
    assert [m.tick for m in reader.messages] == [int(sent)], f"tick lost\n{text}"
    assert code == 0, text
