"""Sync and asyncio clients for one Redis server, made from each other's settings.

An ``AsyncRLock`` sends its scripts on its ``redis.asyncio`` client; renewal and waiting,
shared by the process (one watchdog thread, one subscription per server), reach the server
through a sync "twin": same address, database and credentials, its own small pool. A twin of
a Sentinel-managed client is Sentinel-managed too (same service, role and sentinels: it
follows a failover). The asyncio twin of a sync client (what ``@locked`` async views send
on) has a blocking pool (``TwinPool``): a call finding every connection in use waits for
one, within its budget, instead of failing (``aiopool``, invariant 34).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.exceptions
import redis.sentinel

from . import identity
from .aiopool import TwinPool, async_cap
from .flavours import is_cluster
from .naming import index_key

#: Connection settings that mean the same to the sync and asyncio connection classes.
_PORTABLE = frozenset({
    "host", "port", "path", "db", "username", "password", "credential_provider",
    "socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
    "encoding", "encoding_errors", "decode_responses", "client_name", "lib_name", "lib_version",
    "health_check_interval", "protocol", "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs",
    "ssl_ca_certs", "ssl_ca_data", "ssl_check_hostname", "ssl_min_version", "ssl_ciphers",
})

_sync_twins: weakref.WeakKeyDictionary[Any, redis.Redis] = weakref.WeakKeyDictionary()
_sync_clusters: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
#: The pool of each asyncio twin -> the sync client it was made from (``cluster_of``).
_async_origins: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_twins_lock = threading.RLock()
_async_twins: weakref.WeakKeyDictionary[Any, dict[Any, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary())


#: Pools of the node clients that locks on a Redis Cluster run on (``node_client``), each with
#: (a weak reference to) its cluster client. On a node a script may touch the keys of one slot
#: only: the index is per lock there, renewals per slot.
_node_pools: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()
#: Per cluster client: bumped whenever its slot map was refreshed, so locks re-resolve their node.
_generations: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_refresh_lock = threading.Lock()


def is_cluster_node(client: Any) -> bool:
    """The client of one cluster node that a lock resolved (``node_client``)."""
    pool = getattr(client, "connection_pool", None)
    return pool is not None and pool in _node_pools


def cluster_of(client: Any) -> Any | None:
    """The cluster a node client (or its asyncio twin) was resolved from, or None."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None
    ref = _node_pools.get(pool)
    if ref is None:
        origin = _async_origins.get(pool)
        return None if origin is None else cluster_of(origin)
    return ref()


#: Pools of cluster nodes whose server has sharded pub/sub (Redis 7+, Valkey).
_sharded_pools: weakref.WeakSet[Any] = weakref.WeakSet()
#: Use sharded pub/sub on cluster nodes that have it (as Redisson does since 3.22): a release
#: reaches its shard's nodes only, not every node of the cluster.
SHARDED = True


def _own(cluster: Any, node: Any) -> redis.Redis:
    client = node.redis_connection or cluster.get_redis_connection(node)
    pool = client.connection_pool
    if pool not in _node_pools:
        _node_pools[pool] = weakref.ref(cluster)
        try:
            version = str(client.info("server").get("redis_version", "0"))
        except redis.exceptions.RedisError:
            version = "0"  # unreachable now (a failover): classic until resolved again
        if int(version.split(".")[0] or 0) >= 7:
            _sharded_pools.add(pool)
    return client


def sharded(client: Any) -> bool:
    """Lock channels on ``client``'s server are shard channels (SSUBSCRIBE, SPUBLISH)."""
    if not SHARDED or not _sharded_pools:  # no cluster node seen: every lock's hot path
        return False
    pool = getattr(client, "connection_pool", None)
    if pool in _sharded_pools:
        return True
    origin = _async_origins.get(pool) if pool is not None else None
    return origin is not None and origin.connection_pool in _sharded_pools


def sync_cluster(client: Any) -> Any:
    """A sync ``RedisCluster`` for an asyncio one (same startup nodes and settings; cached):
    its slot map and node clients serve the threads (watchdog, subscriptions) and the
    asyncio lock's per-node clients (``async_twin`` of each)."""
    twin = _sync_clusters.get(client)
    if twin is None:
        import redis.cluster

        kwargs = _cluster_kwargs(getattr(client, "connection_kwargs", {}))
        nodes = [redis.cluster.ClusterNode(n.host, n.port)
                 for n in client.nodes_manager.startup_nodes.values()]
        twin = _sync_clusters[client] = redis.cluster.RedisCluster(
            startup_nodes=nodes, address_remap=client.nodes_manager.address_remap, **kwargs)
    return twin


def _cluster_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """A cluster client's settings for its twin of the other flavour: the portable ones, and
    TLS (a ``rediss://`` cluster's connection class, which has no twin by that name)."""
    kwargs = {k: v for k, v in settings.items()
              if k in _PORTABLE and k not in ("host", "port", "path", "db")}
    if getattr(settings.get("connection_class"), "__name__", "") == "SSLConnection":
        kwargs["ssl"] = True  # (its ssl_* settings are portable)
    return kwargs


def node_client(cluster: Any, key: str | bytes) -> redis.Redis:
    """The plain client of the master that serves ``key``'s slot.

    A lock lives in one slot (the brace rule keeps its channel and auxiliary keys there), so
    everything per server (scripts sent once, the subscription, the watchdog's pipeline, the
    replica count) works unchanged per node. Sent on the node's own connection, a script is
    never re-sent by the cluster client's retry, and a moved slot answers MOVED before it runs.
    """
    return _own(cluster, cluster.get_node_from_key(key))


def node_at(cluster: Any, host: str, port: int) -> redis.Redis:
    """The client of the node at ``host:port`` (an ASK redirection's target)."""
    node = cluster.nodes_manager.get_node(host=host, port=port)
    if node is None:  # not in the map yet: a refresh finds it (a new node took the slot)
        refresh(cluster, None)
        node = cluster.nodes_manager.get_node(host=host, port=port)
        if node is None:
            raise redis.exceptions.ClusterError(f"no cluster node at {host}:{port}")
    return _own(cluster, node)


def for_key(client: Any, key: str) -> Any:
    """Where a one-key script runs exactly once: on a cluster, the key's master's own client."""
    return node_client(client, key) if is_cluster(client) else client


def index_for(client: Any, prefix: str, key: str) -> str:
    """The index ``key`` is listed in on ``client``'s server (per lock on a cluster)."""
    on_cluster = is_cluster(client) or is_cluster_node(client)
    return index_key(prefix, key if on_cluster else None)


def node_clients(cluster: Any) -> list[redis.Redis]:
    """The plain client of every master (listing, which walks them all)."""
    return [_own(cluster, node) for node in cluster.get_primaries()]


def generation(cluster: Any) -> int:
    return _generations.get(cluster, 0)


def refresh(cluster: Any, exc: BaseException | None) -> None:
    """Bring ``cluster``'s slot map up to date after ``exc`` (MOVED: that slot; anything else, a
    failover maybe: the whole map, best effort) and tell the locks on it to re-resolve."""
    with _refresh_lock:
        nodes = cluster.nodes_manager
        try:
            if isinstance(exc, redis.exceptions.MovedError) and hasattr(nodes, "move_slot"):
                nodes.move_slot(exc)
            else:
                nodes.initialize()
        except redis.exceptions.RedisError:
            pass  # no node answers yet (a failover under way): the next failure tries again
        finally:
            _generations[cluster] = _generations.get(cluster, 0) + 1


def _twin_kwargs(pool: Any, target: Any) -> dict[str, Any]:
    name = pool.connection_class.__name__
    cls = getattr(target, name, None)
    if cls is None:
        raise TypeError(f"cannot derive a {target.__name__} client from a {name} connection; "
                        "pass the other client explicitly")
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _PORTABLE}
    kwargs["connection_class"] = cls
    return kwargs


def _is_sentinel(pool: Any) -> bool:
    """A Sentinel-managed pool (sync or asyncio): its connections find the master (or a
    replica) of ``service_name`` through the sentinels at each connect."""
    return hasattr(pool, "service_name") and hasattr(pool, "sentinel_manager")


def _sentinel_twin(pool: Any, target: Any, client_class: Any, make_pool: Any) -> dict[str, Any]:
    """The arguments of a ``target`` (``redis.sentinel`` or ``redis.asyncio.sentinel``)
    Sentinel pool twinning ``pool``: same service and role, its own sentinel manager asking
    the same sentinels with their own settings (password, TLS), so the twin follows a failover
    as ``pool`` does. ``make_pool`` makes each sentinel's pool from its kwargs."""
    other = pool.sentinel_manager
    manager = target.Sentinel([], min_other_sentinels=other.min_other_sentinels,
                              force_master_ip=getattr(other, "_force_master_ip", None))
    kin = redis.connection if target is redis.sentinel else redis.asyncio.connection
    manager.sentinels = [client_class(connection_pool=make_pool(**_twin_kwargs(s.connection_pool,
                                                                                kin)))
                         for s in other.sentinels]
    kwargs = {k: v for k, v in _twin_kwargs(pool, target).items()
              if k not in ("host", "port", "path")}  # the sentinels' word, at each connect
    return {"service_name": pool.service_name, "sentinel_manager": manager,
            "is_master": pool.is_master, "check_connection": pool.check_connection, **kwargs}


def sync_twin(client: Any) -> redis.Redis:
    """A sync client to the server of an asyncio client (cached per pool); of a Sentinel-managed
    one, a client on a sync Sentinel pool of the same service."""
    pool = client.connection_pool
    twin = _sync_twins.get(pool)
    if twin is None:
        if _is_sentinel(pool):
            kwargs = _sentinel_twin(pool, redis.sentinel, redis.Redis,
                                    lambda **kw: redis.ConnectionPool(max_connections=8, **kw))
            sync_pool: Any = redis.sentinel.SentinelConnectionPool(max_connections=8, **kwargs)
        else:
            sync_pool = redis.ConnectionPool(max_connections=8,
                                             **_twin_kwargs(pool, redis.connection))
        twin = _sync_twins[pool] = redis.Redis(connection_pool=sync_pool)
    return twin


class SentinelTwinPool(TwinPool, redis.asyncio.sentinel.SentinelConnectionPool):
    """The asyncio twin's pool for a Sentinel-managed sync pool: a ``TwinPool`` (waits for a
    connection when full) whose connections ask the sentinels for the master at connect, and
    drop a connection to a demoted master (READONLY), as redis-py's Sentinel pool does."""

    def abandon(self) -> None:
        super().abandon()
        for sentinel in self.sentinel_manager.sentinels:  # their connections: that loop's too
            if isinstance(sentinel.connection_pool, TwinPool):
                sentinel.connection_pool.abandon()


def _async_pool(pool: Any) -> TwinPool:
    """The pool of an asyncio twin of sync ``pool`` (for one event loop)."""
    if not _is_sentinel(pool):
        return TwinPool(async_cap(pool), **_twin_kwargs(pool, redis.asyncio.connection))
    kwargs = _sentinel_twin(pool, redis.asyncio.sentinel, redis.asyncio.Redis,
                            lambda **kw: TwinPool(8, **kw))
    return SentinelTwinPool(async_cap(pool), **kwargs)


def async_twin(client: Any) -> redis.asyncio.Redis:
    """An asyncio client to the server of a sync client, for the running event loop.

    asyncio connections belong to the loop that opened them, and Django runs async views of
    a WSGI server in a new loop per request: one twin per (pool, loop), shared by every lock
    on that pool in that loop, with a ``TwinPool`` of ``async_cap(pool)`` connections.
    """
    if is_cluster(client):  # (Django's settings give a sync RedisCluster)
        return _per_loop(client, lambda: _cluster_twin(client), _abandon_cluster)
    pool = client.connection_pool
    return _per_loop(pool, lambda: _plain_twin(client, pool), _abandon_plain)


def _per_loop(origin: Any, make: Callable[[], Any], drop: Callable[[Any], None]) -> Any:
    """``origin``'s twin for the running loop, made once per (origin, loop). A twin holds its
    loop (its connections' streams do): the weak key alone never lets go, so the twins of
    loops that are closed (a request's, under WSGI) are dropped as a new one is made."""
    loop = asyncio.get_running_loop()
    per_loop = _async_twins.get(origin)
    twin = None if per_loop is None else per_loop.get(loop)
    if twin is not None:
        return twin
    with _twins_lock:  # (threads of a WSGI server make twins, and purge them, at once)
        per_loop = _async_twins.get(origin)
        if per_loop is None:
            per_loop = _async_twins[origin] = weakref.WeakKeyDictionary()  # type: ignore[assignment]
        twin = per_loop.get(loop)
        if twin is None:
            for old in [lp for lp in per_loop if lp.is_closed()]:
                drop(per_loop.pop(old))
            twin = per_loop[loop] = make()
    return twin


def _plain_twin(client: Any, pool: Any) -> Any:
    twin = redis.asyncio.Redis(connection_pool=_async_pool(pool))
    if pool in _node_pools:  # a cluster node's: its redirections follow that cluster
        _async_origins[twin.connection_pool] = client
    return twin


def _abandon_plain(twin: Any) -> None:
    if isinstance(twin.connection_pool, TwinPool):
        twin.connection_pool.abandon()


def _cluster_twin(cluster: Any) -> Any:
    """An asyncio ``RedisCluster`` to a sync one's nodes (for plain reads: ``is_locked`` and
    kin); a lock on it sends on the sync one's node clients and slot map."""
    import redis.asyncio.cluster

    manager = cluster.nodes_manager
    nodes = [redis.asyncio.cluster.ClusterNode(n.host, n.port)
             for n in manager.startup_nodes.values()]
    twin = redis.asyncio.RedisCluster(startup_nodes=nodes, address_remap=manager.address_remap,
                                      **_cluster_kwargs(manager.connection_kwargs))
    _sync_clusters[twin] = cluster  # (its slot map and node clients are the sync one's)
    return twin


def _abandon_cluster(twin: Any) -> None:
    """Its event loop is closed: shut its connections' sockets (as ``TwinPool.abandon``) and
    mark it closed, or the garbage collector reports each as unclosed to whatever loop runs
    then (an ERROR log line per request under WSGI). redis-py's own attributes, read with care."""
    manager = twin.nodes_manager
    nodes = {id(n): n for n in (*getattr(manager, "nodes_cache", {}).values(),
                                *getattr(manager, "startup_nodes", {}).values())}
    for node in nodes.values():
        for conn in list(getattr(node, "_connections", ())):
            writer = getattr(conn, "_writer", None)
            sock = None if writer is None else writer.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            conn._reader = conn._writer = None
    twin._initialize = True  # (what redis-py's __del__ reads as "closed")


class SlotBound:
    """A lock or counter whose names share one slot. On a Redis Cluster it sends on the own
    client of that slot's master, and re-resolves it whenever the cluster client's slot map
    was refreshed since (a redirection, a failover); elsewhere it sends on its client."""

    _cluster: Any = None
    _user_cluster: Any = None
    _gen = 0
    _node: Any
    _sync_client: Any
    key: str

    def _bind(self, client: Any) -> Any:
        """The client to send on for ``self.key`` (call once, with ``key`` set). For an asyncio
        cluster client: the sync node client, whose asyncio twin the lock sends on."""
        if is_cluster(client):
            self._user_cluster = client
            if isinstance(client, redis.asyncio.RedisCluster):
                client = sync_cluster(client)
            self._cluster = client
            self._gen = generation(client)
            client = node_client(client, self.key)
        self._node = client
        return client

    @property
    def _client(self) -> Any:
        if self._cluster is None or self._gen == generation(self._cluster):
            return self._node
        return self._follow()

    @property
    def _reader(self) -> Any:
        # Plain reads: on a cluster the caller's cluster client, which follows MOVED and ASK.
        return self._client if self._cluster is None else self._user_cluster

    def _moved_check(self) -> Callable[[], bool] | None:
        """For a wait starting now: a check that the slot has left the node it subscribes on."""
        if self._cluster is None:
            return None
        node = self._node

        def moved() -> bool:
            self._fresh()
            return self._node is not node
        return moved

    def _fresh(self) -> None:
        if self._cluster is not None and self._gen != generation(self._cluster):
            self._follow()

    def _follow(self) -> Any:
        """The slot map changed: re-resolve the key's master, and wait and subscribe there
        from now on. Holds keep their identity (``_server``)."""
        self._gen = generation(self._cluster)
        self._node = self._sync_client = node_client(self._cluster, self.key)
        return self._node


# -- a thread's own connection ---------------------------------------------------------------
#: Acquire and release scripts go out on a connection the calling thread keeps (one per pool)
#: rather than a pool checkout per call: redis-py's checkout polls the socket and books the
#: connection in and out, which cost more than our whole script on the bench's host (about
#: 40 us a call). Only for a plain ``redis.ConnectionPool`` of redis-py's default size or
#: more, without a client-side cache: a smaller cap (or a ``BlockingConnectionPool``) is the
#: user's limit on connections, and a Sentinel pool moves its connections to a new master at
#: checkout, which a kept connection would miss. Set False to keep every send in the pool.
OWN_CONNECTIONS = True
#: A kept connection unused this long (seconds) is checked for a close by the server before
#: it is written to, as a pool checkout would: Redis closes idle clients after ``timeout``
#: seconds, 1 at the least, so a connection in use more often than this was not closed idle.
OWN_IDLE_CHECK = 0.1
#: redis-py 8's default ``max_connections`` (it was 2**31 before).
_DEFAULT_CAP = 100
_OWN_ATTR = "_django_rlock_own"


class OwnConnection(threading.local):
    """The calling thread's connection to one pool's server. It closes with the thread (the
    local goes, the connection's finalizer disconnects); a forked child makes its own."""

    conn: Any = None
    #: The process uuid it was made under (``identity`` makes a new one in a forked child).
    process = ""
    used = 0.0
    #: In use by this thread: a send from a signal handler or finalizer that runs meanwhile
    #: would read the pending reply; it goes through the pool instead.
    busy = False

    def take(self, pool: Any) -> Any:
        """The connection, connected (a connection error is raised: nothing was sent)."""
        conn = self.conn
        if conn is None or self.process != identity.process_id():
            # The parent's connection is left alone: redis-py never shuts a socket down
            # from another pid, so dropping it only closes this process's descriptor.
            conn = self.conn = pool.connection_class(**pool.connection_kwargs)
            self.process = identity.process_id()
        elif time.monotonic() - self.used > OWN_IDLE_CHECK:
            try:
                stale = conn.can_read()  # EOF (closed by the server) or bytes nobody read
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                stale = True
            if stale:
                conn.disconnect()  # nothing was sent: the script goes out on a fresh one
        conn.connect()
        return conn


def own_connection(pool: Any) -> OwnConnection | None:
    """The thread-kept connection slot for ``pool``, or None: use the pool."""
    if not OWN_CONNECTIONS:
        return None
    own = getattr(pool, _OWN_ATTR, None)
    if own is None:
        ok = (type(pool) is redis.ConnectionPool
              and getattr(pool, "max_connections", 0) >= _DEFAULT_CAP
              and getattr(pool, "cache", None) is None)
        own = OwnConnection() if ok else False
        setattr(pool, _OWN_ATTR, own)
    return own or None
