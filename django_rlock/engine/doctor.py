"""Server settings that break locks, each found on the live server with its fix.

Every lock is a key with a TTL, renewed by one watchdog connection per process and woken
through pub/sub; what a server's settings can do to that:

- ``maxmemory-policy``: ``volatile-*`` evicts exactly the keys with a TTL (every lock),
  ``allkeys-*`` any key; an evicted lock is free while its holder still runs.
- ``timeout`` at or below the watchdog period: the server closes the idle connections renewals
  go out on, between two renewals.
- no ``min-replicas-to-write`` on a Sentinel-managed master: a master cut off from its
  replicas keeps granting locks that the failover then forgets (two holders).
- a cluster below Redis 7: no sharded pub/sub, so a Redisson 3.22+ client on the same locks
  (which listens with SSUBSCRIBE) never hears our releases, nor we its.
- a replica as the lock server (every acquire refused), and a ``noeviction`` server nearly
  full (acquires refused with OOM).
"""

from __future__ import annotations

from typing import Any

import redis

from .clients import is_cluster, is_cluster_node
from .health import address, error_text, is_sentinel, probe, servers

#: Share of ``maxmemory`` in use past which a ``noeviction`` server is reported nearly full.
FULL = 0.9


def findings(client: Any, watchdog_timeout: float = 30.0) -> list[dict[str, str]]:
    """Each ``{"level", "check", "server", "problem", "fix"}``; ``level`` is ``error`` (locks
    can be lost or refused) or ``warning``. A server that cannot be read is a finding too."""
    cluster = is_cluster(client) or is_cluster_node(client)
    out: list[dict[str, str]] = []
    for node in servers(client):
        out.extend(server_findings(node, watchdog_timeout, sentinel=is_sentinel(node),
                                   cluster=cluster))
    return out


def _finding(level: str, check: str, server: str, problem: str, fix: str) -> dict[str, str]:
    return {"level": level, "check": check, "server": server, "problem": problem, "fix": fix}


def _config(c: redis.Redis) -> dict[str, str] | None:
    """The settings we check, or None where CONFIG is refused (renamed on managed servers)."""
    try:
        got: dict[str, str] = {}
        for name in ("maxmemory-policy", "maxmemory", "timeout", "min-replicas-to-write"):
            got.update({str(k): str(v) for k, v in c.config_get(name).items()})
        return got
    except redis.ResponseError:
        return None


def server_findings(client: Any, watchdog_timeout: float, *, sentinel: bool = False,
                    cluster: bool = False) -> list[dict[str, str]]:
    where = address(client)
    c = probe(client)
    try:
        info = c.info()
        config = _config(c)
    except redis.RedisError as exc:
        return [_finding("error", "reachable", where, f"cannot read the server ({error_text(exc)})",
                         "start it, or fix CACHES / RLOCK['REDIS_URL']")]
    finally:
        c.close()
    out = _role_and_version(info, where, cluster)
    if config is None:
        out.append(_finding("warning", "config", where, "CONFIG GET is refused, so "
                            "maxmemory-policy, timeout and min-replicas-to-write were not checked",
                            "check them in the provider's console: maxmemory-policy noeviction, "
                            f"timeout 0 (or above {watchdog_timeout / 3:g} s), "
                            "min-replicas-to-write 1 with Sentinel"))
        return out
    out.extend(_memory(info, config, where))
    period = watchdog_timeout / 3.0
    timeout = int(config.get("timeout", "0") or 0)
    if 0 < timeout <= period:
        out.append(_finding(
            "error", "timeout", where,
            f"timeout is {timeout} s, at or below the watchdog period ({period:g} s, a third of "
            f"WATCHDOG_TIMEOUT): the server closes the connections renewals go out on between "
            f"two renewals, so every renewal pays a reconnect, and one that races the close fails "
            f"(its hold is renewed late, or in doubt until the retry)",
            f"CONFIG SET timeout 0 (and in redis.conf), or a timeout well above {period:g} s"))
    if sentinel and int(config.get("min-replicas-to-write", "0") or 0) == 0:
        out.append(_finding(
            "error", "min-replicas-to-write", where,
            "min-replicas-to-write is 0 on a Sentinel-managed master: cut off from its replicas "
            "(a network split) it keeps granting locks, which the failover to a replica forgets: "
            "two holders of one lock",
            "CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 10 on the master, and "
            "the same in every server's redis.conf (a replica becomes master)"))
    return out


def _role_and_version(info: dict[str, Any], where: str, cluster: bool) -> list[dict[str, str]]:
    out = []
    role = str(info.get("role", "master"))
    if role != "master":
        out.append(_finding(
            "error", "role", where, f"the lock server is a replica (role {role}): every acquire "
            f"is refused with READONLY",
            "point CACHES / RLOCK['REDIS_URL'] at the master (or at Sentinel, which finds it)"))
    version = str(info.get("redis_version", "0"))
    major = int(version.split(".")[0] or 0) if version.split(".")[0].isdigit() else 0
    if cluster and major < 7:
        out.append(_finding(
            "error", "version", where,
            f"Redis {version} on a cluster has no sharded pub/sub (7.0+): our lock channels are "
            f"classic PUBLISH, so a Redisson 3.22+ client on the same locks (SSUBSCRIBE) never "
            f"hears our releases, nor we its, and every release is sent to every node",
            "upgrade the cluster to Redis 7.0+ or Valkey"))
    return out


def _memory(info: dict[str, Any], config: dict[str, str], where: str) -> list[dict[str, str]]:
    policy = config.get("maxmemory-policy", "noeviction")
    maxmemory = int(config.get("maxmemory", "0") or 0)
    if policy != "noeviction":
        which = ("volatile-* evicts exactly the keys with a TTL: every lock"
                 if policy.startswith("volatile") else "allkeys-* evicts any key, locks included")
        when = (f"once maxmemory ({maxmemory} bytes) is reached" if maxmemory
                else "as soon as a maxmemory is set")
        return [_finding(
            "error", "maxmemory-policy", where,
            f"maxmemory-policy is {policy}: {which}, {when}; an evicted lock is free while its "
            f"holder still runs",
            "CONFIG SET maxmemory-policy noeviction (and in redis.conf); for a cache that needs "
            "eviction, give the locks a Redis of their own: RLOCK['REDIS_URL']")]
    used = int(info.get("used_memory", 0) or 0)
    if maxmemory and used >= FULL * maxmemory:
        return [_finding(
            "warning", "memory", where,
            f"{used} of {maxmemory} bytes (maxmemory) in use with noeviction: when full, every "
            f"acquire is refused (OOM)", "raise maxmemory, or free memory")]
    return []
