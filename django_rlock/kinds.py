"""The lock kinds ``get_lock``, ``@locked`` and ``@limited`` build, by name, on a redis-py client.

Django-free (``@locked(client=...)`` runs without Django): the Django-facing constructors
(``get_lock`` on a cache alias, ...) are in ``django_rlock.factory``, which re-exports these.
"""

from __future__ import annotations

from typing import Any

from .engine import AsyncRLock, RLock

__all__ = ["KINDS", "async_lock_of_kind", "check_kind", "check_permits", "lock_of_kind"]

#: The lock kinds ``get_lock`` and ``@locked`` build: None is Redisson's RLock.
KINDS: tuple[str | None, ...] = (None, "fair", "read", "write", "fenced")


def check_kind(kind: Any, name: str) -> str | None:
    """``kind`` if it is one of ``KINDS``; ValueError naming the lock, before any Redis command."""
    if kind is not None and (not isinstance(kind, str) or kind not in KINDS):
        raise ValueError(f"kind must be None, 'fair', 'read', 'write' or 'fenced', not {kind!r} "
                         f"(lock {name!r})")
    return kind


def lock_of_kind(kind: str | None, client: Any, name: str, prefix: str,
                 **options: Any) -> Any:
    """A lock with the ``RLock`` API of one kind (see ``KINDS``) on a redis-py client.

    ``options``: what the constructors share (``watchdog_timeout``, ``label``, ``on_lost``,
    ``sync_replicas``, ``sync_timeout``). The kinds' modules are imported on first use.
    """
    check_kind(kind, name)
    if kind is None:
        return RLock(client, name, prefix, **options)
    if kind == "fair":
        from .engine.fair import FairLock

        return FairLock(client, name, prefix, **options)
    if kind == "fenced":
        from .engine.fenced import FencedLock

        return FencedLock(client, name, prefix, **options)
    from .engine.rwlock import ReadWriteLock

    rw = ReadWriteLock(client, name, prefix, **options)
    return rw.read_lock() if kind == "read" else rw.write_lock()


def async_lock_of_kind(kind: str | None, client: Any, name: str, prefix: str,
                       **options: Any) -> Any:
    """``lock_of_kind`` for asyncio: ``client`` is a ``redis.asyncio`` client; ``options`` may
    carry ``sync_client`` (the sync twin that renews and waits)."""
    check_kind(kind, name)
    if kind is None:
        return AsyncRLock(client, name, prefix, **options)
    if kind == "fair":
        from .engine.fair import AsyncFairLock

        return AsyncFairLock(client, name, prefix, **options)
    if kind == "fenced":
        from .engine.fenced import AsyncFencedLock

        return AsyncFencedLock(client, name, prefix, **options)
    from .engine.rwlock import AsyncReadWriteLock

    rw = AsyncReadWriteLock(client, name, prefix, **options)
    return rw.read_lock() if kind == "read" else rw.write_lock()


def check_permits(permits: Any, name: str) -> int:
    """A number of permits: an int >= 1 (TypeError/ValueError naming the semaphore)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__} "
                        f"(semaphore {name!r})")
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r} (semaphore {name!r})")
    return permits

