"""Celery beat on every replica (issue #20): three real ``celery beat`` processes, a real Redis
broker, no worker, one entry every second; the leader is SIGKILLed, then SIGSTOPped past its
lease and resumed, then sent SIGTERM.

A reader in the test pops every message from the broker's queue as it arrives (its arrival
time, its ``rlock_beat_term`` and ``rlock_beat_tick`` headers). Each tick is sent at most
once, ticks and terms only grow, ticks stay on the entry's 1 s grid; the gap after the SIGKILL
is at most ``watchdog_timeout + 2 s`` and the ticks that fell in it are coalesced into one
send (the latest due); after the SIGTERM no tick is missed (tick gap 1 s); the resumed old
leader sends nothing. Runs once per scheduler (~30 s each), not on the 6.2/Valkey reruns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_rlock.engine import Leader
from django_rlock.testing import RedisServer

from .beat_harness import (
    BROKER_DB,
    GROUP,
    SECOND,
    WATCHDOG,
    Beats,
    Message,
    Reader,
    beat_env,
    wait_for,
)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.stop()


def scenario(server: RedisServer, tmp: Path, scheduler: str, django: bool,
             prefix: str) -> None:
    env = beat_env(server)
    client = server.client(db=BROKER_DB)
    if django:
        env.update(RLOCK_BEAT_DJANGO="1", RLOCK_BEAT_DB=str(tmp / "beat.sqlite3"),
                   RLOCK_BEAT_CACHE=f"unix://{server.socket}?db={BROKER_DB}",
                   DJANGO_SETTINGS_MODULE="tests.celery.beat_settings")
        subprocess.run([sys.executable, "-m", "tests.celery.beat_app", "setup-db"], cwd=tmp,
                       env=env, check=True, timeout=120)
    watcher = Leader(client, GROUP, prefix)  # never started: reads who leads
    reader = Reader(server.client(db=BROKER_DB))
    beats = Beats(scheduler, env, tmp)
    events: dict[str, float] = {}

    since: dict[int, float] = {}  # term -> when it began (server clock, s)

    def leader_pid(other_than: int | None = None) -> int | None:
        info = watcher.leader()
        if info is None or info.pid == other_than:
            return None
        if info.term is not None and info.since is not None:
            since[info.term] = info.since
        return info.pid

    def terms_after(t: float) -> set[int]:
        return {m.term for m in reader.since(t)}

    try:
        first = wait_for(leader_pid, 60, "a leader")
        wait_for(lambda: len(reader.messages) >= 3, 30, "three ticks")

        # 1. SIGKILL the leader: a standby takes over after its lease.
        events["kill"] = time.monotonic()
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: leader_pid(first), WATCHDOG + 10, "a second leader")
        wait_for(lambda: len(terms_after(events["kill"])) >= 1
                 and len(reader.since(events["kill"])) >= 3, 30, "ticks of the second leader")

        # 2. SIGSTOP the leader past its lease; a third takes over; SIGCONT.
        term2 = reader.messages[-1].term
        events["stop"] = time.monotonic()
        os.kill(second, signal.SIGSTOP)
        third = wait_for(lambda: leader_pid(second), WATCHDOG + 10, "a third leader")
        wait_for(lambda: {m.term for m in reader.since(events["stop"])} - {term2}, 30,
                 "ticks of the third leader")
        time.sleep(max(0.0, events["stop"] + WATCHDOG + 1.5 - time.monotonic()))
        events["cont"] = time.monotonic()
        os.kill(second, signal.SIGCONT)
        wait_for(lambda: "django-rlock beat: no longer leading" in beats.log_of(second), 20,
                 "the resumed leader to stand by")
        time.sleep(2.0)

        # 3. SIGTERM the leader: it hands over at once.
        third = leader_pid() or third
        term3 = reader.messages[-1].term
        events["term"] = time.monotonic()
        os.kill(third, signal.SIGTERM)
        wait_for(lambda: {m.term for m in reader.since(events["term"])} - {term3}
                 and len(reader.since(events["term"])) >= 3, 30, "ticks after the SIGTERM")
        assert beats.by_pid(third).wait(20) == 0
    finally:
        beats.stop()
        time.sleep(0.5)
        reader.stop()

    logs = {p.pid: beats.log_of(p.pid) for p in beats.procs}
    check(reader, events, since, term2, term3, logs, first, second)
    assert not reader.other, reader.other
    assert client.llen("celery") == 0


def gap_at(messages: list[Message], t: float) -> tuple[Message, Message]:
    before = [m for m in messages if m.at <= t]
    after = [m for m in messages if m.at > t]
    assert before and after, (t, messages)
    return before[-1], after[0]


def check(reader: Reader, events: dict[str, float], since: dict[int, float], term2: int,
          term3: int, logs: dict[int, str], first: int, second: int) -> None:
    msgs = reader.messages
    report = "\n".join(f"{m.at - msgs[0].at:7.3f} term {m.term} tick {m.raw_tick}" for m in msgs)
    # Every tick at most once; ticks and terms only grow; the grid is kept.
    dup = [t for t, n in Counter(m.tick for m in msgs).items() if n > 1]
    assert not dup, f"ticks sent twice: {dup}\n{report}"
    assert [m.tick for m in msgs] == sorted(m.tick for m in msgs), report
    assert [m.term for m in msgs] == sorted(m.term for m in msgs), report
    assert all((b.tick - a.tick) % SECOND == 0 for a, b in zip(msgs, msgs[1:], strict=False)), report
    assert len({m.term for m in msgs}) >= 4, report  # first, second, third, after SIGTERM

    # After the SIGKILL: a gap of at most watchdog + 2 s, its ticks coalesced into one send.
    a, b = gap_at(msgs, events["kill"])
    assert b.term > a.term, report
    assert b.at - a.at <= WATCHDOG + 2.0, report
    assert b.tick - a.tick <= (WATCHDOG + 2.0) * SECOND, report
    # Coalesced: the new term's first message is the latest tick at or before the term began
    # (not the first tick after the old leader's last, then the others one by one).
    assert b.tick > since[b.term] * 1e6 - SECOND, report
    following = [m for m in msgs if m.at > b.at]
    assert following and following[0].tick == b.tick + SECOND, report  # grid, no backlog

    # The leader stopped past its lease sends nothing once resumed.
    late = [m for m in msgs if m.term == term2 and m.at > events["cont"]]
    assert not late, f"the resumed old leader sent {late}\n{report}"
    a, b = gap_at(msgs, events["stop"])
    assert b.at - a.at <= WATCHDOG + 2.0 + 1.0, report

    # After the SIGTERM: a stand-down; not one tick is missed.
    a, b = gap_at(msgs, events["term"])
    assert a.term == term3 < b.term, report
    assert b.tick - a.tick <= SECOND, report
    assert b.at - a.at <= 2.0, report

    # Standbys said once that they stand by, naming the leader; leaders gave their term.
    assert f"pid {first}" in logs[second], logs[second]
    for text in logs.values():
        assert "leading 'celery-beat:beattests', term" in text or "standing by" in text, text
        # Once per stand-by, not once per loop (the database scheduler loops every 5 s).
        assert text.count("standing by") <= 1 + text.count("no longer leading"), text
    kill = gap_at(msgs, events["kill"])[1].at - events["kill"]
    term = gap_at(msgs, events["term"])[1].at - events["term"]
    print(f"\nbeat takeover: after SIGKILL {kill:.2f} s, after SIGTERM {term:.3f} s")


def test_three_beats_send_every_tick_at_most_once_through_kill_stop_and_term(
        server: RedisServer, tmp_path: Path) -> None:
    scenario(server, tmp_path, "django_rlock.beat:LeaderScheduler", django=False,
             prefix="rlock:")


def test_three_database_beats_on_django_celery_beat_do_the_same(
        server: RedisServer, tmp_path: Path) -> None:
    pytest.importorskip("django_celery_beat")
    scenario(server, tmp_path, "django_rlock.beat:LeaderDatabaseScheduler", django=True,
             prefix="bt:rlock:")
