"""django-rlock: Redisson's distributed locks for Python, first-class in Django and Celery.

Importing this package needs neither Django nor configured settings: the engine names are
imported eagerly, the Django-facing ones (``get_lock``, ``locked``, ...) on first use.
"""

from typing import Any

from .engine import (
    AsyncCountDownLatch,
    AsyncFairLock,
    AsyncFencedLock,
    AsyncMultiLock,
    AsyncPermitExpirableSemaphore,
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncRedLock,
    AsyncRLock,
    AsyncSemaphore,
    AsyncWriteLock,
    CountDownLatch,
    FairLock,
    FencedLock,
    LockBusy,
    LockError,
    LockNotOwnedError,
    LockNotSyncedError,
    MultiLock,
    MultiLockError,
    PermitExpirableSemaphore,
    ReadLock,
    ReadWriteLock,
    RedLock,
    RLock,
    Semaphore,
    WriteLock,
)

__version__ = "0.1.0"

#: Django-facing names, imported on first use: name -> module.
_LAZY = {"get_lock": "factory", "get_semaphore": "factory", "get_latch": "factory",
         "locked": "decorators", "limited": "limits", "fenced_update": "fencing",
         "afenced_update": "fencing"}

__all__ = ["AsyncCountDownLatch", "AsyncFairLock", "AsyncFencedLock", "AsyncMultiLock",
           "AsyncPermitExpirableSemaphore", "AsyncRLock", "AsyncReadLock", "AsyncReadWriteLock",
           "AsyncRedLock", "AsyncSemaphore", "AsyncWriteLock", "CountDownLatch", "FairLock", "FencedLock",
           "LockBusy", "LockError", "LockNotOwnedError", "LockNotSyncedError", "MultiLock",
           "MultiLockError", "PermitExpirableSemaphore", "RLock", "ReadLock", "ReadWriteLock",
           "RedLock", "Semaphore", "WriteLock", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_rlock' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
