"""Process records: what a listing shows about a holder's process, written once per process and
server instead of in every index entry (invariant 43).

An index entry of format 3 (``identity.thread_info``) names its holder's thread, not its
process: the pid, process label and host are in one string per process,
``rlock-process:{<process uuid>}`` = ``<pid>␞<label>␞<host>`` (``naming.process_key``), which
listing reads by the uuid in the holder's hash field (or the waiter's token) and joins
(``join``). That keeps a held lock under 300 bytes of Redis memory (docs/benchmarks.md).

Who writes it, and when:

- **the acquiring thread**, with a plain ``SET ... PX`` sent just before an attempt of a lock
  kind whose entries name the record (``RLock._attempt`` / ``AsyncRLock._attempt``), when
  this process has not written it on that server yet, or its time left may not cover the
  attempt's lease plus a third of ``TTL``: once per process and server, then at most every
  ``TTL / 6`` (an acquire that finds it due pays a round trip); never on a cluster's lock
  slot (a script cannot write another slot), through the cluster client instead;
- **the watchdog**, after a renewal on a server, when it was last written ``REFRESH`` (or a
  third of ``TTL``, if shorter) ago (``refresh``, on the watchdog's pool thread): a process
  that keeps holding keeps its record whatever its acquires do, and one lost with the
  server's data (a restart with no persistence, a failover to a replica that never had it)
  is written again within ``REFRESH`` plus one renewal period.

Garbage collection is the TTL: each write lives ``max(TTL, lease + TTL / 2)``, so a record
outlives every lease its process set, and the record of a process that died (a recycled
Celery prefork child, a SIGKILL) or froze is gone ``TTL`` (5 minutes) after its last write,
or its longest lease: records never pile up. A listing that finds no record (the server lost
it, and the process has not written it again yet) shows the holder's thread, its OS thread
id and since when, with host, pid and process ``None``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from . import identity, process
from .clients import cluster_of
from .lockinfo import SEP3, LockInfo, text
from .naming import LEASE_MARK, process_key

logger = logging.getLogger("django_rlock")

#: Seconds a record lives past its last write (read at call time).
TTL = 300.0
#: Seconds between the watchdog's rewrites of a record while the process renews on a server.
REFRESH = 30.0
#: Seconds before a write that failed (a cluster node down) is tried again.
RETRY = 10.0

#: server id -> [monotonic send time of the last write, until when it lives (monotonic),
#: not before (monotonic: after a failure)]; per process: a forked child has a new uuid.
_written: Callable[[], dict[Any, list[float]]] = process.local(dict)


def due(server: Any, lease_ms: int) -> bool:
    """Must the acquiring thread write the record before an attempt with a lease of
    ``lease_ms`` on ``server``? (The hot path: one dict lookup and a clock read.)"""
    st = _written().get(server)
    if st is None:
        return True
    now = time.monotonic()
    return now + lease_ms / 1000.0 + TTL / 3 > st[1] and now >= st[2]


def _ttl(server: Any, lease_ms: int) -> float:
    """How long a write makes the record live: past this lease, and never less than what an
    earlier write promised (the watchdog's refresh must not cut short a record that a
    longer lease of this process needs)."""
    st = _written().get(server)
    left = st[1] - time.monotonic() if st is not None else 0.0
    return max(TTL, lease_ms / 1000.0 + TTL / 2, left)


def _sent(server: Any, sent: float, ttl: float) -> None:
    _written()[server] = [sent, sent + ttl, 0.0]


def _failed(server: Any, exc: Exception) -> None:
    st = _written().setdefault(server, [0.0, 0.0, 0.0])
    st[2] = time.monotonic() + RETRY
    logger.debug("django-rlock: the process record could not be written (%s: %s)",
                 type(exc).__name__, exc)


def write(client: Any, server: Any, lease_ms: int = 0) -> None:
    """Write this process's record on ``client``'s server (a cluster node's: through its
    cluster client, in the record's own slot). Never raises: a lock's own round trip reports
    a dead server; a listing shows a holder without its record as a process unknown."""
    ttl = _ttl(server, lease_ms)
    target = cluster_of(client) or client
    sent = time.monotonic()
    try:
        target.set(process_key(identity.process_id()), identity.process_record(),
                   px=int(ttl * 1000))
    except Exception as exc:
        _failed(server, exc)
        return
    _sent(server, sent, ttl)


async def awrite(client: Any, server: Any, lease_ms: int = 0) -> None:
    """``write`` on a ``redis.asyncio`` client (on a cluster, the sync cluster client's round
    trip on a worker thread: once per process, then every ``TTL / 6`` at most)."""
    cluster = cluster_of(client)
    if cluster is not None:  # on a thread: the cluster client's retries must not block the loop
        await asyncio.to_thread(write, cluster, server, lease_ms)
        return
    ttl = _ttl(server, lease_ms)
    sent = time.monotonic()
    try:
        await client.set(process_key(identity.process_id()), identity.process_record(),
                         px=int(ttl * 1000))
    except Exception as exc:
        _failed(server, exc)
        return
    _sent(server, sent, ttl)


def refresh(client: Any, server: Any) -> None:
    """(The watchdog, after renewing on ``server``.) Rewrite the record if it was last written
    ``REFRESH`` ago: it lives as long as the process renews there, and comes back within
    ``REFRESH`` after the server lost it."""
    st = _written().get(server)
    now = time.monotonic()
    if st is not None and (now - st[0] < min(REFRESH, TTL / 3) or now < st[2]):
        return
    write(client, server)


def forget() -> None:
    """Write every record again before the next attempt (a new process label; tests; a server
    known to be new)."""
    _written().clear()


identity.on_label(forget)


# -- reading (listing) -------------------------------------------------------------------------
def parse(raw: Any) -> dict[str, Any] | None:
    """A record's value as ``{"pid", "process", "host"}``; None if missing or unreadable."""
    t = text(raw)
    if not t:
        return None
    parts = t.split(SEP3)
    if len(parts) != 3 or not parts[0].isascii() or not parts[0].isdigit():
        return None
    return {"pid": int(parts[0]), "process": parts[1], "host": parts[2]}


def _uuid(client_id: str) -> str:
    return client_id.replace(LEASE_MARK, "", 1)


def _wanted(h: Any) -> bool:
    # Entries of format 3 name a thread and no pid; a holder without an entry names neither.
    return h.pid is None and h.thread is not None


def join(client: Any, infos: Sequence[LockInfo]) -> list[LockInfo]:
    """``infos`` with each holder and waiter of a format 3 entry completed from its process
    record (pid, process, host): one pipelined round trip for all their processes, none if
    no entry needs it. A record that is missing leaves them ``None``."""
    uuids = sorted({_uuid(h.client_id) for info in infos
                    for h in (*info.holders, *info.waiters) if _wanted(h)})
    if not uuids:
        return list(infos)
    pipe = client.pipeline(transaction=False)
    for u in uuids:
        pipe.get(process_key(u))
    try:
        replies = pipe.execute(raise_on_error=False)
    except Exception:  # the records' node down (a cluster): listed without them
        return list(infos)
    found = {u: r for u, r in zip(uuids, map(parse, replies), strict=True) if r is not None}
    if not found:
        return list(infos)

    def done(h: Any) -> Any:
        r = found.get(_uuid(h.client_id)) if _wanted(h) else None
        return h if r is None else replace(h, pid=r["pid"], process=r["process"], host=r["host"])

    return [replace(info, holders=tuple(map(done, info.holders)),
                    waiters=tuple(map(done, info.waiters))) for info in infos]


__all__ = ["REFRESH", "RETRY", "TTL", "awrite", "due", "forget", "join", "parse", "refresh",
           "write"]
