"""The waiting side's shape (``engine/wait/``): small modules, one state machine per waiter,
and the old import paths reading and writing the same settings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from django_rlock.engine import pubsub, waiting, wakeline
from django_rlock.engine.wait import settings
from django_rlock.engine.wait.waiter import MOVES, IllegalMove, State, Waiter

WAIT = Path(__file__).resolve().parents[2] / "django_rlock" / "engine" / "wait"


def test_every_module_of_the_wait_package_is_under_500_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in WAIT.glob("*.py")}
    assert sizes and all(n < 500 for n in sizes.values()), sizes


def test_no_module_imports_another_s_private_names():
    for path in [*WAIT.glob("*.py"), *(WAIT.parent / n for n in ("pubsub.py", "waiting.py",
                                                                   "wakeline.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (path.name, node.module, private)


def test_the_state_table_ends_in_left_or_abandoned_and_reaches_every_state():
    assert MOVES[State.LEFT] == frozenset() and MOVES[State.ABANDONED] == frozenset()
    seen, todo = {State.QUEUED}, [State.QUEUED]
    while todo:
        for nxt in MOVES[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(State)
    for state in State:  # every waiter can always get out
        assert state in (State.LEFT, State.ABANDONED) or State.LEFT in MOVES[state] or any(
            State.LEFT in MOVES[n] for n in MOVES[state])


def test_a_move_outside_the_table_is_refused():
    w = Waiter("k")
    w.move(State.ATTEMPTING)
    with pytest.raises(IllegalMove):
        w.move(State.RESERVED)  # never handed the lock while its own acquire is in flight
    w.move(State.ACQUIRED)
    w.move(State.LEFT)
    with pytest.raises(IllegalMove):
        w.move(State.QUEUED)


def test_settings_set_through_the_old_paths_are_the_ones_read(monkeypatch):
    monkeypatch.setattr(pubsub, "HANDOFF_TIMEOUT", 0.5)
    monkeypatch.setattr(wakeline, "ENABLED", False)
    monkeypatch.setattr(waiting, "MOVED_RECHECK", 0.05)
    assert (settings.HANDOFF_TIMEOUT, settings.LINES_ENABLED, settings.MOVED_RECHECK) == (
        0.5, False, 0.05)
    settings.MAX_LINES = 7
    try:
        assert wakeline.MAX_LINES == 7
    finally:
        settings.MAX_LINES = 32
    monkeypatch.undo()
    assert (pubsub.HANDOFF_TIMEOUT, wakeline.ENABLED, waiting.MOVED_RECHECK) == (5.0, True, 0.2)
