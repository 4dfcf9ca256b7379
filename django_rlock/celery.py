"""Celery behaviour of ``@locked``: skip or retry a task whose lock is busy.

Decorate with the task decorator outermost::

    @shared_task(bind=True)
    @locked("sync:{account_id}", on_busy="retry")
    def sync_account(self, account_id): ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .engine import LockBusy


def task_of(args: tuple[Any, ...], wrapper: Callable[..., Any] | None = None) -> Any:
    """The Celery task this call runs as, or None.

    A bound task passes itself first; an unbound one is recognised as the worker's current
    task whose ``run`` is our wrapper.
    """
    try:
        from celery import Task
        from celery._state import get_current_task
    except ImportError:
        return None
    if args and isinstance(args[0], Task):
        return args[0]
    if wrapper is not None:
        current = get_current_task()
        run = getattr(current, "run", None)
        if current is not None and getattr(run, "__func__", run) is wrapper:
            return current
    return None


def retry(busy: LockBusy, task: Any, countdown: float | None = None) -> Any:
    """``raise task.retry(...)`` after the holder's remaining lease (or ``countdown``)."""
    if task is None:
        raise TypeError(f"on_busy='retry' needs a bound task (@shared_task(bind=True)) to retry "
                        f"(lock {busy.name!r})")
    if countdown is None:
        ttl = busy.ttl
        countdown = 1 if ttl is None or math.isinf(ttl) else max(1, math.ceil(ttl))
    raise task.retry(countdown=countdown, exc=busy)
