"""A task mark's index entry (``taskmark.entry``) as listing reads it back (``parse_entry``)."""

from __future__ import annotations

import os

import pytest

from django_rlock.engine import taskmark
from django_rlock.engine.lockinfo import parse_entry


def test_entry_round_trip() -> None:
    field = "5b0e2f4c-1d2a-4c3b-9e8f-7a6b5c4d3e2f:0"
    parsed = parse_entry(taskmark.entry(field, taskmark.RUNNING, "shop.tasks.export"))
    assert parsed is not None
    _, info = parsed
    assert info["kind"] == "task" and info["more"] == ["running", "shop.tasks.export"]
    assert info["pid"] == os.getpid() and info["owner_short"] == "5b0e2f4c:0"


def test_bad_state_or_name_is_refused() -> None:
    with pytest.raises(ValueError, match="state must be one of"):
        taskmark.entry("x:0", "done", "t")
    with pytest.raises(TypeError, match="task_name must be a non-empty str"):
        taskmark.entry("x:0", taskmark.QUEUED, "")
