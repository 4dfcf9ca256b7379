"""The seeded fault test (issue #25), short form: three fixed seeds of ~20 s each.

Worker processes take RLocks, FencedLocks, FairLocks, read and write locks and semaphore
permits on threads, and AsyncRLocks and AsyncFairLocks on asyncio tasks, while the controller
SIGKILLs and SIGSTOPs them, kills their connections, pauses the server and restarts it empty
(``harness``); the checker (``checker``) then classifies every overlap of critical sections,
lost update, stale fenced write, hold nobody told was gone, and phantom hold. The long form
is ``python -m tests.faults.run --seconds 600 --seed 7`` (docs/faults.md).
"""

from __future__ import annotations

import json

import pytest

from tests.faults.checker import check, format_summary
from tests.faults.harness import FAULT_KINDS, FaultRun

pytestmark = [pytest.mark.faults, pytest.mark.timeout(150)]

SECONDS = 20


def run(tmp_path, seed: int, seconds: float = SECONDS, **kw):
    directory = FaultRun(seed, seconds, directory=str(tmp_path), **kw).run()
    report = check(directory)
    print(f"seed {seed}:\n{format_summary(report.summary)}")
    return report


def shown(report) -> str:
    items = (report.silent[:2] + report.lost_unexplained[:2] + report.stale_unexplained[:2]
             + report.unowned[:2] + report.phantoms[:2])
    return (format_summary(report.summary) + "\n"
            + "\n".join(json.dumps(i, default=str)[:3000] for i in items))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_silent_overlap_lost_update_or_stale_write(tmp_path, seed):
    report = run(tmp_path, seed)
    s = report.summary
    # A test that cannot fail is a defect: every fault happened, and the locks were used.
    assert set(FAULT_KINDS) <= set(s["faults"]), s["faults"]
    assert s["acquisitions"] >= 300, s["acquisitions_by_kind"]
    assert min(s["acquisitions_by_kind"].values()) >= 30, s["acquisitions_by_kind"]
    assert report.problems() == dict.fromkeys(report.problems(), 0), shown(report)


#: Taken by the broken lock's run (``RLOCK_FAULTS_BREAK=naive`` swaps it in for ``fair`` and
#: ``afair`` too, docs/faults.md): a thread's kind and a task's, each caught on its own.
BROKEN_KINDS = ("rlock", "aio")


def caught(report) -> set[str]:
    """The kinds with a silent overlap among sections of that kind alone (``rlock:0`` is
    shared by ``rlock`` and ``aio``: an overlap of the two says nothing about either)."""
    out = set()
    for o in report.silent:
        kinds = {s["kind"] for s in o["sections"]}
        if len(kinds) == 1:
            out |= kinds
    return out


def test_a_broken_lock_fails(tmp_path):
    """SET NX PX + DEL (no owner check, no renewal, never told it lost anything) in place of
    the RLock (threads) and the AsyncRLock (tasks): frozen holders' leases run out and their
    DEL frees someone else's lock.

    Whether a frozen holder's DEL lands inside another's section is timing; on a loaded
    machine one 10 s run can miss it. Each broken kind must be caught by one of three seeds
    (the next only runs while a kind is not caught yet)."""
    reports, found = [], set()
    for seed in (11, 12, 13):
        (tmp_path / str(seed)).mkdir()
        report = run(tmp_path / str(seed), seed, 10, broken="naive", lock_kinds=BROKEN_KINDS,
                     kinds=("stop_long", "stop_short", "kill", "stop_long"))
        reports.append(report)
        by_kind = report.summary["acquisitions_by_kind"]
        assert min(by_kind.get(k, 0) for k in BROKEN_KINDS) >= 100, by_kind
        found |= caught(report)
        if report.summary["overlaps"]["silent"] > 0:
            assert not report.ok()
        if found >= set(BROKEN_KINDS):
            return
    pytest.fail(f"caught only {sorted(found)}:\n" + "\n".join(shown(r) for r in reports))
