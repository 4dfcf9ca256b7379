"""Leader election across real processes (``Leader``, ``AsyncLeader``).

Each child (``_leader_proc``) samples its ``is_leader()`` every 2 ms with CLOCK_MONOTONIC
timestamps, which are system-wide on Linux: the histories of all processes compare, and
``exclusive`` checks from them that no two processes ever believed they led at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from django_rlock import AsyncLeader, Leader

ROOT = Path(__file__).parents[2]
WT = 3.0  # watchdog_timeout (the lease) of the campaigning processes


class Camp:
    """Processes campaigning for one group, each writing its history to a file."""

    def __init__(self, socket: str, tmp: Path, group: str = "g", mode: str = "sync") -> None:
        self.socket, self.tmp, self.group, self.mode = socket, tmp, group, mode
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.files: dict[int, Path] = {}
        self.probe = Leader(redis.Redis(unix_socket_path=socket), group)

    def spawn(self, n: int = 1, wt: float = WT) -> list[int]:
        started = []
        for _ in range(n):
            path = self.tmp / f"{self.group}-{len(self.files)}.jsonl"
            p = subprocess.Popen([sys.executable, "-m", "tests.engine._leader_proc", self.socket,
                                  self.group, str(wt), str(path), self.mode],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True)
            self.procs[p.pid], self.files[p.pid] = p, path
            started.append(p.pid)
        for pid in started:
            assert self.procs[pid].stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        return started

    def records(self, pid: int) -> list[dict[str, Any]]:
        text = self.files[pid].read_text() if self.files[pid].exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def events(self, pid: int, ev: str) -> list[dict[str, Any]]:
        return [r for r in self.records(pid) if r.get("ev") == ev]

    def leader_pid(self, timeout: float = 10.0, other_than: int | None = None) -> int:
        """The pid Redis names as leader (waits for one that is not ``other_than``)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            info = self.probe.leader()
            if info is not None and info.pid != other_than and info.pid in self.procs:
                return info.pid
            time.sleep(0.01)
        raise AssertionError(f"no leader (other than {other_than}) within {timeout} s")

    def elected_after(self, t: float, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
        """The first election after monotonic ``t`` (pid, its event)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [(e["t"], pid, e) for pid in self.procs for e in self.events(pid, "elected")
                     if e["t"] > t]
            if found:
                _, pid, e = min(found, key=lambda x: x[0])
                return pid, e
            time.sleep(0.01)
        raise AssertionError(f"nobody elected within {timeout} s")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()

    def exclusive(self) -> list[int]:
        """Assert that no two terms were believed at once; returns the terms in time order.

        A term's span is what its process certainly believed: from the end of its first
        ``is_leader()`` call that returned True to the start of its last one (belief within a
        term is one interval: once false, never true again for it).
        """
        spans = []
        for pid in self.procs:
            by_term: dict[int, list[float]] = {}
            for r in self.records(pid):
                if "s" in r and r["s"][2]:
                    before, after, _, term = r["s"]
                    assert term is not None, "is_leader() true with no term"
                    span = by_term.setdefault(term, [after, before])
                    span[1] = max(span[1], before)
            spans += [(first, last, term, pid) for term, (first, last) in by_term.items()]
        spans.sort()
        for a, b in zip(spans, spans[1:], strict=False):
            assert b[0] >= a[1], f"terms overlap: {a} and {b}"
            assert b[2] > a[2], f"terms not increasing: {a} then {b}"
        return [s[2] for s in spans]


@pytest.fixture
def camp(redis_server, r, tmp_path):
    c = Camp(redis_server.socket, tmp_path)
    yield c
    c.close()


def test_kill_pause_and_stop_hand_over_with_one_leader_at_a_time(camp, r):
    """Three campaigning processes. SIGKILL the leader: replaced within the lease + 1 s.
    SIGSTOP the next one past its lease, SIGCONT: it learns it before believing anything,
    and its revocation never overlaps its successor. SIGTERM (stop()) the leader: a standby is
    elected at once. One leader at any instant, terms strictly increasing."""
    camp.spawn(3)
    first = camp.leader_pid()

    # SIGKILL: replaced once its lease runs out (renewed every WT/3, so WT*2/3..WT after).
    t_kill = time.monotonic()
    os.kill(first, signal.SIGKILL)
    camp.procs[first].wait()
    second, ev = camp.elected_after(t_kill, timeout=WT + 5)
    took_kill = ev["t"] - t_kill
    assert second != first
    assert took_kill < WT + 1.0, f"takeover after SIGKILL took {took_kill:.3f} s"

    # SIGSTOP past the lease, then SIGCONT.
    time.sleep(0.3)
    t_stop = time.monotonic()
    os.kill(second, signal.SIGSTOP)
    third, _ = camp.elected_after(t_stop, timeout=WT + 5)
    assert third != second
    time.sleep(0.2)
    t_cont = time.monotonic()
    os.kill(second, signal.SIGCONT)
    end = time.monotonic() + 5
    while not [e for e in camp.events(second, "revoked") if e["t"] > t_cont]:
        assert time.monotonic() < end, "the resumed old leader was never told"
        time.sleep(0.01)
    revoked = [e for e in camp.events(second, "revoked") if e["t"] > t_cont][0]
    assert revoked["arg"] in ("in doubt", "lost")
    assert revoked["thread"].startswith("django-rlock leader"), revoked
    time.sleep(0.2)
    after = [r["s"] for r in camp.records(second) if "s" in r and r["s"][0] > t_cont]
    assert after and not any(s[2] for s in after), "a resumed old leader believed it led"

    # stop(): the leader stands down and a standby is elected at once.
    time.sleep(0.3)
    leader = camp.leader_pid()
    camp.procs[leader].send_signal(signal.SIGTERM)
    assert camp.procs[leader].wait(10) == 0
    stop = camp.events(leader, "stop")[0]
    successor, ev = camp.elected_after(stop["t0"])
    took_stop = ev["t"] - stop["t0"]
    assert successor != leader
    assert took_stop < 1.0, f"hand-over after stop() took {took_stop:.3f} s"
    assert camp.events(leader, "revoked")[-1]["arg"] == "stopped"
    print(f"\ntakeover after SIGKILL: {took_kill:.3f} s (lease {WT} s); "
          f"hand-over after stop(): {took_stop * 1000:.1f} ms")

    time.sleep(0.1)
    terms = camp.exclusive()
    assert len(terms) >= 4
    elected = sorted((e["t"], e["arg"]) for pid in camp.procs for e in camp.events(pid, "elected"))
    assert [t for _, t in elected] == sorted({t for _, t in elected})  # strictly increasing
    for pid in camp.procs:
        for e in camp.events(pid, "elected") + camp.events(pid, "revoked"):
            assert e["thread"].startswith("django-rlock leader"), e  # never the watchdog's


def test_async_leaders_hand_over_and_replace_a_killed_one(redis_server, r, tmp_path):
    camp = Camp(redis_server.socket, tmp_path, group="ag", mode="async")
    try:
        camp.spawn(3)
        first = camp.leader_pid()
        camp.procs[first].send_signal(signal.SIGTERM)
        assert camp.procs[first].wait(10) == 0
        stop = camp.events(first, "stop")[0]
        second, ev = camp.elected_after(stop["t0"])
        assert ev["t"] - stop["t0"] < 1.0
        assert camp.events(first, "revoked")[-1]["arg"] == "stopped"
        t_kill = time.monotonic()
        os.kill(second, signal.SIGKILL)
        camp.procs[second].wait()
        third, ev = camp.elected_after(t_kill, timeout=WT + 5)
        assert third not in (first, second) and ev["t"] - t_kill < WT + 1.0
        time.sleep(0.1)
        assert len(camp.exclusive()) >= 3  # (more if a loaded machine delayed a renewal)
    finally:
        camp.close()


def test_a_redis_restart_revokes_the_leader_and_one_is_elected_again(own_server, tmp_path):
    """A restart without persistence loses the key before its lease ends (like a
    force-unlock): the leader hears it within a fraction of a second of Redis being back (the
    reconnection wakes its watch), one leader is elected again, with a higher term. (Beliefs
    may overlap for that round trip: nothing in a fresh Redis remembers the lease; the term is
    what fences writes, docs/engine.md invariant 34.)"""
    camp = Camp(own_server.socket, tmp_path, group="rg")
    try:
        camp.spawn(2)
        first = camp.leader_pid()
        # Redis names it a moment before its history has the election (its callback's line).
        end = time.monotonic() + 5
        while not camp.events(first, "elected") and time.monotonic() < end:
            time.sleep(0.01)
        before = camp.events(first, "elected")[-1]["arg"]
        t_restart = time.monotonic()
        own_server.restart()  # no persistence: the key and the counter are gone
        back = time.monotonic()
        _, ev = camp.elected_after(t_restart, timeout=WT + 10)
        assert ev["arg"] > before  # the lost counter starts again above the old tokens
        end = time.monotonic() + WT
        while not camp.events(first, "revoked"):
            assert time.monotonic() < end, "the old leader was never told"
            time.sleep(0.01)
        revoked = camp.events(first, "revoked")[0]
        assert revoked["arg"] in ("lost", "in doubt") and revoked["t"] - back < 2.0
        time.sleep(0.3)
        now = [[r["s"] for r in camp.records(pid) if "s" in r][-1] for pid in camp.procs]
        assert sum(1 for s in now if s[2]) == 1, now  # one leader again
    finally:
        camp.close()


def test_force_unlock_deposes_a_leader_of_another_process_at_once(camp, r):
    """`locks clear` (the kind's force-unlock) is heard by the leader through the key's
    channel: told within a fraction of a second, not at its next renewal (30 s lease here)."""
    camp.spawn(1, wt=30.0)
    pid = camp.leader_pid()
    from django_rlock.engine.listing import Locks

    locks = Locks(r)
    [info] = locks.read(locks.names())
    assert (info.kind, info.details["term"]) == ("leader", camp.events(pid, "elected")[0]["arg"])
    assert info.summary() == f"term {info.details['term']}"
    t0 = time.monotonic()
    assert locks.clear([info.name]) == [info.name]
    end = time.monotonic() + 5
    while not camp.events(pid, "revoked"):
        assert time.monotonic() < end, "the deposed leader was never told"
        time.sleep(0.005)
    revoked = camp.events(pid, "revoked")[0]
    assert revoked["arg"] == "lost" and revoked["t"] - t0 < 1.0
    # It campaigns again: re-elected with a higher term.
    _, ev = camp.elected_after(t0)
    assert ev["arg"] > info.details["term"]


# -- in one process ---------------------------------------------------------------------------
def test_bad_input_is_refused_before_any_redis_command():
    dead = redis.Redis(unix_socket_path="/nonexistent/redis.sock")  # any command would fail
    with pytest.raises(TypeError, match="group must be a str"):
        Leader(dead, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group must not be empty"):
        Leader(dead, "")
    with pytest.raises(ValueError, match="watchdog_timeout.*'g'"):
        Leader(dead, "g", watchdog_timeout=0)
    with pytest.raises(TypeError, match="watchdog_timeout"):
        Leader(dead, "g", watchdog_timeout="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_elected must be callable.*'g'"):
        Leader(dead, "g", on_elected=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_revoked must be callable"):
        AsyncLeader(dead, "g", on_revoked="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client must be a redis-py client"):
        Leader(object(), "g")
    with pytest.raises(TypeError, match="prefix must be a str"):
        Leader(dead, "g", 3)  # type: ignore[arg-type]
    leader = Leader(dead, "g")  # nothing is sent until start()
    assert not leader.is_leader() and leader.term is None and leader.owner is None


def test_standbys_wait_on_pubsub_and_callbacks_run_on_the_leaders_thread(own_server, caplog):
    r = own_server.client()  # a server of its own: its command counts are this test's alone
    seen: list[tuple[str, Any, str]] = []

    def elected(term: int) -> None:
        seen.append(("elected", term, threading.current_thread().name))
        raise RuntimeError("a broken callback")

    def revoked(reason: str) -> None:
        seen.append(("revoked", reason, threading.current_thread().name))

    a = Leader(r, "t", on_elected=elected, on_revoked=revoked)
    b = Leader(r, "t", on_elected=elected, on_revoked=revoked)
    assert a.leader() is None
    with a:
        assert a.wait_elected(5)
        b.start()
        assert not b.wait_elected(0.3)  # a standby: False at its timeout
        assert a.is_leader() and a.term == seen[0][1] and b.term is None
        info = a.leader()
        assert info is not None and (info.pid, info.term, info.owner) == (os.getpid(), a.term,
                                                                          a.owner)
        assert info.process and info.host and info.since and abs(info.since - time.time()) < 60
        r.config_resetstat()
        time.sleep(1.0)  # the standby sends nothing while the leader holds (30 s lease)
        stats = r.info("commandstats")
        assert "cmdstat_evalsha" not in stats and "cmdstat_eval" not in stats, stats
    # a stopped: b elected (the broken on_elected was logged, the campaign went on).
    assert b.wait_elected(5)
    assert "a broken callback" in caplog.text
    b.stop()
    assert [s[:2] for s in seen] == [("elected", seen[0][1]), ("revoked", "stopped"),
                                     ("elected", seen[2][1]), ("revoked", "stopped")]
    assert seen[2][1] > seen[0][1]
    assert all(s[2].startswith("django-rlock leader") for s in seen)
    assert a.leader() is None and not r.exists(a.key)


def test_a_term_in_doubt_is_given_up_and_a_new_one_won(own_server):
    """Redis frozen past 2/3 of the lease (not past the lease): the leader stops believing
    (on_revoked('in doubt')) while its key still exists, then gives the term up and wins a
    new, higher one once Redis answers again."""
    client = own_server.client()
    seen: list[tuple[str, Any, float]] = []
    leader = Leader(client, "d", watchdog_timeout=WT,
                    on_elected=lambda t: seen.append(("elected", t, time.monotonic())),
                    on_revoked=lambda why: seen.append(("revoked", why, time.monotonic())))
    with leader:
        assert leader.wait_elected(5)
        first = leader.term
        assert own_server.proc is not None
        t0 = time.monotonic()
        own_server.proc.send_signal(signal.SIGSTOP)
        try:
            while leader.is_leader():
                time.sleep(0.005)
            gone = time.monotonic() - t0
            assert gone < WT * 2 / 3 + 0.2, gone  # within 2/3 of the lease of the last renewal
            time.sleep(0.1)
            assert [s[:2] for s in seen] == [("elected", first), ("revoked", "in doubt")]
        finally:
            own_server.proc.send_signal(signal.SIGCONT)
        end = time.monotonic() + 10
        while len(seen) < 3:
            assert time.monotonic() < end, seen
            time.sleep(0.01)
        assert seen[2][0] == "elected" and seen[2][1] > first and leader.term == seen[2][1]


def test_async_leader_in_one_loop_with_coroutine_callbacks(redis_server, r, caplog):
    import asyncio

    import redis.asyncio

    seen: list[tuple[str, Any]] = []

    async def elected(term: int) -> None:
        await asyncio.sleep(0)
        seen.append(("elected", term))
        raise RuntimeError("a broken coroutine callback")

    async def revoked(reason: str) -> None:
        seen.append(("revoked", reason))

    async def main() -> None:
        client = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        a = AsyncLeader(client, "ai", on_elected=elected, on_revoked=revoked)
        b = AsyncLeader(client, "ai", watchdog_timeout=5, on_revoked=revoked)
        assert await a.leader() is None
        async with a:
            assert await a.wait_elected(5)
            await b.start()
            assert not await b.wait_elected(0.2)
            assert a.is_leader() and a.term == seen[0][1] and b.term is None
            info = await b.leader()
            assert info is not None and (info.pid, info.term) == (os.getpid(), a.term)
            with pytest.raises(RuntimeError, match="already started"):
                await a.start()
        assert await b.wait_elected(5) and b.term > seen[0][1]
        await b.lock.force_unlock()  # deposed: told, and it campaigns again
        await asyncio.sleep(0.1)
        assert await b.wait_elected(5)
        await b.stop()
        await client.aclose()

    asyncio.run(main())
    assert [s for s in seen if s[0] == "revoked"] == [("revoked", "stopped"), ("revoked", "lost"),
                                                      ("revoked", "stopped")]
    assert "a broken coroutine callback" in caplog.text
