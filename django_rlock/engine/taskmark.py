"""The ``task`` kind: an enqueue de-duplication mark, listed as the task it stands for.

A mark (written by the Celery glue, ``django_rlock.celery``, through ``lua/mark_claim.lua``) is
a hash in lock layout whose one field is ``<task id>:0``; the process that writes it is the one
that enqueued the task (often a shell that has exited since) or the worker that runs it. Shown
as a lock held by that process it misleads, so its index entry says what it is: kind ``task``,
then the task's state and name (``entry``). Listing shows it with no holder and these details:
``task`` (name), ``task_id``, ``state`` (``queued`` until a worker claims it, ``running``
after), ``since`` (seconds in that state) and ``by`` (the process that enqueued or runs it).

This module knows the layout only; it imports neither Celery nor Django (the Celery glue
imports it, never the reverse).
"""

from __future__ import annotations

from typing import Any

from . import identity
from .kinds import Kind, declare
from .lock import RLock

#: The kind's name, in the index entry and in listings.
TASK = "task"
#: A mark's states: enqueued, not yet claimed by a worker; claimed by the worker running it.
QUEUED = "queued"
RUNNING = "running"
STATES = (QUEUED, RUNNING)
SEP = identity.SEP


def entry(field: str, state: str, task_name: str) -> str:
    """The index entry of the mark whose hash field is ``field``: the calling process's
    ``thread_info_inline`` (format 2: its writer, often a shell gone since, in the entry),
    kind ``task``, then ``state`` and ``task_name``."""
    if state not in STATES:
        raise ValueError(f"task mark {field!r}: state must be one of {STATES}, not {state!r}")
    if not isinstance(task_name, str) or not task_name:
        raise TypeError(f"task mark {field!r}: task_name must be a non-empty str, "
                        f"not {task_name!r}")
    return f"{identity.thread_info_inline(field)}{SEP}{TASK}{SEP}{state}{SEP}{task_name.replace(SEP, '?')}"


def _details(probe: dict[str, Any], detail: bool) -> dict[str, Any]:
    found = probe.get("entry") or {}
    more = found.get("more") or []
    holders = probe.get("holders") or ()
    by = None
    if found.get("pid") is not None:
        by = {"host": found.get("host"), "pid": found.get("pid"), "process": found.get("process")}
    since = found.get("held_for")
    return {"task": more[1] if len(more) > 1 else None,
            "task_id": holders[0].client_id if holders else None,
            "state": more[0] if more else None,
            "since": None if since is None else round(float(since), 3),
            "by": by}


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def summary(d: dict[str, Any]) -> str:
    """``running tasks.sync_account [1b2c...]``: state, task name and task id."""
    return f"{_cell(d['state'])} {_cell(d['task'])} [{_cell(d['task_id'])}]"


def _lines(d: dict[str, Any]) -> list[str]:
    by = d["by"]
    who = "-" if by is None else f"{by['process']} pid {by['pid']} on {by['host']}"
    since = "-" if d["since"] is None else f"{d['since']:.1f}s"
    verb = "run by" if d["state"] == RUNNING else "enqueued by"
    return [f"task: {_cell(d['task'])}", f"task id: {_cell(d['task_id'])}",
            f"state: {_cell(d['state'])} (for {since})", f"{verb}: {who}"]


KIND = declare(Kind(
    TASK, "hash",
    note="The task is not stopped: it stays queued or keeps running, and an identical call "
         "is no longer refused: it can be enqueued and queued beside it.",
    open=RLock, owned=False,
    # Without an index entry (SCAN) a mark reads as a plain lock: only its entry tells.
    detect=lambda probe: False,
    details=_details, summary=summary, lines=_lines))

__all__ = ["KIND", "QUEUED", "RUNNING", "STATES", "TASK", "entry"]
