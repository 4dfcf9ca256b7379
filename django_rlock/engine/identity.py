"""Who owns a lock: ``<uuid4 of this process>:<thread ident>``.

The uuid is made anew in a forked child (Celery prefork, gunicorn), so a child never
inherits, renews or releases its parent's locks. Modules with per-process state (the
watchdog thread, the pub/sub connection) register a reset hook here.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import uuid
import weakref
from collections.abc import Callable

_process_id = str(uuid.uuid4())
_pid = os.getpid()
_fork_hooks: list[Callable[[], None]] = []


def process_id() -> str:
    """The uuid that names this process in lock hashes."""
    return _process_id


def thread_owner() -> str:
    """The hash field of the calling thread: Redisson's ``<client uuid>:<thread id>``."""
    return f"{_process_id}:{threading.get_ident()}"


_task_ids: weakref.WeakKeyDictionary[asyncio.Task[object], int] = weakref.WeakKeyDictionary()
_task_counter = itertools.count(1)


def task_owner() -> str:
    """The hash field of the running asyncio task: ``<client uuid>:<task number>``.

    Concurrent tasks share a thread (and ``sync_to_async`` runs many calls on one thread), so
    a thread id would let them "re-enter" each other's lock. Each task gets its own number,
    never reused in this process; a child task is a different owner from its parent.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("AsyncRLock must be used from inside an asyncio task")
    n = _task_ids.get(task)
    if n is None:
        n = _task_ids[task] = next(_task_counter)
    return f"{_process_id}:{n}"


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook`` in every forked child, after the new process id is set."""
    _fork_hooks.append(hook)


def _after_fork_in_child() -> None:
    global _process_id, _pid
    _process_id = str(uuid.uuid4())
    _pid = os.getpid()
    for hook in _fork_hooks:
        hook()


os.register_at_fork(after_in_child=_after_fork_in_child)
