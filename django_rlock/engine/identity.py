"""Who owns a lock: ``<uuid4 of this process>:<thread ident>``.

The uuid is made anew in a forked child (Celery prefork, gunicorn), so a child never
inherits, renews or releases its parent's locks. Modules with per-process state (the
watchdog thread, the pub/sub connection) register a reset hook here.
"""

from __future__ import annotations

import os
import threading
import uuid
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
