"""Sync and asyncio clients for one Redis server, made from each other's settings.

An ``AsyncRLock`` sends its acquire and release scripts on its ``redis.asyncio`` client, but
renewal and waiting are shared by the whole process: one watchdog thread and one pub/sub
subscription per server, both on threads. They reach the server through a sync "twin" of the
async client: same address, database and credentials, its own small pool.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import redis
import redis.asyncio

#: Connection settings that mean the same to the sync and asyncio connection classes.
_PORTABLE = frozenset({
    "host", "port", "path", "db", "username", "password", "credential_provider",
    "socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
    "encoding", "encoding_errors", "decode_responses", "client_name", "lib_name", "lib_version",
    "health_check_interval", "protocol", "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs",
    "ssl_ca_certs", "ssl_ca_data", "ssl_check_hostname", "ssl_min_version", "ssl_ciphers",
})

_sync_twins: weakref.WeakKeyDictionary[Any, redis.Redis] = weakref.WeakKeyDictionary()
_async_twins: weakref.WeakKeyDictionary[Any, dict[Any, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary())


def check_client(client: Any, what: str) -> None:
    """A clear TypeError, before any command, for a client the engine cannot use.

    ``what`` names the lock in the message (``"lock 'x'"``). A Redis Cluster client is named as
    such: it is a redis-py client, only not one of a single server (issue #10).
    """
    if hasattr(client, "connection_pool"):
        return
    if hasattr(client, "get_node_from_key"):
        raise TypeError(
            f"{type(client).__name__} is a Redis Cluster client, which django-rlock does not "
            f"support yet ({what}): use a client of a standalone or Sentinel-managed Redis "
            f"(a node's own client is not enough: a lock's scripts also write a per-prefix index "
            f"that lives in another slot)")
    raise TypeError(f"client must be a redis-py client, not {type(client).__name__} ({what})")


def _twin_kwargs(pool: Any, target: Any) -> dict[str, Any]:
    name = pool.connection_class.__name__
    cls = getattr(target, name, None)
    if cls is None:
        raise TypeError(f"cannot derive a {target.__name__} client from a {name} connection; "
                        "pass the other client explicitly")
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _PORTABLE}
    kwargs["connection_class"] = cls
    return kwargs


def sync_twin(client: Any) -> redis.Redis:
    """A sync client to the server of an asyncio client (cached per pool)."""
    pool = client.connection_pool
    twin = _sync_twins.get(pool)
    if twin is None:
        kwargs = _twin_kwargs(pool, redis.connection)
        twin = redis.Redis(connection_pool=redis.ConnectionPool(max_connections=8, **kwargs))
        _sync_twins[pool] = twin
    return twin


def async_twin(client: Any) -> redis.asyncio.Redis:
    """An asyncio client to the server of a sync client, for the running event loop.

    asyncio connections belong to the loop that opened them, and Django runs async views of
    a WSGI server in a new loop per request: one twin per (pool, loop).
    """
    pool = client.connection_pool
    loop = asyncio.get_running_loop()
    per_loop = _async_twins.get(pool)
    if per_loop is None:
        per_loop = _async_twins[pool] = weakref.WeakKeyDictionary()  # type: ignore[assignment]
    twin = per_loop.get(loop)
    if twin is None:
        kwargs = _twin_kwargs(pool, redis.asyncio.connection)
        twin = redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool(**kwargs))
        per_loop[loop] = twin
    return twin
