"""Who holds what: list, read, describe and force-unlock the locks under a prefix, without Django.

Listing reads the index (``naming.index_key``), which the acquire and release scripts keep:
one HSCAN of a hash as small as the number of live locks, whatever else the database holds.
Entries are verified on read: a lock deleted or expired behind the index's back is not
listed, and its entry is pruned (by a script that re-checks, so a lock taken again since the
read is never unlisted). ``scan=True`` is the fallback that walks the whole keyspace with
SCAN: it also finds locks that other Redisson clients (Java, Node) took, which never enter
the index.

Every kind of the family is listed, in Redisson's layout (``naming``):

- hashes: ``lock`` and ``fenced`` (``<client id>:<thread id>`` -> hold count, plus the counter
  ``redisson_lock_token:{key}`` for fenced), ``fair`` (plus the list
  ``redisson_lock_queue:{key}`` and zset ``redisson_lock_timeout:{key}``), ``rw`` (a ``mode``
  field, readers ``<owner>`` and the writer ``<owner>:write``);
- integer strings: ``semaphore``, ``permits`` (plus the zset ``{key}:timeout`` of permits
  taken), ``latch``.

The kind comes from the index entry (its JSON ``kind``; none = ``lock``). Without an entry
(SCAN) it is read off the layout, but only where the layout proves it: a hash of
``<client uuid>:<thread id>`` -> count fields, Redisson's shape (with a ``mode`` field, a fair
queue or a fencing token for those kinds), or an integer string beside the zset of the
permits taken (``permits``). A plain integer string with no index entry of a string kind is
never listed, read or cleared: it may be a cache value (django-redis stores integers raw; with
an empty or shared prefix they sit under the glob), and a Redisson semaphore or latch, which
writes no index entry, looks the same. Anything else (a cache value, somebody's own hash, the
kinds' auxiliary keys) is never listed.

Costs are bounded: two pipelined round trips per ``BATCH`` keys (shapes, then contents, with
the waiters' records: ``waiters``), and a third for the holders' and waiters' process records
(``records.join``: pid, label, host), never a round trip per lock.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from . import kinds, records, waiters
from .clients import (
    cluster_of,
    is_cluster,
    is_cluster_node,
    node_client,
    node_clients,
)
from .flavours import check_client
from .kinds import SEMAPHORE_OR_LATCH, Kind
from .lockinfo import (
    NEVER_MS,
    Holder,
    LockInfo,
    count_of,
    decoded,
    entry_of,
    holders_of,
    kind_named,
    number,
    permits_read,
    seconds_left,
    text,
)
from .lua import load
from .naming import (
    FAIR_QUEUE_PREFIX,
    FAIR_TIMEOUT_PREFIX,
    HANDOFF_QUEUE_PREFIX,
    HANDOFF_WAITERS_PREFIX,
    INDEX_PREFIX,
    PROCESS_PREFIX,
    TASKRUN_PREFIX,
    TOKEN_PREFIX,
    WAITING_PREFIX,
    glob_escape,
    index_key,
    prefix_name,
    suffix_name,
)
from .scripts import PRUNE_INDEX_SCRIPT, call
from .watchdog import server_id

#: A string key's permits taken (``lua/pes_peek.lua``): expired ones count as free, by the
#: semaphore's own rule, so a crashed holder's permit is not listed once its lease is over.
PERMITS_READ_SCRIPT = load("pes_peek")


def __getattr__(name: str) -> Any:
    # ``KINDS``: every kind's name, from the registry (read when asked, not at import: the
    # kind modules import the registry).
    if name == "KINDS":
        return kinds.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: COUNT hint of SCAN / HSCAN: entries the server visits per call.
SCAN_COUNT = 1000
#: Keys checked per pipeline round trip.
BATCH = 500
#: A hash with more fields than this is not read (a read-write lock has one per reader).
MAX_FIELDS = 1024
#: A kind's string is an integer: longer strings are not read.
MAX_STRLEN = 24
#: Fair queue entries and permit leases that ``show`` reads.
MAX_SHOWN = 1000
# Keys the kinds keep next to their main key: never listed as locks of their own.
_AUX_PREFIXES = tuple(p + ":" for p in (FAIR_QUEUE_PREFIX, FAIR_TIMEOUT_PREFIX, TOKEN_PREFIX,
                                        "redisson_unlock_latch", INDEX_PREFIX,
                                        PROCESS_PREFIX, TASKRUN_PREFIX)) + tuple(
    p + sep for p in (HANDOFF_QUEUE_PREFIX, HANDOFF_WAITERS_PREFIX, WAITING_PREFIX)
    for sep in ":!")
# A read hold's timeout string, ``{key}:<owner>:rwlock_timeout:<k>``. (A permit zset
# ``{key}:timeout`` is neither hash nor string, so never a candidate.)
_AUX_NAME = re.compile(r".+:\d+:rwlock_timeout:\d+", re.DOTALL)
# A rate limiter's counter ``{key}:value`` (and Redisson's PER_CLIENT ``{key}:value:<id>``): an
# integer string, which is no semaphore.
_RATE_VALUE = re.compile(r".*\{.*\}.*:value(:[^:]+)?", re.DOTALL)


# Redisson names an owner ``<client uuid>:<thread id>`` (java.util.UUID, lower case hex); so
# does this package (``identity``). A hash with no index entry is a lock only with such fields.
_CLIENT_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?![0-9a-f])",
                          re.IGNORECASE)


def is_auxiliary(key: str) -> bool:
    """A key one of the kinds keeps beside its main key (queue, timeouts, token, index)."""
    return (key.startswith(_AUX_PREFIXES) or _AUX_NAME.fullmatch(key) is not None
            or _RATE_VALUE.fullmatch(key) is not None)


def _batches(items: Sequence[str], size: int = BATCH) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class _Keys:
    """The auxiliary names of one main key (Redisson's brace rule, from ``naming``)."""

    __slots__ = ("queue", "fair_timeouts", "token", "permit_timeouts")

    def __init__(self, key: str) -> None:
        self.queue = prefix_name(FAIR_QUEUE_PREFIX, key)
        self.fair_timeouts = prefix_name(FAIR_TIMEOUT_PREFIX, key)
        self.token = prefix_name(TOKEN_PREFIX, key)
        self.permit_timeouts = suffix_name(key, "timeout")


class Locks:
    """The locks (of every kind) under one prefix on one redis-py client.

    A sync ``RedisCluster`` client is served by one ``Locks`` per master (``ClusterLocks``).
    """

    def __new__(cls, client: Any, prefix: str = "") -> Locks:
        if cls is Locks and is_cluster(client):
            return ClusterLocks(client, prefix)
        return super().__new__(cls)

    def __init__(self, client: Any, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix
        #: On a cluster node every lock has an index of its own, in its slot (``index_key``).
        self._per_key = is_cluster_node(client)
        self.index = index_key(prefix)
        #: Where the process records are read (a cluster node's: its cluster, any slot).
        self._records = cluster_of(client) or client

    def _index_of(self, key: str) -> str:
        return index_key(self.prefix, key) if self._per_key else self.index

    def _indexed(self, pattern: str) -> Iterable[Any]:
        """The lock keys (matching ``pattern``) that this node's per-lock indexes name."""
        head = f"{INDEX_PREFIX}:{self.prefix}"
        for sep in (":{", "!"):  # a key's own index is "<head>:{key}", or "<head>!key" if braced
            tail = "}" if sep == ":{" else ""
            idx_keys = [k for k in map(text, self.client.scan_iter(
                match=glob_escape(head + sep) + pattern + tail, count=SCAN_COUNT, _type="hash"))
                if k is not None]
            for chunk in _batches(idx_keys):
                pipe = self.client.pipeline(transaction=False)
                for k in chunk:
                    pipe.hkeys(k)
                for idx, fields in zip(chunk, pipe.execute(), strict=True):
                    for f in map(text, fields):
                        if f is not None and index_key(self.prefix, f) == idx:
                            yield f

    def names(self, match: str = "*", *, scan: bool = False) -> list[str]:
        """Sorted names of the live locks whose name matches the Redis glob ``match``.

        From the index (HSCAN of one small hash); ``scan=True`` walks the keyspace with SCAN
        instead, which also finds locks other Redisson clients took.
        """
        pattern = glob_escape(self.prefix) + match
        if scan:
            # Untyped: the kinds are hashes and strings; shapes are checked below.
            found = self.client.scan_iter(match=pattern, count=SCAN_COUNT)
        elif self._per_key:
            found = self._indexed(pattern)
        else:
            # Fields and values (HSCAN NOVALUES needs Redis 7.4); values are ~150 bytes.
            found = (f for f, _ in self.client.hscan_iter(self.index, match=pattern,
                                                          count=SCAN_COUNT))
        keys = {k for k in map(text, found) if k is not None and k != self.prefix}
        if scan:  # anything may be under the prefix: only lock-shaped keys count
            keys = {k for k in keys if not k.startswith(INDEX_PREFIX + ":") and not is_auxiliary(k)}
            return [info.name for chunk in _batches(sorted(keys)) for info in self.read_keys(chunk)]
        live: list[str] = []
        gone: list[str] = []
        for chunk in _batches(sorted(keys)):
            for key, shape in zip(chunk, self._shapes(chunk), strict=True):
                if shape is None:
                    gone.append(key)
                elif shape:
                    live.append(key)
        self._prune(gone)
        return [k[len(self.prefix):] for k in live]

    def _shapes(self, keys: Sequence[str]) -> list[str | None]:
        """Per key: "hash" or "string" if it may be one of the kinds (small enough to read),
        "" if it is something else, None if it does not exist. One round trip."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hlen(key)
            pipe.strlen(key)
        replies = pipe.execute(raise_on_error=False)  # WRONGTYPE comes back as an exception
        out: list[str | None] = []
        for i in range(len(keys)):
            h, s = replies[2 * i], replies[2 * i + 1]
            if isinstance(h, int) and h > 0:
                out.append("hash" if h <= MAX_FIELDS else "")
            elif isinstance(s, int) and s > 0:
                out.append("string" if s <= MAX_STRLEN else "")
            elif h == 0 and s == 0:
                out.append(None)
            else:
                out.append("")
        return out

    def _prune(self, keys: list[str]) -> None:
        if self._per_key:  # one slot per script: each key with its own index
            for key in keys:
                call(self.client, PRUNE_INDEX_SCRIPT, (self._index_of(key), key), ())
            return
        for chunk in _batches(keys):
            call(self.client, PRUNE_INDEX_SCRIPT, (self.index, *chunk), ())

    def read(self, names: Iterable[str]) -> list[LockInfo]:
        """The named locks still live, in the given order; gone or non-lock keys left out.

        Three round trips per ``BATCH`` names: shapes first (a big foreign key is never read
        whole), then contents, PTTL, index entry and the kind's auxiliary keys, with TIME,
        then the process records of the holders and waiters found (``records.join``).
        """
        out: list[LockInfo] = []
        for chunk in _batches([self.prefix + n for n in names if n]):
            out.extend(self.read_keys(chunk))
        return out

    def show(self, name: str) -> LockInfo | None:
        """One lock with everything: a fair lock's queue, each permit's remaining lease."""
        found = self.read_keys([self.prefix + name], detail=True) if name else []
        return found[0] if found else None

    def read_keys(self, keys: Sequence[str], detail: bool = False) -> list[LockInfo]:
        shapes = self._shapes(keys)
        wanted = [(k, s) for k, s in zip(keys, shapes, strict=True) if s]
        if not wanted:
            return []
        # Permit ids are raw bytes, which a decode_responses client cannot decode.
        raw_ok = not self.client.connection_pool.connection_kwargs.get("decode_responses")
        pipe = self.client.pipeline(transaction=False)
        strings = any(shape == "string" for _, shape in wanted)
        if strings:  # so the EVALSHAs below find it, even on a fresh server
            pipe.script_load(PERMITS_READ_SCRIPT.source)
        pipe.time()
        sizes: list[int] = []
        for key, shape in wanted:
            aux = _Keys(key)
            if shape == "hash":
                pipe.hgetall(key)
                pipe.pttl(key)
                pipe.hget(self._index_of(key), key)
                pipe.llen(aux.queue)
                pipe.zcard(aux.fair_timeouts)
                pipe.get(aux.token)
                if detail:
                    pipe.lrange(aux.queue, 0, MAX_SHOWN - 1)
                    pipe.zrange(aux.fair_timeouts, 0, MAX_SHOWN - 1, withscores=True)
            else:
                pipe.get(key)
                pipe.pttl(key)
                pipe.hget(self._index_of(key), key)
                pipe.evalsha(PERMITS_READ_SCRIPT.sha, 1, aux.permit_timeouts,
                             MAX_SHOWN if detail and raw_ok else 0)
            sizes.append((8 if detail else 6) if shape == "hash" else 4)
            for read in waiters.read_commands(key, shape == "hash"):  # who waits (invariant 41)
                read(pipe)
            sizes.append(2 if shape == "hash" else 1)
        replies = pipe.execute(raise_on_error=False)[1 if strings else 0:]
        now = int(replies[0][0]) + int(replies[0][1]) / 1e6
        out = []
        i = 1
        for (key, shape), size, more in zip(wanted, sizes[::2], sizes[1::2], strict=True):
            got = replies[i:i + size]
            waiting = waiters.from_replies(replies[i + size:i + size + more], now * 1000.0)
            i += size + more
            pttl = got[1]
            if not isinstance(pttl, int) or pttl == -2:
                continue
            ttl = float("inf") if pttl == -1 else max(pttl, 0) / 1000.0
            entry = entry_of(got[2], now)
            make = self._hash if shape == "hash" else self._string
            info = make(key, ttl, entry, got, now * 1000.0, detail)
            if info is not None:
                out.append(dataclasses.replace(info, waiters=waiting) if waiting else info)
        return records.join(self._records, out)  # who they are: their process records

    def _hash(self, key: str, ttl: float, entry: dict[str, Any] | None, got: list[Any],
              now_ms: float, detail: bool) -> LockInfo | None:
        fields = decoded(got[0])
        if fields is None:
            return None
        probe: dict[str, Any] = {"fields": fields, "queue_length": count_of(got[3]),
                                 "fair_size": count_of(got[4]), "token": number(got[5]),
                                 "now_ms": now_ms}
        if detail:
            scores = {text(m): sc for m, sc in got[7]} if isinstance(got[7], list) else {}
            queue = got[6] if isinstance(got[6], list) else []
            probe["queue"] = [{"owner": o, "timeout": seconds_left(scores.get(o), now_ms)}
                              for o in map(text, queue) if o is not None]
        kind = self._kind_of(entry, "lock", "hash", probe)
        if kind is None or (kind.modes and fields.get("mode") not in ("read", "write")):
            return None
        if kind.read is not None:  # settings, not holders (a rate limiter)
            found = kind.read(self.client, key)
            if found is None:
                return None
            return LockInfo(key[len(self.prefix):], key, ttl, (), fields, kind.name, found)
        holders = holders_of(fields, entry, kind.modes)
        if holders is None:
            return None
        if kinds.get(kind_named(entry, "lock")) is not kind and not (
                holders and all(_CLIENT_UUID.match(h.client_id) for h in holders)):
            # No index entry says so: only Redisson's own field shape (<client uuid>:<thread>)
            # proves a lock; somebody's counters ("page:12" -> 3) have the same layout.
            return None
        probe["holders"] = holders
        probe["entry"] = entry
        details = kind.details(probe, detail) if kind.details is not None else {}
        return LockInfo(key[len(self.prefix):], key, ttl, holders if kind.owned else (), fields,
                        kind.name, details)

    @staticmethod
    def _kind_of(entry: dict[str, Any] | None, default: str | None, layout: str,
                 probe: dict[str, Any]) -> Kind | None:
        """The kind its index entry names; without one (SCAN), or one of another layout, the
        kind its layout says (the registry's ``recognise``)."""
        kind = kinds.get(kind_named(entry, default))
        if kind is None or kind.layout != layout:
            kind = kinds.recognise(layout, probe)
        return kind

    def _string(self, key: str, ttl: float, entry: dict[str, Any] | None, got: list[Any],
                now_ms: float, detail: bool) -> LockInfo | None:
        value = text(got[0])
        num = number(value)
        if value is None or num is None:
            return None
        expired, taken, leases = permits_read(got[3], now_ms)
        probe: dict[str, Any] = {"value": value, "number": num, "taken": taken,
                                 "expired": expired, "now_ms": now_ms}
        if detail:
            probe["leases"] = leases
        kind = kinds.get(kind_named(entry, None))
        if kind is None or kind.layout != "string":
            # No index entry of a string kind: an integer string proves nothing (a cache
            # stores its integers raw; a Redisson semaphore and latch look the same), so only
            # a kind a companion key proves is listed (permits: its ``{key}:timeout`` zset).
            kind = kinds.recognise("string", probe)
            if kind is not None and kind.detect is None:  # the layout's fallback: a guess
                return None
        if kind is None:
            return None
        details = kind.details(probe, detail) if kind.details is not None else {}
        return LockInfo(key[len(self.prefix):], key, ttl, (), {}, kind.name, details, value)

    # -- force-unlock ------------------------------------------------------------------------
    def clear(self, names: Iterable[str]) -> list[str]:
        """Force-unlock the named locks, each by its kind (delete and publish, so waiters
        wake). Only keys that are one of the kinds are touched. Returns the names unlocked."""
        return [info.name for info in self.read(names) if self.force(info)]

    def force(self, info: LockInfo) -> bool:
        """Force-unlock one lock as read: its kind's own ``force_unlock()`` (the registry's
        ``open``), so the engine, ``locks clear`` and the admin remove the same keys and wake
        the same waiters. True if it was deleted; this process's holds of it are lost and
        the ``force_unlocked`` event is sent."""
        kind = kinds.get(info.kind)
        if kind is None:
            return False
        return bool(kind.open(self.client, info.name, self.prefix).force_unlock())

class ClusterLocks(Locks):
    """``Locks`` on a Redis Cluster: each master lists, reads and clears its own slots' locks.

    Costs stay per node: SCAN for the per-lock indexes on each master, then the same pipelined
    reads as on one server, one pipeline per master and batch.
    """

    def __init__(self, client: Any, prefix: str = "") -> None:
        check_client(client, f"the locks under {prefix!r}", cluster_ok=True)
        self.cluster = client
        self.prefix = prefix

    def _nodes(self) -> list[Locks]:
        return [Locks(c, self.prefix) for c in node_clients(self.cluster)]

    def _node(self, key: str) -> Locks:
        return Locks(node_client(self.cluster, key), self.prefix)

    def names(self, match: str = "*", *, scan: bool = False) -> list[str]:
        return sorted(n for node in self._nodes() for n in node.names(match, scan=scan))

    def read(self, names: Iterable[str]) -> list[LockInfo]:
        wanted = [n for n in names if n]
        by_node: dict[Any, list[str]] = {}
        nodes: dict[Any, Locks] = {}
        for n in wanted:
            node = self._node(self.prefix + n)
            sid = server_id(node.client)
            nodes.setdefault(sid, node)
            by_node.setdefault(sid, []).append(n)
        found = {info.name: info for sid, ns in by_node.items() for info in nodes[sid].read(ns)}
        return [found[n] for n in wanted if n in found]

    def show(self, name: str) -> LockInfo | None:
        return self._node(self.prefix + name).show(name) if name else None

    def force(self, info: LockInfo) -> bool:
        return self._node(info.key).force(info)

    def read_keys(self, keys: Sequence[str], detail: bool = False) -> list[LockInfo]:
        return [info for k in keys for info in self._node(k).read_keys([k], detail)]


def describe_holders(client: Any, key: str, prefix: str = "") -> str:
    """Who holds ``key`` now, for a log line ("nobody" if free); never raises."""
    try:
        info = Locks(client, prefix).read_keys([key])
    except Exception:
        return "?"
    if not info:
        return "nobody"
    if not info[0].holders:
        return f"{info[0].kind}: {info[0].summary()}"
    return ", ".join(h.describe() for h in info[0].holders)


__all__ = ["BATCH", "NEVER_MS", "SEMAPHORE_OR_LATCH", "ClusterLocks", "Holder", "LockInfo",
           "Locks", "describe_holders", "glob_escape", "is_auxiliary"]
