"""The asyncio tasks an ``AsyncRLock`` hold belongs to, and the futures it must keep alive.

An asyncio lock is owned by its task: a task that ends while still holding can never release
as that owner (task numbers are never reused), so its holds would be renewed forever. Each
task's last hold of each lock is watched, with one done callback per task, not one per hold
(which a task locking in a loop would pile up, with every hold it ever had, for as long as it
runs); the lock is told (``task_done``) when the task ends. Under a lock: holds are booked on
other threads too (a grant on the listener's).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from typing import Any

logger = logging.getLogger("django_rlock")

__all__ = ["keep", "unwatch", "watch"]

#: Give-back and booking tasks started from callbacks: kept alive until they finish.
_background: set[asyncio.Future[Any]] = set()
#: Per task: hold key -> (the lock, its hold).
_watched: weakref.WeakKeyDictionary[Any, dict[Any, tuple[Any, Any]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def watch(task: Any, k: Any, lock: Any, hold: Any) -> None:
    """``hold`` of ``lock`` is ``task``'s: ``lock.task_done(k, hold)`` when the task ends."""
    with _lock:
        held = _watched.get(task)
        if held is None:
            held = _watched[task] = {}
            task.add_done_callback(_task_ended)
        held[k] = (lock, hold)


def unwatch(k: Any, hold: Any, task: Any) -> None:
    """The task's hold ended: a long-lived task must not keep every lock it took."""
    with _lock:
        held = _watched.get(task) if task is not None else None
        if held is not None and held.get(k, (None, None))[1] is hold:
            del held[k]


def keep(fut: asyncio.Future[Any]) -> None:
    """Keep ``fut`` (started from a callback, nobody awaits it) alive until it is done."""
    _background.add(fut)
    fut.add_done_callback(_background.discard)


def _task_ended(task: asyncio.Future[Any]) -> None:
    with _lock:
        held = _watched.pop(task, None)
    for k, (lock, hold) in (held or {}).items():
        try:  # one that fails must not keep the others held forever
            lock.task_done(k, hold)
        except Exception:
            logger.exception("django-rlock: releasing %r after its task ended failed", lock.name)
