"""What kind of redis-py client the engine was given: a cluster's, an asyncio one, or one it
cannot use (a clear ``TypeError`` before any command, rather than a failure deep in redis-py).
"""

from __future__ import annotations

import inspect
from typing import Any

import redis
import redis.asyncio

__all__ = ["check_client", "is_asyncio", "is_cluster"]


def is_cluster(client: Any) -> bool:
    """A redis-py ``RedisCluster`` (sync or asyncio): many servers, no pool of its own."""
    return not hasattr(client, "connection_pool") and hasattr(client, "get_node_from_key")


def is_asyncio(client: Any) -> bool:
    """Whether a redis-py client (or a look-alike with a pool) is an asyncio one."""
    if isinstance(client, (redis.Redis, redis.asyncio.Redis)):
        return isinstance(client, redis.asyncio.Redis)
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def check_client(client: Any, what: str, cluster_ok: bool = False, aio: bool = False) -> None:
    """A clear TypeError, before any command, for a client the engine cannot use.

    ``what`` names the lock in the message (``"lock 'x'"``); ``cluster_ok``: this kind runs on
    a ``RedisCluster`` (issue #10), an asyncio one if ``aio``. A cluster client is named as
    such: it is a redis-py client, only not one of a single server.
    """
    if hasattr(client, "connection_pool"):
        if is_asyncio(client) != aio:  # else it fails at first use, deep in redis-py
            have, want = ("an asyncio", "a sync") if aio is False else ("a sync", "an asyncio")
            raise TypeError(f"{type(client).__module__}.{type(client).__qualname__} is {have} "
                            f"client; {what} takes {want} redis-py client")
        return
    if is_cluster(client):
        is_aio = isinstance(client, redis.asyncio.RedisCluster)
        if cluster_ok and is_aio == aio:
            return
        kind = "an asyncio Redis Cluster" if is_aio else "a Redis Cluster"
        if cluster_ok:
            want = "an asyncio" if aio else "a sync"
            raise TypeError(f"{type(client).__name__} is {kind} client; this kind ({what}) "
                            f"takes {want} RedisCluster")
        raise TypeError(
            f"{type(client).__name__} is {kind} client, which this kind does not support yet "
            f"({what}): use a client of a standalone or Sentinel-managed Redis")
    raise TypeError(f"client must be a redis-py client, not {type(client).__name__} ({what})")
