"""django-rlock: Redisson's distributed locks for Python, first-class in Django and Celery.

Importing this package needs neither Django nor configured settings: the engine names are
imported eagerly, the Django-facing ones (``get_lock``, ``locked``) on first use.
"""

from typing import Any

from .engine import (
    AsyncMultiLock,
    AsyncRedLock,
    AsyncRLock,
    LockBusy,
    LockError,
    LockNotOwnedError,
    LockNotSyncedError,
    MultiLock,
    MultiLockError,
    RedLock,
    RLock,
)

__version__ = "0.1.0"

__all__ = ["AsyncMultiLock", "AsyncRLock", "AsyncRedLock", "LockBusy", "LockError",
           "LockNotOwnedError", "LockNotSyncedError", "MultiLock", "MultiLockError", "RLock",
           "RedLock", "__version__", "get_lock", "locked"]


def __getattr__(name: str) -> Any:
    if name == "get_lock":
        from .connection import get_lock

        return get_lock
    if name == "locked":
        from .decorators import locked

        return locked
    raise AttributeError(f"module 'django_rlock' has no attribute {name!r}")
