"""Exceptions. Every one carries the lock name so a log line says which lock."""

from __future__ import annotations


class LockError(Exception):
    """Base class of every django-rlock error."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockNotOwnedError(LockError, RuntimeError):
    """The caller released a lock it does not hold (never held, expired, lost or force-unlocked).

    Also a ``RuntimeError`` so that code written for ``threading.RLock`` keeps working.
    """


class LockBusy(LockError):
    """The lock stayed held by someone else for the whole wait budget.

    ``ttl`` is the holder's remaining lease in seconds (``None`` if unknown, ``inf`` if the
    key has no expiry) so a caller can say "retry after".
    """

    def __init__(self, message: str, name: str | None = None, ttl: float | None = None) -> None:
        super().__init__(message, name)
        self.ttl = ttl


class LockNotSyncedError(LockError):
    """An acquire reached the master but too few replicas acknowledged it in time (``WAIT``).

    The acquire was undone: a failover now could promote a replica without the lock and let a
    second client take it. ``connected`` and ``acknowledged`` are replica counts.
    """

    def __init__(self, message: str, name: str | None = None, connected: int = 0,
                 acknowledged: int = 0, required: int = 0) -> None:
        super().__init__(message, name)
        self.connected = connected
        self.acknowledged = acknowledged
        self.required = required


class LockReentryError(LockError):
    """A ``NonReentrantLock``'s holder asked for it again: ``lock()`` raises this at once
    (waiting would wait for itself forever); ``try_lock()`` returns False instead."""


class LockUpgradeError(LockReentryError):
    """A reader of a ``ReadWriteLock`` asked to wait for its write lock (an upgrade): the write
    waits for every reader to leave, the caller included, so it would wait for itself.
    ``lock()`` and ``try_lock(wait_time > 0)`` raise this at once; a one-shot ``try_lock()``
    returns False, as in Redisson."""
