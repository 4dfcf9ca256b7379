"""Is the lock machinery of this process healthy, and is its Redis set up so locks can hold?

``status(client)`` answers the first from what the process already keeps (the watchdog's
holds and thread, each server's subscription) plus one probe connection per server (PING,
INFO, a write, and a ``WAIT`` where replica sync is on); ``findings(client)`` the second, from the
server's settings (``CONFIG GET``), each finding with its fix. Both return plain dicts (JSON
as they are) and never raise for a server that is down: that is a finding too.

The probe connection is a one-off made from the client's own connection class and settings
(same server, credentials, Sentinel lookup), with short timeouts and no retries: a hung server
costs a health check ``PROBE_TIMEOUT`` at most, and the pool the locks use is left alone.

The write: every lock call is a script that writes, and a server can answer PING and INFO
while it holds or refuses writes (``CLIENT PAUSE ... WRITE`` during a failover or an upgrade;
a replica: ``READONLY``; ``min-replicas-to-write`` unmet: ``NOREPLICAS``), when every lock
call hangs or fails. So each probe sends ``PEXPIRE`` of a key that does not exist (under the
locks' prefix, on a slot the server owns): a write command, so held by a write pause and
refused where writes are (Redis 6.2, 7.0, Valkey 8 alike), that changes nothing, leaves
nothing behind and is not replicated. (``EVAL "return 1" 0`` would not do: a replica and
``NOREPLICAS`` let a script run until it writes.)
"""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from . import replicas
from .clients import is_cluster, node_clients
from .wait.manager import existing_manager
from .watchdog import server_id, watchdog

#: Seconds a probe may take to connect, and to get each reply.
PROBE_TIMEOUT = 2.0
#: A renewed hold is overdue when its last confirmed renewal is older than its period (a third
#: of its lease) by more than this share of a period: the renewal round trip and the sweep's
#: wake-up on a loaded machine, not a renewal that failed.
RENEWAL_GRACE = 0.5
#: The channel a replica probe publishes to (PUBLISH is replicated, so WAIT then measures the
#: replicas' acknowledgement without writing a key); nobody subscribes to it.
PROBE_CHANNEL = "rlock:health"
#: The key the write probe expires (under the locks' prefix): nobody writes it, so the PEXPIRE
#: finds nothing. On a cluster node a hash tag puts it on a slot of that node.
PROBE_KEY = "rlock-health-probe"


def servers(client: Any) -> list[Any]:
    """The clients of the servers locks on ``client`` use: every master of a cluster."""
    return node_clients(client) if is_cluster(client) else [client]


def address(client: Any) -> str:
    kw = client.connection_pool.connection_kwargs
    service = getattr(client.connection_pool, "service_name", None)
    where = kw.get("path") or f"{kw.get('host', '?')}:{kw.get('port', '?')}"
    return f"{where}/{kw.get('db', 0)}" if service is None else f"sentinel:{service}/{kw.get('db', 0)}"


def is_sentinel(client: Any) -> bool:
    from redis.sentinel import SentinelConnectionPool

    return isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)


def probe(client: Any) -> redis.Redis:
    """A client of one short-lived connection to ``client``'s server (close it after use)."""
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": PROBE_TIMEOUT,
              "socket_connect_timeout": PROBE_TIMEOUT, "retry": Retry(NoBackoff(), 0),
              "client_name": "rlock-health"}
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=1, **kwargs))


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def write_refused(c: redis.Redis, info: dict[str, Any], prefix: str = "") -> str | None:
    """None if the server takes a write now; else why not (the exception: a timeout where
    writes are held, ``READONLY``, ``NOREPLICAS``...). See the module: a ``PEXPIRE`` that
    changes nothing, on a slot of this server."""
    key = f"{prefix}{PROBE_KEY}"
    try:
        if info.get("cluster_enabled") in (1, "1"):
            key = _on_own_slot(c, key)
        c.execute_command("PEXPIRE", key, 1)
    except redis.RedisError as exc:
        return error_text(exc)
    return None


def _on_own_slot(c: redis.Redis, key: str) -> str:
    """``key`` with a hash tag whose slot this cluster node serves (else MOVED, which says
    nothing about writes)."""
    nodes = c.execute_command("CLUSTER", "NODES")
    text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
    own: list[tuple[int, int]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 8 and "myself" in fields[2].split(","):
            for r in fields[8:]:
                if not r.startswith("["):  # "[slot->-node]": a slot being migrated
                    lo, _, hi = r.partition("-")
                    own.append((int(lo), int(hi or lo)))
    for i in range(100_000):  # a node owning n of 16384 slots: about 16384 / n tries
        tagged = f"{key}:{{{i}}}"
        if any(lo <= key_slot(tagged.encode()) <= hi for lo, hi in own):
            return tagged
    return key  # no slot here: the PEXPIRE's MOVED is reported


# -- the process ------------------------------------------------------------------------------
def _holds(on: set[Any] | None) -> list[Any]:
    return [h for h in watchdog().holds() if on is None or h.server in on]


def watchdog_status(on: set[Any] | None = None) -> dict[str, Any]:
    """The renewal thread, and how old the oldest unconfirmed renewal is (of the holds on the
    servers ``on``, by ``server_id``; None: every hold of the process)."""
    wd = watchdog()
    now = time.monotonic()
    renewed = [h for h in _holds(on) if h.renew]
    worst = 0.0
    overdue = 0
    limit = None
    for h in renewed:
        # Confirmed: the send time of the last round trip that set its lease (the acquire or
        # a renewal), counted back from the validity it gave; a grant's own lease is short,
        # so never before the hold began.
        age = now - max(h.valid_until - h.lease_ms / 1000.0, h.since)
        allowed = h.period * (1 + RENEWAL_GRACE)
        if age > allowed:
            overdue += 1
        if age >= worst:
            worst, limit = age, allowed
    alive = wd.thread_alive()
    return {"ok": alive is not False and overdue == 0, "thread_alive": alive,
            "renewed_holds": len(renewed), "overdue": overdue,
            "oldest_renewal_s": round(worst, 3), "limit_s": None if limit is None else round(limit, 3),
            "late_renewals": wd.late.total}


def holds_status(on: set[Any] | None = None) -> dict[str, Any]:
    """Holds of this process (on the servers ``on``), and those in doubt: ``is_lost()`` is
    true for them. ``lost``: the process's lost holds remembered for ``is_lost()``."""
    wd = watchdog()
    now = time.monotonic()
    holds = _holds(on)
    doubt = sum(1 for h in holds if h.lost or (h.renew and now > h.valid_until))
    return {"ok": doubt == 0, "held": len(holds), "in_doubt": doubt, "lost": wd.lost_count()}


def pubsub_status(client: Any) -> dict[str, Any]:
    """The process's subscription to ``client``'s server (made when a first waiter waits)."""
    mgr = existing_manager(client)
    if mgr is None:
        return {"server": address(client), "ok": True, "started": False, "connected": None,
                "reconnects": 0}
    up = bool(mgr.subscription.connected)
    return {"server": address(client), "ok": up, "started": True, "connected": up,
            "reconnects": mgr.reconnects}


# -- a server ---------------------------------------------------------------------------------
def server_status(client: Any, sync_replicas: int | str | None = "auto",
                  sync_timeout: float = 1.0, prefix: str = "") -> dict[str, Any]:
    """Reachable (PING), its version and role; whether it takes a write now (``writes``: see
    the module); where replica sync is on and the master has replicas, whether they
    acknowledge a write within ``sync_timeout``."""
    out: dict[str, Any] = {"server": address(client), "ok": False, "reachable": False}
    c = probe(client)
    try:
        t0 = time.monotonic()
        c.ping()
        out["latency_ms"] = round((time.monotonic() - t0) * 1000, 3)
        out["reachable"] = True
        info = c.info()
        out["version"] = str(info.get("redis_version", "?"))
        out["role"] = str(info.get("role", "?"))
        refused = write_refused(c, info, prefix)
        out["writes"] = {"ok": True} if refused is None else {"ok": False, "error": refused}
        if refused is not None:
            return out  # held or refused: a replica probe would only wait as well
        out["replicas"] = _replicas(c, info, sync_replicas, sync_timeout)
        out["ok"] = out["replicas"]["ok"]
    except redis.RedisError as exc:
        out["error"] = error_text(exc)
    finally:
        c.close()
    return out


def _replicas(c: redis.Redis, info: dict[str, Any], sync_replicas: int | str | None,
              sync_timeout: float) -> dict[str, Any]:
    online = replicas.online(info)
    if sync_replicas in (None, 0) or online == 0 and sync_replicas == "auto":
        return {"ok": True, "sync": False, "online": online}
    need = 1 if sync_replicas == "auto" else int(sync_replicas)  # as an acquire's WAIT
    c.publish(PROBE_CHANNEL, "0")
    try:
        acked = int(c.execute_command("WAIT", need, max(1, int(sync_timeout * 1000))))
    except redis.ResponseError as exc:  # WAIT refused (some managed offerings): sync is off
        return {"ok": True, "sync": False, "online": online, "error": error_text(exc)}
    return {"ok": acked >= need, "sync": True, "online": online, "needed": need,
            "acknowledged": acked, "timeout_s": sync_timeout}


# -- all of it --------------------------------------------------------------------------------
def status(client: Any, *, sync_replicas: int | str | None = "auto",
           sync_timeout: float = 1.0, prefix: str = "") -> dict[str, Any]:
    """The health of locks on ``client`` in this process: ``ok``, the ``problems`` (one
    sentence each, no addresses), and the parts: ``redis`` and ``pubsub`` (one entry per
    server), ``watchdog`` and ``holds`` (the holds on those servers; the thread is the
    process's). ``prefix``: the locks' key prefix (the write probe's key is under it)."""
    nodes = servers(client)
    redis_part = [server_status(n, sync_replicas, sync_timeout, prefix) for n in nodes]
    pubsub = [pubsub_status(n) for n in nodes]
    on = {server_id(n) for n in nodes}
    wd = watchdog_status(on)
    holds = holds_status(on)
    problems = []
    for s in redis_part:
        if not s["reachable"]:
            kind = str(s.get("error", "?")).split(":", 1)[0]  # the type: no address
            problems.append(f"Redis is unreachable ({kind})")
        elif "writes" in s and not s["writes"]["ok"]:
            kind = str(s["writes"].get("error", "?")).split(":", 1)[0]
            problems.append(f"Redis holds or refuses writes ({kind}): every lock call waits "
                            f"or fails until it takes them again")
        elif "replicas" in s and not s["replicas"]["ok"]:
            r = s["replicas"]
            problems.append(f"{r['acknowledged']} of {r['needed']} replica(s) needed "
                            f"acknowledged a write within {r['timeout_s']:g} s (SYNC_TIMEOUT): "
                            f"acquires fail with LockNotSyncedError")
        elif not s["ok"]:
            kind = str(s.get("error", "?")).split(":", 1)[0]
            problems.append(f"Redis answered PING but not the probe that followed ({kind})")
    if any(not p["ok"] for p in pubsub):
        problems.append("the pub/sub connection is down: waiters wake on the holder's TTL only "
                        "until it reconnects")
    if wd["thread_alive"] is False:
        problems.append("the watchdog thread has died: watchdog-mode locks are not renewed")
    if wd["overdue"]:
        problems.append(f"{wd['overdue']} watchdog renewal(s) overdue (the oldest confirmed "
                        f"{wd['oldest_renewal_s']:g} s ago, limit {wd['limit_s']:g} s)")
    if holds["in_doubt"]:
        problems.append(f"{holds['in_doubt']} hold(s) in doubt: is_lost() is true, their lease "
                        f"may have run out unrenewed")
    return {"ok": not problems, "problems": problems, "redis": redis_part, "pubsub": pubsub,
            "watchdog": wd, "holds": holds}
