"""Tables for the terminal and for docs/benchmarks.md, and the targets with PASS/MISS.

The targets are measured here and only reported: a benchmark on a shared 2-core box is too
noisy to fail a test suite on, but a MISS in the results page is there for everyone to see.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import contention, renewal, uncontended
from .clients import FLOOR, PRL, RLOCK

NOTES_START = "<!-- notes:start -->"
NOTES_END = "<!-- notes:end -->"

# Targets from the issue.
A_MAX_RATIO = 1.10
B_MAX_CROSS_RATIO = 0.8
B_MAX_WAIT_MS = 250.0
B_MAX_CLIENT_CMDS = 3.5
W_MAX_ROUND_TRIPS = 100.0


def num(v: float, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:,.{digits}f}"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    left: int = 1   # leading columns that hold text (left-aligned); the rest are numbers

    def text(self) -> str:
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) if self.rows else len(h)
                  for i, h in enumerate(self.headers)]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.ljust(w) if i < self.left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths, strict=False)))
        rule = "  ".join("-" * w for w in widths)
        return "\n".join([self.title, line(self.headers), rule, *(line(r) for r in self.rows)])

    def markdown(self) -> str:
        align = ["---"] * self.left + ["---:"] * (len(self.headers) - self.left)
        out = [f"| {' | '.join(self.headers)} |", f"|{'|'.join(align)}|"]
        out += [f"| {' | '.join(c.replace('|', '/') for c in r)} |" for r in self.rows]
        return "\n".join(out)


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    ok: bool | None   # None: could not be measured

    @property
    def verdict(self) -> str:
        return "n/a" if self.ok is None else ("PASS" if self.ok else "MISS")


@dataclass
class Results:
    a: dict[str, uncontended.LibResult] | None
    b_threads: dict[str, contention.Summary] | None
    b_procs: dict[str, contention.Summary] | None
    w: renewal.WResult | None
    threads: int
    procs: int
    hold_ms: float


def table_a(a: dict[str, uncontended.LibResult]) -> Table:
    rows = [[lib, num(r.pairs_per_s, 0), num(r.p50_us, 1), num(r.p99_us, 1), f"{num(r.ratio)}x"]
            for lib, r in a.items()]
    return Table("(A) uncontended lock+unlock pairs (median of rounds)",
                 ["library", "pairs/s", "p50 us", "p99 us", "p50 / floor"], rows)


def table_b(title: str, b: dict[str, contention.Summary]) -> Table:
    rows = []
    for lib, s in b.items():
        lo, hi = s.share_spread
        rows.append([
            lib, num(s.acq_per_s, 0), f"{num(s.gap(50), 3)} / {num(s.gap(99), 3)}",
            f"{num(s.cross(50), 3)} / {num(s.cross(99), 3)}", f"{num(s.cross_ratio)}x",
            f"{num(100 * s.self_fraction, 1)}%", num(s.max_wait_ms, 1), num(s.p99_wait_ms, 1),
            num(s.client_per_acq), num(s.server_per_acq), f"{num(lo)}-{num(hi)}",
            "ok" if s.checks_ok else "FAILED"])
    return Table(title, ["library", "acq/s", "hand-off p50/p99 ms", "cross-holder p50/p99 ms",
                         "cross p50 vs prl", "same holder", "max wait ms", "p99 wait ms",
                         "client cmds/acq", "server cmds/acq", "share min-max", "exclusion"], rows)


def table_breakdown(title: str, b: dict[str, contention.Summary]) -> Table:
    def fmt(d: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in d.items() if v >= 0.005) or "-"
    rows = [[lib, fmt(s.breakdown("client")), fmt(s.breakdown("server")),
             "yes" if s.evalsha_agrees else "NO"] for lib, s in b.items()]
    return Table(title, ["library", "client sends, per acquisition",
                         "server executes (incl. script-inner), per acquisition",
                         "EVALSHA client = server"], rows, left=4)


def table_w(w: renewal.WResult) -> Table:
    rows = [
        ["locks held (watchdog mode)", f"{w.locks:,}"],
        ["watchdog_timeout / renewal period", f"{num(w.watchdog_timeout, 1)} s / {num(w.period, 2)} s"],
        ["time to acquire them all", f"{num(w.acquire_s)} s ({num(w.locks / w.acquire_s, 0)}/s)"],
        ["periods observed", num(w.periods, 1)],
        ["renewal round trips per period", num(w.round_trips)],
        ["keys renewed per period", num(w.renewed, 0)],
        ["EVALSHA per period (server)", num(w.server_evalsha, 1)],
        ["client CPU per period, whole process", f"{num(w.process_cpu_ms, 1)} ms"],
        ["client CPU per period, watchdog thread", f"{num(w.thread_cpu_ms, 1)} ms"],
        ["Redis CPU per period (INFO cpu)", f"{num(w.redis_cpu_ms, 1)} ms"],
        ["Redis time in renew scripts per period", f"{num(w.redis_script_ms, 1)} ms"],
        ["watchdog threads / all threads", f"{w.watchdog_threads} / {w.threads_total}"],
        ["keys alive after observing (TTL > 0)", f"{w.alive:,} of {w.locks:,}"],
        ["lowest TTL seen at the end", f"{w.min_ttl_ms:,} ms"],
        ["time to release them all", f"{num(w.release_s)} s"],
        ["keys left after release", f"{w.left_after_release:,}"],
    ]
    return Table("(W) one process holding many watchdog-mode locks", ["metric", "value"], rows)


def targets(res: Results) -> list[Target]:
    out: list[Target] = []
    if res.a is not None and RLOCK in res.a:
        r = res.a[RLOCK].ratio
        out.append(Target("A: uncontended pair p50 vs floor", f"<= {A_MAX_RATIO:.2f}x",
                          f"{num(r)}x ({num(res.a[RLOCK].p50_us, 1)} vs "
                          f"{num(res.a[FLOOR].p50_us, 1)} us)", r <= A_MAX_RATIO))
    for label, b in (("threads", res.b_threads), ("processes", res.b_procs)):
        if b is None or RLOCK not in b:
            continue
        s = b[RLOCK]
        n = res.threads if label == "threads" else res.procs
        tag = f"B {n} {label}"
        if PRL in b:
            out.append(Target(f"{tag}: cross-holder hand-off p50 vs python-redis-lock",
                              f"<= {B_MAX_CROSS_RATIO:.2f}x",
                              f"{num(s.cross_ratio)}x ({num(s.cross(50), 3)} vs "
                              f"{num(b[PRL].cross(50), 3)} ms)", s.cross_ratio <= B_MAX_CROSS_RATIO))
        out.append(Target(f"{tag}: max acquire wait", f"<= {B_MAX_WAIT_MS:.0f} ms",
                          f"{num(s.max_wait_ms, 1)} ms", s.max_wait_ms <= B_MAX_WAIT_MS))
        out.append(Target(f"{tag}: client commands per acquisition", f"<= {B_MAX_CLIENT_CMDS}",
                          num(s.client_per_acq), s.client_per_acq <= B_MAX_CLIENT_CMDS))
        out.append(Target(f"{tag}: exclusion (counter, no overlap)", "no violation",
                          "ok" if s.checks_ok else "VIOLATED", s.checks_ok))
    if res.w is not None:
        w = res.w
        out.append(Target("W: renewal round trips per period", f"<= {W_MAX_ROUND_TRIPS:.0f}",
                          num(w.round_trips), w.round_trips <= W_MAX_ROUND_TRIPS))
        out.append(Target("W: renewal threads", "1", str(w.watchdog_threads), w.watchdog_threads == 1))
        out.append(Target("W: every lock still alive", f"{w.locks:,} with TTL > 0",
                          f"{w.alive:,}", w.alive == w.locks))
    return out


def table_targets(ts: list[Target]) -> Table:
    return Table("Targets", ["target", "goal", "measured", "result"],
                 [[t.name, t.goal, t.measured, t.verdict] for t in ts], left=4)


def observations(res: Results) -> list[str]:
    """Commentary computed from the numbers, so it can never contradict the tables."""
    notes: list[str] = []
    if res.a is not None and RLOCK in res.a:
        ra, fl = res.a[RLOCK], res.a[FLOOR]
        diff = ra.p50_us - fl.p50_us
        why = ("its Python bookkeeping (owner string, hold registry, pub/sub and yield checks) "
               "costs more than it saves by sending each script straight on a pooled connection"
               if diff >= 0 else
               "sending each script straight on a pooled connection, past redis-py's generic "
               "command path that the floor's `client.evalsha` takes, saves more than its "
               "Python bookkeeping (owner string, hold registry, pub/sub and yield checks) costs")
        notes.append(f"A: a django-rlock pair is two EVALSHA, like the floor, and costs "
                     f"{num(abs(diff), 1)} us {'more' if diff >= 0 else 'less'} at p50 "
                     f"({num(ra.ratio)}x): {why}.")
    for label, b, n in (("threads", res.b_threads, res.threads), ("processes", res.b_procs, res.procs)):
        if b is None or RLOCK not in b:
            continue
        s = b[RLOCK]
        bd = s.breakdown("client")
        attempts = bd.get("evalsha", 0.0) + bd.get("eval", 0.0) - 1.0
        notes.append(
            f"B {n} {label}: django-rlock made {num(attempts)} acquire attempts per acquisition "
            f"(EVALSHA per acquisition minus the one release); {num(100 * s.self_fraction, 1)}% "
            f"of hand-offs went back to the same holder; worst wait {num(s.max_wait_ms, 1)} ms.")
        if s.client_per_acq > B_MAX_CLIENT_CMDS:
            notes.append(
                f"B {n} {label}: MISS on client commands ({num(s.client_per_acq)} > "
                f"{B_MAX_CLIENT_CMDS}): every failed attempt is one more EVALSHA. A release "
                f"PUBLISHes to every process subscribed to the lock's channel (the releasing "
                f"process's own subscription included) and each wakes one waiter, so up to {n} "
                f"attempts race for each hand-off and all but one fail.")
        if s.max_wait_ms > B_MAX_WAIT_MS:
            notes.append(f"B {n} {label}: MISS on max wait ({num(s.max_wait_ms, 1)} ms).")
        if PRL in b and not s.cross_ratio <= B_MAX_CROSS_RATIO:
            notes.append(f"B {n} {label}: MISS on hand-off speed: cross-holder p50 is "
                         f"{num(s.cross_ratio)}x python-redis-lock's.")
        for lib, other in b.items():
            if not other.checks_ok:
                errs = [e for r in other.runs for e in r.errors][:3]
                notes.append(f"B {n} {label}: {lib} FAILED its exclusion/counter check "
                             f"({'; '.join(errs) or 'lost updates or overlapping holds'}).")
    if res.w is not None:
        w = res.w
        notes.append(
            f"W: {w.locks:,} locks cost {num(w.round_trips)} round trips and "
            f"{num(w.thread_cpu_ms, 1)} ms of watchdog-thread CPU per {num(w.period, 2)} s period "
            f"({num(w.renewed, 0)} keys renewed per period; ideal is {w.locks:,}).")
    return notes


def render_text(res: Results) -> str:
    parts: list[str] = []
    if res.a is not None:
        parts.append(table_a(res.a).text())
    if res.b_threads is not None:
        parts.append(table_b(f"(B) {res.threads} threads in one process, hold ~{res.hold_ms:g} ms",
                             res.b_threads).text())
        parts.append(table_breakdown("commands per acquisition, threads", res.b_threads).text())
    if res.b_procs is not None:
        parts.append(table_b(f"(B) {res.procs} processes, one thread each, hold ~{res.hold_ms:g} ms",
                             res.b_procs).text())
        parts.append(table_breakdown("commands per acquisition, processes", res.b_procs).text())
    if res.w is not None:
        parts.append(table_w(res.w).text())
    parts.append(table_targets(targets(res)).text())
    parts.append("\n".join(f"- {n}" for n in observations(res)))
    return "\n\n".join(parts)


def _kept_notes(path: Path) -> str:
    if path.exists():
        m = re.search(re.escape(NOTES_START) + r"(.*?)" + re.escape(NOTES_END), path.read_text(),
                      re.DOTALL)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return "_No notes yet for this run._"


def render_markdown(res: Results, path: Path, command: str, machine: list[tuple[str, str]],
                    settings: list[tuple[str, str]], method: list[str]) -> str:
    md: list[str] = ["# Benchmarks", ""]
    md += ["Generated by `bench/run.py`; rerun it to refresh every number on this page. Only the",
           "Notes section is written by hand (the generator keeps it across reruns).", "",
           "```", command, "```", ""]
    md += ["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in machine], ""]
    md += ["Settings: " + "; ".join(f"{k} {v}" for k, v in settings) + ".", ""]
    md += ["## Targets", "", table_targets(targets(res)).markdown(), ""]
    if res.a is not None:
        md += ["## (A) Uncontended lock+unlock", "", table_a(res.a).markdown(), ""]
    if res.b_threads is not None:
        md += [f"## (B) Contention: {res.threads} threads in one process", "",
               table_b("", res.b_threads).markdown(), "",
               table_breakdown("", res.b_threads).markdown(), ""]
    if res.b_procs is not None:
        md += [f"## (B) Contention: {res.procs} processes", "",
               table_b("", res.b_procs).markdown(), "",
               table_breakdown("", res.b_procs).markdown(), ""]
    if res.w is not None:
        md += ["## (W) Watchdog: many locks held by one process", "", table_w(res.w).markdown(), ""]
    md += ["## What the numbers say", "", *[f"- {n}" for n in observations(res)], ""]
    md += ["## Method", "", *[f"- {m}" for m in method], ""]
    md += ["## Notes", "", NOTES_START, _kept_notes(path), NOTES_END, ""]
    return "\n".join(md)
