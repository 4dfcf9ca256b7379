"""Replica sync: how many replicas a master has, so an acquire can WAIT for them.

Redis replication is asynchronous: a master that dies after granting a lock and before any
replica has it hands a lockless replica to the failover, and a second client gets the lock.
Like Redisson (``checkLockSyncedSlaves``), an acquire on a master with replicas is sent with
``WAIT <replicas> <timeout>`` in the same round trip, and undone if too few acknowledge.

The replica count comes from ``INFO replication`` (replicas in state ``online``), probed together
with ``WAIT 0 0`` the first time a process uses a server and again at most every ``REFRESH``
seconds, inline (one extra round trip per server per ``REFRESH``). A server that answers WAIT
with "unknown command" (some managed offerings) turns the check off, with one INFO log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from redis.exceptions import RedisError, ResponseError

logger = logging.getLogger("django_rlock")

#: Seconds a probed replica count is trusted.
REFRESH = 10.0

#: server id -> (monotonic time of the probe, connected replicas; None: WAIT unsupported)
_counts: dict[Any, tuple[float, int | None]] = {}


def _parse(server: Any, info: Any, waited: Any) -> int | None:
    if isinstance(waited, ResponseError):
        if "unknown command" in str(waited).lower():
            logger.info("django-rlock: the server %s does not support WAIT; locks on it are not "
                        "synced to replicas", server)
            _counts[server] = (float("inf"), None)
            return None
        raise waited
    if isinstance(info, Exception):
        raise info
    _counts[server] = (time.monotonic(), n := online(info))
    return n


def online(info: Any) -> int:
    """Replicas that can acknowledge: ``state=online`` (one still loading its first full sync
    is connected but acknowledges nothing, and would fail every acquire until it is done)."""
    if not isinstance(info, dict):
        return 0
    states = [v.get("state") for k, v in info.items()
              if k.startswith("slave") and k[5:].isdigit() and isinstance(v, dict)]
    if not states:
        return int(info.get("connected_slaves", 0))
    return sum(1 for state in states if state == "online")


def cached(server: Any) -> tuple[bool, int | None]:
    """(fresh, count): whether a probe is needed, and the last known count."""
    entry = _counts.get(server)
    if entry is None:
        return False, None
    return time.monotonic() - entry[0] < REFRESH, entry[1]


def connected(client: Any, server: Any) -> int | None:
    """Replicas connected to ``client``'s master (probed when stale); None if WAIT is off."""
    fresh, n = cached(server)
    if fresh:
        return n
    pipe = client.pipeline(transaction=False)
    pipe.info("replication")
    pipe.execute_command("WAIT", 0, 0)
    return _parse(server, *pipe.execute(raise_on_error=False))


async def aconnected(client: Any, server: Any) -> int | None:
    """``connected`` on a ``redis.asyncio`` client."""
    fresh, n = cached(server)
    if fresh:
        return n
    pipe = client.pipeline(transaction=False)
    pipe.info("replication")
    pipe.execute_command("WAIT", 0, 0)
    return _parse(server, *await pipe.execute(raise_on_error=False))


def recounted(client: Any, server: Any, acked: Any, target_for: Any) -> bool:
    """Too few acknowledgements (the count is forgotten by then): true if the master, probed
    again, has no more replicas now than acknowledged (invariant 46). A Sentinel service's
    count names the service, not the master: a new master may have fewer replicas, or none.
    ``target_for``: the lock's ``_sync_target``."""
    try:
        target = target_for(connected(client, server) or 0)
    except RedisError:
        return False  # the shortfall stands
    return target is None or int(acked) >= target[1]


async def arecounted(client: Any, server: Any, acked: Any, target_for: Any) -> bool:
    """``recounted`` on a ``redis.asyncio`` client."""
    try:
        target = target_for(await aconnected(client, server) or 0)
    except RedisError:
        return False
    return target is None or int(acked) >= target[1]


def forget(server: Any) -> None:
    """Probe again next time (the acks fell short: maybe a replica left)."""
    _counts.pop(server, None)
