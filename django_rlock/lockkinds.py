"""The lock kinds ``get_lock``, ``@locked`` and ``@limited`` build, by name, on a redis-py client.

The names and the classes are the engine's kind registry's (``django_rlock.engine.kinds``):
nothing here names a kind. Django-free (``@locked(client=...)`` runs without Django): the
Django-facing constructors (``get_lock`` on a cache alias, ...) are in ``django_rlock.factory``,
which re-exports these.
"""

from __future__ import annotations

import inspect
from typing import Any

import redis
import redis.asyncio

from .engine import kinds
from .engine.clients import async_twin, is_cluster, sync_cluster, sync_twin

__all__ = ["async_clients", "async_lock_of_kind", "check_kind", "check_permits",
           "is_async_client", "lock_of_kind"]


def __getattr__(name: str) -> Any:
    # ``KINDS``: the ``kind=`` values ``get_lock`` and ``@locked`` build (None: Redisson's
    # RLock), from the registry.
    if name == "KINDS":
        return kinds.lock_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_kind(kind: Any, name: str) -> str | None:
    """``kind`` if the registry builds locks of it; ValueError naming the lock and the kinds
    there are, before any Redis command."""
    if kind is not None and (not isinstance(kind, str) or kinds.lock_factory(kind) is None):
        known = sorted(k for k in kinds.lock_names() if k is not None)
        listed = ", ".join(map(repr, known[:-1])) + f" or {known[-1]!r}"
        raise ValueError(f"kind must be None, {listed}, not {kind!r} (lock {name!r})")
    return kind


def lock_of_kind(kind: str | None, client: Any, name: str, prefix: str,
                 **options: Any) -> Any:
    """A lock with the ``RLock`` API of one kind on a redis-py client. ``options``: what the
    constructors share (``watchdog_timeout``, ``label``, ``on_lost``, ``sync_replicas``,
    ``sync_timeout``)."""
    check_kind(kind, name)
    make = kinds.lock_factory(kind)
    assert make is not None  # checked above
    return make(client, name, prefix, **options)


def async_lock_of_kind(kind: str | None, client: Any, name: str, prefix: str,
                       **options: Any) -> Any:
    """``lock_of_kind`` for asyncio: ``client`` is a ``redis.asyncio`` client; ``options`` may
    carry ``sync_client`` (the sync twin that renews and waits)."""
    check_kind(kind, name)
    make = kinds.lock_factory(kind, aio=True)
    assert make is not None
    return make(client, name, prefix, **options)


def is_async_client(client: Any) -> bool:
    if isinstance(client, redis.Redis):  # the common case, without inspecting a method
        return False
    if isinstance(client, redis.asyncio.Redis):
        return True
    return hasattr(client, "connection_pool") and inspect.iscoroutinefunction(
        getattr(client, "execute_command", None))


def async_clients(client: Any) -> tuple[Any, Any, Any]:
    """For an asyncio kind on a configured ``client`` (sync or asyncio, a server's or a
    cluster's): its asyncio client for the running loop, a sync client of the same servers,
    and the ``sync_client=`` to give the kind. The one place ``get_lock(aio=True)``, async
    ``@locked``, ``@limited`` and ``@rate_limited`` decide it. On a cluster the last is None:
    every kind then waits and renews on its slot master's own client (``SlotBound``), and the
    counters refuse a cluster client there."""
    if is_cluster(client):
        if isinstance(client, redis.asyncio.RedisCluster):
            return client, sync_cluster(client), None
        return async_twin(client), client, None
    if is_async_client(client):
        sync = sync_twin(client)
        return client, sync, sync
    return async_twin(client), client, client


def check_permits(permits: Any, name: str) -> int:
    """A number of permits: an int >= 1 (TypeError/ValueError naming the semaphore)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__} "
                        f"(semaphore {name!r})")
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r} (semaphore {name!r})")
    return permits
