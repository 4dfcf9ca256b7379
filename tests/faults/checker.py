"""Reads a fault run's directory back (histories, faults, store) and classifies what it finds.

**Sections.** Each worker's ``E``/``X`` lines make one section: ``[enter, exit]`` in
monotonic time, the token, and whether the holder was *told*: ``is_lost()`` true before its
write or at its exit. A section with no ``X`` line whose worker was SIGKILLed ends at the kill
(it did nothing after it); one with neither is *unfinished* (reported; a worker's thread
always writes ``X``).

**Overlaps.** On one lock, two sections overlap if their intervals intersect, unless neither
is of an exclusive kind (``EXCLUSIVE``: ``rlock``, ``fenced``, ``write``, ``fair``, ``aio``,
``afair``; so two ``read`` sections of the ``rw`` lock may meet). A lock may be taken by
several kinds (``rlock:0`` by ``rlock`` threads and ``aio`` tasks, ``fair:*`` by ``fair``
and ``afair``): the sections of all of them are one history. On the semaphore, an overlap
is a moment with more sections inside than ``SEM_PERMITS``. Each is

- *explained* by ``restart`` if the lock server restarted empty between an earlier holder's
  acquire call and the overlap (its lock was reset, whether or not it heard yet);
- *explained* by ``stop`` / ``pause`` if a holder in it was told, and its worker was
  SIGSTOPped, or the server paused, for at least half the lease between its acquire call and
  the overlap's end;
- *told*, if a holder in it was told but no such fault is there (reported, not a failure: a
  lease lost to something the run did not inject, a CPU starved of time);
- *silent* otherwise: nobody was told. Always a defect.

**Lost updates.** The store's write log of each lock (``<sid> <read>``, in the order the
writes happened) is replayed: a write that read less than the current value overwrote the
writes since then. It is explained if its overlap with each overwritten section is.
The total is cross-checked against the final counter (log length minus counter).

**Stale fenced writes.** The store's fence log: a token not above the largest seen. Explained
if the writer was told (at exit: it checked just before writing), or the server restarted
between its acquire call and its write (a reset lock it could not have heard of yet); else a
defect (a token repeated or out of order for a holder that believes it holds).
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.faults.worker import EXCLUSIVE, SEM_PERMITS

#: How long after its budget an acquire call may answer before it counts as late (s): the
#: last attempt's round trip, a reconnection, a loaded 2-core machine.
LATE = 1.0


@dataclass
class Section:
    sid: str
    wid: str
    kind: str
    lock: str
    t_try: float
    enter: float
    token: int | None
    exit: float | None = None
    told: bool = False
    killed: bool = False
    unfinished: bool = False
    x: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    summary: dict[str, Any]
    silent: list[dict[str, Any]]
    told_only: list[dict[str, Any]]
    lost_unexplained: list[dict[str, Any]]
    stale_unexplained: list[dict[str, Any]]
    unowned: list[dict[str, Any]]
    phantoms: list[dict[str, Any]]
    late: list[dict[str, Any]] = field(default_factory=list)

    def problems(self) -> dict[str, int]:
        """The defects found (each must be 0)."""
        s = self.summary
        return {"silent overlaps": s["overlaps"]["silent"],
                "unexplained lost updates": s["lost_updates"]["unexplained"],
                "unexplained stale fenced writes": s["stale_fenced_writes"]["unexplained"],
                "holders not told their hold was gone": s["unowned_sections"]["unexplained"],
                "phantom holds": s["phantom_holds"]}

    def ok(self) -> bool:
        return not any(self.problems().values())


def _lines(path: str) -> list[dict[str, Any]]:
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by SIGKILL
                    pass
    return out


class Checker:
    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.faults = _lines(os.path.join(directory, "faults.jsonl"))
        run = next(f for f in self.faults if f["kind"] == "run")
        self.t0, self.lease = run["at"], run["lease"]
        self.end = next((f["at"] for f in self.faults if f["kind"] == "end"), run["until"])
        with open(os.path.join(directory, "store.json")) as f:
            self.store: dict[str, Any] = json.load(f)
        self.kill_at = {f["wid"]: f["at"] for f in self.faults if f["kind"] == "kill"}
        #: (SIGTERM sent, old server gone, new one answering): holds the old server granted
        #: were reset.
        self.restarts = [(f["at"], f["down"], f["until"]) for f in self.faults
                         if f["kind"] == "restart"]
        long = self.lease / 2
        self.stops: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for f in self.faults:
            if f["kind"].startswith("stop") and f["until"] - f["at"] >= long:
                self.stops[f["wid"]].append((f["at"], f["until"]))
        self.pauses = [(f["at"], f["until"]) for f in self.faults
                       if f["kind"].startswith("pause") and not f["kind"].endswith("failed")
                       and f["until"] - f["at"] >= long]
        #: Every stop and pause, however short, and every restart: what may hold up an answer.
        self.any_stops: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for f in self.faults:
            if f["kind"].startswith("stop"):
                self.any_stops[f["wid"]].append((f["at"], f["until"]))
        self.any_pauses = [(f["at"], f["until"]) for f in self.faults
                           if f["kind"] in ("pause_write", "pause_all", "restart")]
        #: (sid, wid, kind, lock, t_try, budget, answered at, outcome) of every acquire call.
        self.answers: list[tuple[str, str, str, str, float, float, float, str]] = []
        self.sections: dict[str, Section] = {}
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        #: try_lock said no, yet the server had the thread's field.
        self.phantoms: list[dict[str, Any]] = []
        self._load()

    def _load(self) -> None:
        xs: dict[str, dict[str, Any]] = {}
        released: dict[str, Any] = {}
        for path in sorted(glob.glob(os.path.join(self.dir, "w*.jsonl"))):
            for rec in _lines(path):
                t = rec["t"]
                if t in ("E", "F", "A") and rec.get("budget") is not None:
                    self.answers.append((rec["sid"], rec["sid"].split(".")[0], rec["kind"],
                                         rec["lock"], rec["t_try"], rec["budget"],
                                         rec["enter"] if t == "E" else rec["at"],
                                         {"E": "acquired", "F": "not acquired"}.get(
                                             t, rec.get("err", "?"))))
                if t == "E":
                    self.sections[rec["sid"]] = Section(
                        rec["sid"], rec["wid"], rec["kind"], rec["lock"], rec["t_try"],
                        rec["enter"], rec["token"])
                elif t == "X":
                    xs[rec["sid"]] = rec
                elif t == "R":
                    released[rec["sid"]] = rec["released"]
                elif t == "F":
                    self.counts["not acquired (budget spent)"] += 1
                    if rec.get("held"):
                        self.phantoms.append(rec)
                elif t == "A":
                    self.errors[f"acquire {rec['err']}"] += 1
                elif t == "B":
                    self.errors[f"worker bug {rec['err']}"] += 1
        for sid, s in self.sections.items():
            x = xs.get(sid)
            if x is not None:
                s.x, s.exit = x, x["exit"]
                s.told = bool(x.get("lost_before") or x.get("lost_at_exit"))
                if x.get("err"):
                    self.errors[f"section {x['err']}"] += 1
                outcome = released.get(sid, "killed during it")
                x["released"] = outcome
                if outcome is not True:
                    self.errors[f"release {outcome}"] += 1
            elif s.wid in self.kill_at:
                s.exit, s.killed = self.kill_at[s.wid], True
            else:
                s.exit, s.unfinished = self.end, True

    # -- explanations ---------------------------------------------------------------------
    @staticmethod
    def _meets(spans: list[tuple[float, float]], a: float, b: float) -> bool:
        return any(lo <= b and hi >= a for lo, hi in spans)

    def _reset(self, s: Section, by: float) -> bool:
        """The server restarted empty after ``s`` was granted (on the old server) and before
        ``by``: its lock is gone, whether or not its watchdog has noticed yet.

        Granted by the old server: asked before it was gone, and in before the new one could
        answer (the controller polls it every 20 ms, so it did not answer anyone before
        ``until`` - 25 ms): a thread scheduled late after the old server's reply is not taken
        for one the new server granted."""
        return any(s.t_try <= down and s.enter < max(down, up - 0.025) and at <= by
                   for at, down, up in self.restarts)

    def explain(self, group: list[Section], start: float, end: float) -> str:
        """``restart``, ``stop``, ``pause``, ``told`` or ``silent`` for sections that were
        inside together from ``start`` to ``end``."""
        for s in group:
            if self._reset(s, start):
                return "restart"
        told = [s for s in group if s.told]
        for s in told:
            if self._meets(self.stops[s.wid], s.t_try, end):
                return "stop"
        for s in told:
            if self._meets(self.pauses, s.t_try, end):
                return "pause"
        return "told" if told else "silent"

    def _describe(self, group: list[Section], start: float, why: str) -> dict[str, Any]:
        rel = self.t0
        return {"why": why, "lock": group[0].lock, "at": round(start - rel, 3),
                "sections": [{"sid": s.sid, "kind": s.kind, "t_try": round(s.t_try - rel, 3),
                              "enter": round(s.enter - rel, 3),
                              "exit": round((s.exit or 0) - rel, 3), "token": s.token,
                              "told": s.told, "killed": s.killed, "x": s.x} for s in group],
                "faults": [{**f, "at": round(f["at"] - rel, 3), "until": round(f["until"] - rel, 3)}
                           for f in self.faults if f["kind"] not in ("run", "start", "end")
                           and f["at"] <= start + 0.5
                           and f["until"] >= min(s.t_try for s in group) - 0.5]}

    # -- checks ---------------------------------------------------------------------------
    def overlaps(self) -> tuple[dict[frozenset[str], str], list[dict[str, Any]]]:
        """Every overlap, classified: (pair of sids -> reason, described overlaps)."""
        by_lock: dict[str, list[Section]] = defaultdict(list)
        for s in self.sections.values():
            by_lock[s.lock].append(s)
        pairs: dict[frozenset[str], str] = {}
        found: list[dict[str, Any]] = []
        for lock, secs in by_lock.items():
            secs.sort(key=lambda s: s.enter)
            if lock.startswith("sem:"):
                found += self._excess(secs)
                continue
            active: list[Section] = []
            for b in secs:
                active = [a for a in active if a.exit > b.enter]  # type: ignore[operator]
                for a in active:
                    if a.kind not in EXCLUSIVE and b.kind not in EXCLUSIVE:
                        continue  # two reads of the ``rw`` lock
                    end = min(a.exit, b.exit)  # type: ignore[type-var]
                    why = self.explain([a, b], b.enter, end)
                    pairs[frozenset((a.sid, b.sid))] = why
                    found.append(self._describe([a, b], b.enter, why))
                active.append(b)
        return pairs, found

    def _excess(self, secs: list[Section]) -> list[dict[str, Any]]:
        """Moments with more semaphore holders than permits (one per distinct holder set)."""
        found = []
        active: list[Section] = []
        seen: set[frozenset[str]] = set()
        for b in secs:
            active = [a for a in active if a.exit > b.enter]  # type: ignore[operator]
            active.append(b)
            if len(active) > SEM_PERMITS:
                key = frozenset(s.sid for s in active)
                if key in seen:
                    continue
                seen.add(key)
                end = min(s.exit for s in active)  # type: ignore[type-var]
                found.append(self._describe(list(active), b.enter, self.explain(active, b.enter, end)))
        return found

    def lost_updates(self, pairs: dict[frozenset[str], str]) -> dict[str, Any]:
        total = explained = by_counter = 0
        bad: list[dict[str, Any]] = []
        for key, entries in self.store.items():
            if not key.startswith("log:"):
                continue
            name = key[4:]
            cur = 0
            writer: dict[int, str] = {}
            for entry in entries:
                sid, read = entry.split()
                read = int(read)
                if read < cur:
                    lost = [writer[v] for v in range(read + 1, cur + 1) if v in writer]
                    total += cur - read
                    if all(pairs.get(frozenset((sid, w)), "silent") not in ("silent", "told")
                           for w in lost) and len(lost) == cur - read:
                        explained += cur - read
                    else:
                        bad.append({"lock": name, "writer": sid, "read": read, "current": cur,
                                    "overwrote": {w: pairs.get(frozenset((sid, w)), "no overlap")
                                                  for w in lost}})
                cur = read + 1
                writer[cur] = sid
            final = int(self.store.get("c:" + name) or 0)
            by_counter += len(entries) - final
        return {"total": total, "explained": explained, "unexplained": total - explained,
                "by_counter": by_counter, "details": bad}

    def stale_writes(self) -> dict[str, Any]:
        total = explained = repeats = 0
        bad: list[dict[str, Any]] = []
        for key, entries in self.store.items():
            if not key.startswith("flog:"):
                continue
            for entry in entries:
                sid, tok, top, ok = entry.split()
                if ok == "1":
                    continue
                total += 1
                repeats += tok == top
                s = self.sections.get(sid)
                t_write = s.x.get("t_write", s.exit) if s else None
                if s is not None and (s.told or self._reset(s, t_write)):
                    explained += 1
                else:
                    bad.append({"lock": key[5:], "sid": sid, "token": int(tok), "max_seen": int(top),
                                "section": self._describe([s], s.enter, "stale") if s else None})
        return {"total": total, "explained": explained, "unexplained": total - explained,
                "equal_to_max": repeats, "details": bad}

    def unowned(self) -> dict[str, Any]:
        """Sections whose holder was not told, yet the server had no field (permit) of it."""
        total = explained = 0
        bad = []
        for s in self.sections.values():
            if s.x.get("held") is False and not s.told:
                total += 1
                if self._reset(s, s.exit):  # type: ignore[arg-type]
                    explained += 1
                else:
                    bad.append(self._describe([s], s.enter, "unowned"))
        return {"total": total, "explained": explained, "unexplained": total - explained,
                "details": bad}

    def late(self) -> dict[str, Any]:
        """Acquire calls answered more than ``LATE`` s after their budget ran out. Explained
        if the caller's worker was stopped, or the server paused or restarted, from half a
        second before the budget ran out until the answer;
        the others are reported, not failed (a starved CPU; a wait that overran its budget)."""
        total = explained = 0
        bad = []
        for sid, wid, kind, lock, t_try, budget, at, outcome in self.answers:
            over = at - t_try - budget
            if over <= LATE:
                continue
            total += 1
            # What held it up met the time after its budget ran out (or just before it: the
            # last attempt's round trip).
            since = min(t_try + budget, at) - 0.5
            if self._meets(self.any_stops[wid], since, at) or self._meets(self.any_pauses, since, at):
                explained += 1
                continue
            rel = self.t0
            bad.append({"sid": sid, "kind": kind, "lock": lock, "t_try": round(t_try - rel, 3),
                        "budget": budget, "answered": round(at - rel, 3), "over": round(over, 3),
                        "outcome": outcome,
                        "faults": [{**f, "at": round(f["at"] - rel, 3),
                                    "until": round(f["until"] - rel, 3)}
                                   for f in self.faults if f["kind"] not in ("run", "start", "end")
                                   and f["at"] <= at and f["until"] >= t_try - 0.5]})
        bad.sort(key=lambda b: -b["over"])
        return {"total": total, "explained": explained, "unexplained": total - explained,
                "worst_unexplained": bad[0]["over"] if bad else 0.0, "details": bad}

    def repeated_tokens(self) -> int:
        seen: dict[tuple[str, int], int] = Counter()  # type: ignore[assignment]
        for s in self.sections.values():
            if s.token is not None:
                seen[(s.lock, s.token)] += 1
        return sum(n - 1 for n in seen.values() if n > 1)

    def report(self) -> Report:
        pairs, found = self.overlaps()
        lost = self.lost_updates(pairs)
        stale = self.stale_writes()
        unowned = self.unowned()
        late = self.late()
        why = Counter(o["why"] for o in found)
        faults = Counter(f["kind"] for f in self.faults if f["kind"] not in ("run", "start", "end")
                         and not f.get("at_end"))
        acq = Counter(s.kind for s in self.sections.values())
        summary = {
            "seconds": round(self.end - self.t0, 1),
            "acquisitions": sum(acq.values()),
            "acquisitions_by_kind": dict(sorted(acq.items())),
            "faults": dict(sorted(faults.items())),
            "overlaps": {"explained": why["restart"] + why["stop"] + why["pause"],
                         "by_restart": why["restart"], "by_stop": why["stop"],
                         "by_pause": why["pause"], "told_without_fault": why["told"],
                         "silent": why["silent"]},
            "lost_updates": {k: v for k, v in lost.items() if k != "details"},
            "stale_fenced_writes": {k: v for k, v in stale.items() if k != "details"},
            "repeated_tokens": self.repeated_tokens(),
            "unowned_sections": {k: v for k, v in unowned.items() if k != "details"},
            "phantom_holds": len(self.phantoms),
            "late_answers": {k: v for k, v in late.items() if k != "details"},
            "sections_killed": sum(s.killed for s in self.sections.values()),
            "sections_unfinished": sum(s.unfinished for s in self.sections.values()),
            "told_at_exit": sum(s.told for s in self.sections.values()),
            "other": dict(sorted((self.counts + self.errors).items())),
        }
        return Report(summary, [o for o in found if o["why"] == "silent"],
                      [o for o in found if o["why"] == "told"], lost["details"], stale["details"],
                      unowned["details"], self.phantoms, late["details"])


def check(directory: str) -> Report:
    return Checker(directory).report()


def format_summary(s: dict[str, Any]) -> str:
    o, lu, st = s["overlaps"], s["lost_updates"], s["stale_fenced_writes"]
    lines = [
        f"acquisitions {s['acquisitions']} in {s['seconds']} s: "
        + ", ".join(f"{k} {v}" for k, v in s["acquisitions_by_kind"].items()),
        "faults: " + ", ".join(f"{k} {v}" for k, v in s["faults"].items()),
        f"overlaps: explained {o['explained']} (restart {o['by_restart']}, stop {o['by_stop']}, "
        f"pause {o['by_pause']}), told without an injected fault {o['told_without_fault']}, "
        f"silent {o['silent']}",
        f"lost updates: {lu['total']} (explained {lu['explained']}, unexplained "
        f"{lu['unexplained']}; counter shortfall {lu['by_counter']})",
        f"stale fenced writes: {st['total']} (explained {st['explained']}, unexplained "
        f"{st['unexplained']}; equal to the max {st['equal_to_max']}); repeated tokens "
        f"{s['repeated_tokens']}",
        f"holders not told their hold was gone: {s['unowned_sections']['unexplained']} "
        f"(and {s['unowned_sections']['explained']} whose server restarted); "
        f"phantom holds (try_lock False, field there) {s['phantom_holds']}",
        f"acquire calls answered over {LATE:g} s past their budget: "
        f"{s['late_answers']['total']} (after a stop, pause or restart "
        f"{s['late_answers']['explained']}; without one {s['late_answers']['unexplained']}, "
        f"the worst {s['late_answers']['worst_unexplained']} s over)",
        f"sections killed {s['sections_killed']}, unfinished {s['sections_unfinished']}, "
        f"told lost {s['told_at_exit']}",
        "other: " + ", ".join(f"{k} {v}" for k, v in s["other"].items()),
    ]
    return "\n".join(lines)
