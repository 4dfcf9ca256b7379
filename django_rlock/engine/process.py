"""Everything the engine keeps per process, in one place, made anew in a forked child.

A module declares each per-process value once, ``get = process.local(factory)``, and reads it
through ``get()``: made on first use, and dropped by the one fork hook, after the child has
its new identity (``identity.renew``), so a Celery prefork child or a gunicorn worker starts
with none of its parent's holds, subscriptions, wake lines or pending withdrawals (their
threads do not exist in the child, and their sockets are the parent's). ``forked(old)``, if
given, runs in the child on the parent's value as it is dropped: for what the parent's value
still owns there (a lock the parent's threads may have held at the fork).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from . import identity

T = TypeVar("T")

_values: dict[int, Any] = {}
_forked: dict[int, Callable[[Any], None]] = {}
_lock = threading.Lock()
_keys = itertools.count()


def local(factory: Callable[[], T], forked: Callable[[T], None] | None = None) -> Callable[[], T]:
    """Declare a per-process value; returns its getter (cheap: a dict lookup once made)."""
    key = next(_keys)
    if forked is not None:
        _forked[key] = forked

    def get() -> T:
        try:
            return _values[key]  # type: ignore[no-any-return]
        except KeyError:
            with _lock:
                value = _values.get(key)
                if value is None:
                    value = _values[key] = factory()
            return value  # type: ignore[no-any-return]

    return get


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a parent thread may have held it at the fork
    identity.renew()
    old = dict(_values)
    _values.clear()
    for key, value in old.items():
        forked = _forked.get(key)
        if forked is not None:
            forked(value)


os.register_at_fork(after_in_child=_after_fork_in_child)
