"""Locks on the Redis connection of a Django cache alias.

Everything here is resolved on each call, never at import, in ``ready()`` or in a module
global: ``override_settings(CACHES=...)`` rebuilds the cache handlers, and a stale client would
point at the old server.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache as BuiltinRedisCache
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import get_config, lock_options
from .decorators import check_kind, check_permits, lock_of_kind
from .engine import MultiLock, RedLock, RLock

if TYPE_CHECKING:
    import redis


#: What ``cache_alias()`` names the connection of ``RLOCK['REDIS_URL']`` (listings show it).
URL_ALIAS = "RLOCK['REDIS_URL']"

#: URL -> client. Resolved on first use, dropped when the RLOCK setting changes; redis-py's
#: pool notices a fork and opens new connections in the child.
_url_clients: dict[str, Any] = {}


def cache_alias(cache: str | None = None) -> str:
    """``cache``, or ``RLOCK['CACHE']`` (``URL_ALIAS`` when ``RLOCK['REDIS_URL']`` is set);
    ImproperlyConfigured if CACHES has no such alias."""
    if cache is None and get_config()["REDIS_URL"] is not None:
        return URL_ALIAS
    if cache == URL_ALIAS:
        if get_config()["REDIS_URL"] is None:
            raise ImproperlyConfigured(f"django-rlock: {URL_ALIAS} is not set")
        return cache
    alias = cache if cache is not None else get_config()["CACHE"]
    if alias not in settings.CACHES:
        raise ImproperlyConfigured(
            f"django-rlock: the cache alias {alias!r} is not in settings.CACHES "
            f"(set RLOCK['CACHE'] to one of {sorted(settings.CACHES)})")
    return alias


@functools.cache
def _django_redis_classes() -> tuple[type, type] | None:
    """django-redis's cache backend and ShardClient, or None without django-redis."""
    try:
        from django_redis.cache import RedisCache
        from django_redis.client import ShardClient
    except ImportError:
        return None
    return RedisCache, ShardClient


def _backend_path(backend: Any) -> str:
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}"


def get_client(cache: str | None = None) -> redis.Redis:
    """The redis-py client of a cache alias (default: ``RLOCK['CACHE']``): its write side.

    django-redis: the very client (and connection pool) the cache uses, the master when it
    runs on Sentinel. Django's RedisCache: a client on its write (first) server's pool.
    A lock must always be taken on the primary, so a replica is never returned.
    """
    return client_of(cache_alias(cache))


def client_of(alias: str) -> redis.Redis:
    """``get_client`` of an alias ``cache_alias`` has returned (``@locked`` resolves that
    once per settings, this on every call: Django's cache handlers are per thread)."""
    if alias == URL_ALIAS:
        return _url_client(get_config()["REDIS_URL"])  # type: ignore[arg-type]
    backend = caches[alias]
    dj_redis = _django_redis_classes()
    if dj_redis is not None and isinstance(backend, dj_redis[0]):
        # What django_redis.get_redis_connection(alias, write=True) returns, without its
        # second lookup of the per-thread cache handler.
        client = backend.client
        if isinstance(client, dj_redis[1]):
            raise ImproperlyConfigured(
                f"django-rlock: cache {alias!r} uses django-redis's ShardClient; a lock needs one "
                f"Redis server, so use DefaultClient or SentinelClient for RLOCK['CACHE']")
        return client.get_client(write=True)  # type: ignore[no-any-return]
    if isinstance(backend, BuiltinRedisCache):
        return backend._cache.get_client(None, write=True)
    raise ImproperlyConfigured(
        f"django-rlock: cache {alias!r} uses {_backend_path(backend)}, which is not Redis; "
        f"RLOCK['CACHE'] must name a django_redis.cache.RedisCache or "
        f"django.core.cache.backends.redis.RedisCache cache")


def _url_client(url: str) -> redis.Redis:
    client = _url_clients.get(url)
    if client is None:
        import redis
        import redis.cluster

        # RLOCK['CLUSTER']: a node's URL; the cluster client finds the others (and follows
        # their failovers). Dropped with the setting, like the plain client.
        made = (redis.cluster.RedisCluster.from_url(url) if get_config()["CLUSTER"] is True
                else redis.Redis.from_url(url))
        client = _url_clients.setdefault(url, made)
    return client


@receiver(setting_changed)
def _drop_url_clients(*, setting: str, **kwargs: Any) -> None:
    if setting == "RLOCK":
        _url_clients.clear()


def get_prefix(cache: str | None = None) -> str:
    """The key prefix of lock hashes: ``RLOCK['PREFIX']``, else ``"<KEY_PREFIX>:rlock:"``.

    The cache's KEY_PREFIX separates projects sharing a Redis database, so it is honoured.
    The cache VERSION is not: old and new code run side by side during a deploy that bumps
    it, and two keys for one lock would exclude nothing. A KEY_FUNCTION is never called (it
    may hash keys, and SCAN could no longer list locks).
    """
    prefix = get_config()["PREFIX"]
    if prefix is not None:
        if not isinstance(prefix, str):
            raise ImproperlyConfigured(f"RLOCK['PREFIX'] must be a str or None, got {prefix!r}")
        return prefix
    alias = cache_alias(cache)
    if alias == URL_ALIAS:
        return "rlock:"
    key_prefix = settings.CACHES[alias].get("KEY_PREFIX") or ""
    return f"{key_prefix}:rlock:" if key_prefix else "rlock:"


def get_lock(name: str, *, cache: str | Sequence[str] | None = None, label: str | None = None,
             quorum: bool = False, kind: str | None = None) -> Any:
    """A lock on the cache's Redis connection, with the configured prefix, watchdog and
    replica sync. ``label``: what events and metrics call it (a template, never the name).

    ``kind``: None (an ``RLock``), ``"fair"`` (``FairLock``), ``"read"`` / ``"write"`` (the
    ``read_lock()`` / ``write_lock()`` of the ``ReadWriteLock`` of that name) or ``"fenced"``
    (``FencedLock``). Every kind has the ``RLock`` API.

    ``cache=["a", "b", "c"]``: a ``MultiLock`` over those aliases' servers (each with its own
    prefix), or with ``quorum=True`` a ``RedLock`` (a majority of them); only of RLocks.
    """
    check_kind(kind, name)
    if isinstance(cache, (list, tuple)):
        if kind is not None:
            raise ValueError(f"kind={kind!r} cannot span several caches: a MultiLock/RedLock "
                             f"is made of plain RLocks (lock {name!r})")
        return multi_lock([RLock(get_client(a), name, prefix=get_prefix(a), label=label,
                                 **lock_options()) for a in cache_aliases(cache)], quorum)
    if quorum:
        raise ValueError(f"quorum=True needs a list of cache aliases (lock {name!r})")
    return lock_of_kind(kind, get_client(cache), name, get_prefix(cache), label=label,
                        **lock_options())


def get_semaphore(name: str, permits: int | None = None, *, cache: str | None = None) -> Any:
    """A ``PermitExpirableSemaphore`` on the cache's Redis connection (prefix and watchdog
    timeout from the settings): permits taken without a lease are renewed while their holder
    lives and come back within ``WATCHDOG_TIMEOUT`` after a crash.

    ``permits``: set the number of permits if the semaphore has none yet (``try_set_permits``,
    one command now); an existing semaphore keeps its own count. None: leave it alone.
    """
    from .engine.lock import check_name

    check_name(name)
    if permits is not None:
        check_permits(permits, name)
    from .engine.semaphore import PermitExpirableSemaphore

    sem = PermitExpirableSemaphore(get_client(cache), name, get_prefix(cache),
                                   watchdog_timeout=lock_options()["watchdog_timeout"])
    if permits is not None:
        sem.try_set_permits(permits)
    return sem


def get_latch(name: str, *, cache: str | None = None) -> Any:
    """A ``CountDownLatch`` on the cache's Redis connection, at the configured prefix."""
    from .engine.lock import check_name

    check_name(name)
    from .engine.latch import CountDownLatch

    return CountDownLatch(get_client(cache), name, get_prefix(cache))


def cache_aliases(caches_: Sequence[str]) -> list[str]:
    """A list of cache aliases for a MultiLock/RedLock: non-empty, distinct, known."""
    aliases = list(caches_)
    if not aliases or not all(isinstance(a, str) for a in aliases):
        raise ValueError(f"cache must be an alias or a non-empty list of aliases, got {caches_!r}")
    if len(set(aliases)) != len(aliases):
        raise ValueError(f"cache aliases repeat: {aliases!r}")
    return [cache_alias(a) for a in aliases]


def multi_lock(members: list[RLock], quorum: bool) -> MultiLock:
    return RedLock(*members) if quorum else MultiLock(*members)
