"""The Redis connection of a Django cache alias: its client (``get_client``) and key prefix.

The locks made on it are ``django_rlock.factory``'s (``get_lock``, ...).

Everything here is resolved on each call, never at import, in ``ready()`` or in a module
global: ``override_settings(CACHES=...)`` rebuilds the cache handlers, and a stale client would
point at the old server.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache as BuiltinRedisCache
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import get_config
from .engine import MultiLock, RedLock, RLock

if TYPE_CHECKING:
    import redis


#: What ``cache_alias()`` names the connection of ``RLOCK['REDIS_URL']`` (listings show it).
URL_ALIAS = "RLOCK['REDIS_URL']"

#: URL -> client. Resolved on first use, dropped when the RLOCK setting changes; redis-py's
#: pool notices a fork and opens new connections in the child.
_url_clients: dict[tuple[str, ...], Any] = {}


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
        where = "RLOCK['CACHE']" if cache is None else "cache="
        raise ImproperlyConfigured(
            f"django-rlock: the cache alias {alias!r} is not in settings.CACHES "
            f"(set {where} to one of {sorted(settings.CACHES)})")
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


def _url_client(url: str | list[str]) -> redis.Redis:
    seeds = tuple(url) if isinstance(url, (list, tuple)) else (url,)
    client = _url_clients.get(seeds)
    if client is None:
        import redis
        import redis.cluster

        # RLOCK['CLUSTER']: a node's URL, or several (the first process to start after a
        # node died must find the cluster through another); the cluster client finds the
        # others (and follows their failovers). Dropped with the setting, like the plain client.
        if get_config()["CLUSTER"] is True:
            others = [redis.cluster.ClusterNode(u.hostname, u.port or 6379)
                      for u in map(urlsplit, seeds[1:])]
            made = redis.cluster.RedisCluster.from_url(seeds[0], startup_nodes=others)
        else:
            made = redis.Redis.from_url(seeds[0])
        client = _url_clients.setdefault(seeds, made)
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


def multi_lock(members: list[RLock], quorum: bool) -> MultiLock:
    """A ``RedLock`` of ``members`` with ``quorum``, else a ``MultiLock``."""
    return RedLock(*members) if quorum else MultiLock(*members)
