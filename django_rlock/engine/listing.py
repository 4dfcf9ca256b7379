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
(SCAN) it is read off the layout; a plain integer string is a semaphore or a latch, which
Redisson stores alike, so it is shown as ``semaphore|latch``. Anything else (a cache value,
somebody's own hash, the kinds' auxiliary keys) is never listed.

Costs are bounded: two pipelined round trips per ``BATCH`` keys (shapes, then contents),
never a round trip per lock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import events
from .clients import check_client, is_cluster, is_cluster_node, node_client, node_clients
from .naming import (
    FAIR_QUEUE_PREFIX,
    FAIR_TIMEOUT_PREFIX,
    HANDOFF_QUEUE_PREFIX,
    HANDOFF_WAITERS_PREFIX,
    INDEX_PREFIX,
    READ_UNLOCK_MESSAGE,
    RWLOCK_CHANNEL_PREFIX,
    SEMAPHORE_CHANNEL_PREFIX,
    TOKEN_PREFIX,
    UNLOCK_MESSAGE,
    index_key,
    latch_channel,
    lock_channel,
    prefix_name,
    suffix_name,
)
from .scripts import PRUNE_INDEX_SCRIPT, Script, call
from .watchdog import server_id, watchdog

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
#: Redisson's score of a permit that never expires (Long.MAX_VALUE / 10000).
NEVER_MS = 922337203685477

KINDS = ("lock", "fair", "rw", "semaphore", "permits", "latch", "fenced")
#: A plain integer string with no index entry: Redisson stores both alike.
SEMAPHORE_OR_LATCH = "semaphore|latch"
_HASH_KINDS = frozenset({"lock", "fair", "rw", "fenced"})
_STRING_KINDS = frozenset({"semaphore", "permits", "latch"})

_FIELD = re.compile(r"(.+):(\d+)", re.DOTALL)
_WRITER = re.compile(r"(.+):(\d+):write", re.DOTALL)
_COUNT = re.compile(r"\d+")
_INTEGER = re.compile(r"-?\d+")
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")
# Keys the kinds keep next to their main key: never listed as locks of their own.
_AUX_PREFIXES = tuple(p + ":" for p in (FAIR_QUEUE_PREFIX, FAIR_TIMEOUT_PREFIX, TOKEN_PREFIX,
                                        "redisson_unlock_latch", INDEX_PREFIX)) + tuple(
    p + sep for p in (HANDOFF_QUEUE_PREFIX, HANDOFF_WAITERS_PREFIX) for sep in ":!")
# A read hold's timeout string, ``{key}:<owner>:rwlock_timeout:<k>``. (A permit zset
# ``{key}:timeout`` is neither hash nor string, so never a candidate.)
_AUX_NAME = re.compile(r".+:\d+:rwlock_timeout:\d+", re.DOTALL)


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern (a prefix may contain ``*`` or ``[``)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def is_auxiliary(key: str) -> bool:
    """A key one of the kinds keeps beside its main key (queue, timeouts, token, index)."""
    return key.startswith(_AUX_PREFIXES) or _AUX_NAME.fullmatch(key) is not None


def _text(value: Any) -> str | None:
    """Replies are bytes, or str with ``decode_responses=True``; None if not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _number(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = _text(value)
    return int(text) if text is not None and _INTEGER.fullmatch(text) else None


def _batches(items: Sequence[str], size: int = BATCH) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


@dataclass(frozen=True)
class Holder:
    """One hash field: who holds the lock, how many times (reentrancy), and, when this
    package took it, where and since when (None for a holder another Redisson client wrote).

    ``thread_id`` is the owner's number in the field (a per-process serial for this package);
    ``os_thread_id`` the OS thread it ran on; ``thread`` the thread or asyncio task name.
    ``write`` marks a read-write lock's writer (its field is ``<owner>:write``).
    """

    client_id: str
    thread_id: int
    hold_count: int
    host: str | None = None
    pid: int | None = None
    process: str | None = None
    thread: str | None = None
    held_for: float | None = None
    os_thread_id: int | None = None
    write: bool = False

    @property
    def owner(self) -> str:
        return f"{self.client_id}:{self.thread_id}"

    @property
    def field(self) -> str:
        """The hash field as Redis has it (the writer's carries ``:write``)."""
        return self.owner + (":write" if self.write else "")

    def as_dict(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "thread_id": self.thread_id,
                "hold_count": self.hold_count, "host": self.host, "pid": self.pid,
                "process": self.process, "thread": self.thread, "held_for": self.held_for}

    def describe(self) -> str:
        """One line for logs: ``<field> (runserver pid 12 on web-1, thread Thread-3, 2.5 s)``."""
        owner = self.field
        if self.pid is None:
            return owner
        held = "" if self.held_for is None else f", held {self.held_for:.1f} s"
        return (f"{owner} ({self.process} pid {self.pid} on {self.host}, thread {self.thread}"
                f"{held})")


@dataclass(frozen=True)
class LockInfo:
    """A live lock (or semaphore, latch) as read from Redis.

    ``ttl`` is in seconds, ``inf`` when the key has no expiry. ``fields`` is the raw hash
    (empty for the string kinds, whose raw value is ``value``). ``details`` holds what the kind
    adds (see ``Locks``): permits, count, mode, readers and writer, queue, token.
    """

    name: str
    key: str
    ttl: float
    holders: tuple[Holder, ...]
    fields: dict[str, str] = field(repr=False)
    kind: str = "lock"
    details: dict[str, Any] = field(default_factory=dict)
    value: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``ttl`` is null for a key without expiry; the kind's details flat."""
        return {
            "name": self.name,
            "key": self.key,
            "ttl": None if self.ttl == float("inf") else self.ttl,
            "holders": [h.as_dict() for h in self.holders],
            "kind": self.kind,
            **self.details,
        }

    def summary(self) -> str:
        """The kind's details in a few words ("" for a plain lock)."""
        d = self.details
        if self.kind == "fair":
            return f"queue {d['queue_length']}"
        if self.kind == "rw":
            readers = d["readers"]
            text = f"mode {d['mode']}, {len(readers)} reader{'s' if len(readers) != 1 else ''}"
            writer = d["writer"]
            return text + (f", writer {writer['owner']}" if writer else "")
        if self.kind == "fenced":
            return f"token {'-' if d['token'] is None else d['token']}"
        if self.kind == "semaphore":
            return f"{d['permits']} available"
        if self.kind == "permits":
            return f"{d['permits']} available, {d['taken']} taken"
        if self.kind == "latch":
            return f"count {d['count']}"
        if self.kind == SEMAPHORE_OR_LATCH:
            return f"value {d['value']}"
        return ""


def _entry(raw: Any, now: float) -> dict[str, Any] | None:
    """An index value ``"<since> <json>"`` as a dict with ``held_for``; None if unreadable."""
    text = _text(raw)
    if not text:
        return None
    since, _, blob = text.partition(" ")
    try:
        info = json.loads(blob)
        info["held_for"] = max(0.0, now - float(since))
    except (ValueError, TypeError):
        return None
    return info if isinstance(info, dict) else None


def _decoded(raw: Any) -> dict[str, str] | None:
    if not isinstance(raw, dict) or not raw:
        return None
    fields: dict[str, str] = {}
    for f, v in raw.items():
        f, v = _text(f), _text(v)
        if f is None or v is None:
            return None
        fields[f] = v
    return fields


def _holders(fields: dict[str, str], entry: dict[str, Any] | None, rw: bool
             ) -> tuple[Holder, ...] | None:
    """The holders of a lock hash, or None if it is not one. A read-write lock's ``mode`` is
    no holder; its writer's field is ``<owner>:write``."""
    holders = []
    for f, v in fields.items():
        if rw and f == "mode":
            continue
        m = _WRITER.fullmatch(f) if rw else None
        write = m is not None
        if m is None:
            m = _FIELD.fullmatch(f)
        if m is None or _COUNT.fullmatch(v) is None:
            return None
        holder = Holder(m.group(1), int(m.group(2)), int(v), write=write)
        if entry is not None and entry.get("owner") == f:
            holder = Holder(holder.client_id, holder.thread_id, holder.hold_count,
                            _str(entry.get("host")), _int(entry.get("pid")),
                            _str(entry.get("process")), _str(entry.get("thread")),
                            round(float(entry["held_for"]), 3), _int(entry.get("os_thread_id")),
                            write)
        holders.append(holder)
    return tuple(holders)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _kind(entry: dict[str, Any] | None, default: str | None) -> str | None:
    """The kind an index entry names (``default`` if it names none); None without an entry."""
    if entry is None:
        return None
    kind = entry.get("kind", default)
    return kind if isinstance(kind, str) else None


def _seconds_left(score: Any, now_ms: float) -> float | None:
    """A zset score (expiry, ms) as seconds left, None for never; 0 once past."""
    try:
        ms = float(score)
    except (TypeError, ValueError):
        return None
    if ms >= NEVER_MS:
        return None
    return round(max(0.0, ms - now_ms) / 1000.0, 3)


def _count(reply: Any) -> int:
    """LLEN / ZCARD reply; 0 for a wrong-type error."""
    return reply if isinstance(reply, int) and not isinstance(reply, bool) else 0


class _Keys:
    """The auxiliary names of one main key (Redisson's brace rule, from ``naming``)."""

    __slots__ = ("queue", "fair_timeouts", "token", "permit_timeouts")

    def __init__(self, key: str) -> None:
        self.queue = prefix_name(FAIR_QUEUE_PREFIX, key)
        self.fair_timeouts = prefix_name(FAIR_TIMEOUT_PREFIX, key)
        self.token = prefix_name(TOKEN_PREFIX, key)
        self.permit_timeouts = suffix_name(key, "timeout")


# -- force-unlock, one script per kind -----------------------------------------------------------
# Every script checks the key's type (a key recreated as something else since the read is left
# alone), deletes, drops the index entry and publishes what the kind's waiters listen for.
# Reply: 1 deleted, 0 nothing to do.

# KEYS[1] hash, KEYS[2] queue, KEYS[3] timeout zset, KEYS[4] index; ARGV[1] lock channel,
# ARGV[2] message. The queue goes too (its waiters re-queue on their next attempt); its head
# is told on its own channel, so it takes the lock at once.
FAIR_CLEAR = """
if redis.call('type', KEYS[1]).ok ~= 'hash' then return 0 end
local head = redis.call('lindex', KEYS[2], 0)
redis.call('del', KEYS[1], KEYS[2], KEYS[3])
redis.call('hdel', KEYS[4], KEYS[1])
if head then redis.call('publish', ARGV[1] .. ':' .. head, ARGV[2]) end
return 1
"""

# KEYS[1] hash, KEYS[2] index; ARGV[1] channel, ARGV[2] message. Every read hold's timeout
# string ``{key}:<field>:rwlock_timeout:<k>``, k = 1..count, goes with the hash.
RW_CLEAR = """
if redis.call('type', KEYS[1]).ok ~= 'hash' then return 0 end
local p
if string.find(KEYS[1], '{', 1, true) then p = KEYS[1] .. ':' else p = '{' .. KEYS[1] .. '}:' end
local f = redis.call('hgetall', KEYS[1])
for i = 1, #f, 2 do
  local c = tonumber(f[i + 1])
  if f[i] ~= 'mode' and c then
    for k = 1, c do redis.call('del', p .. f[i] .. ':rwlock_timeout:' .. k) end
  end
end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[2], KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
return 1
"""

# KEYS[1] string, KEYS[2] permit timeout zset, KEYS[3] index; ARGV[1] channel, ARGV[2]
# message (the permits now: 0), ARGV[3], ARGV[4] (optional) a second channel and message (a
# string that may be a latch as well).
SEMAPHORE_CLEAR = """
if redis.call('type', KEYS[1]).ok ~= 'string' then return 0 end
redis.call('del', KEYS[1], KEYS[2])
redis.call('hdel', KEYS[3], KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
if ARGV[3] then redis.call('publish', ARGV[3], ARGV[4]) end
return 1
"""

# KEYS[1] string, KEYS[2] index; ARGV[1] channel, ARGV[2] message.
LATCH_CLEAR = """
if redis.call('type', KEYS[1]).ok ~= 'string' then return 0 end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[2], KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
return 1
"""

# KEYS[1] hash, KEYS[2] index; ARGV[1] channel, ARGV[2] message. The token counter stays:
# tokens must keep growing across a force-unlock.
FENCED_CLEAR = """
if redis.call('type', KEYS[1]).ok ~= 'hash' then return 0 end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[2], KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
return 1
"""

FAIR_CLEAR_SCRIPT = Script(FAIR_CLEAR)
RW_CLEAR_SCRIPT = Script(RW_CLEAR)
SEMAPHORE_CLEAR_SCRIPT = Script(SEMAPHORE_CLEAR)
LATCH_CLEAR_SCRIPT = Script(LATCH_CLEAR)
FENCED_CLEAR_SCRIPT = Script(FENCED_CLEAR)


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

    def _index_of(self, key: str) -> str:
        return index_key(self.prefix, key) if self._per_key else self.index

    def _indexed(self, pattern: str) -> Iterable[Any]:
        """The lock keys (matching ``pattern``) that this node's per-lock indexes name."""
        head = f"{INDEX_PREFIX}:{self.prefix}"
        for sep in (":{", "!"):  # a key's own index is "<head>:{key}", or "<head>!key" if braced
            tail = "}" if sep == ":{" else ""
            idx_keys = [k for k in map(_text, self.client.scan_iter(
                match=glob_escape(head + sep) + pattern + tail, count=SCAN_COUNT, _type="hash"))
                if k is not None]
            for chunk in _batches(idx_keys):
                pipe = self.client.pipeline(transaction=False)
                for k in chunk:
                    pipe.hkeys(k)
                for idx, fields in zip(chunk, pipe.execute(), strict=True):
                    for f in map(_text, fields):
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
        keys = {k for k in map(_text, found) if k is not None and k != self.prefix}
        if scan:  # anything may be under the prefix: only lock-shaped keys count
            keys = {k for k in keys if not k.startswith(INDEX_PREFIX + ":") and not is_auxiliary(k)}
            return [info.name for chunk in _batches(sorted(keys)) for info in self._read(chunk)]
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

        Two round trips per ``BATCH`` names: shapes first (a big foreign key is never read
        whole), then contents, PTTL, index entry and the kind's auxiliary keys, with TIME.
        """
        out: list[LockInfo] = []
        for chunk in _batches([self.prefix + n for n in names if n]):
            out.extend(self._read(chunk))
        return out

    def show(self, name: str) -> LockInfo | None:
        """One lock with everything: a fair lock's queue, each permit's remaining lease."""
        found = self._read([self.prefix + name], detail=True) if name else []
        return found[0] if found else None

    def _read(self, keys: Sequence[str], detail: bool = False) -> list[LockInfo]:
        shapes = self._shapes(keys)
        wanted = [(k, s) for k, s in zip(keys, shapes, strict=True) if s]
        if not wanted:
            return []
        # Permit ids are raw bytes, which a decode_responses client cannot decode.
        raw_ok = not self.client.connection_pool.connection_kwargs.get("decode_responses")
        pipe = self.client.pipeline(transaction=False)
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
                pipe.zcard(aux.permit_timeouts)
                if detail:
                    if raw_ok:
                        pipe.zrange(aux.permit_timeouts, 0, MAX_SHOWN - 1, withscores=True)
                    else:
                        pipe.echo("")
            sizes.append((8 if detail else 6) if shape == "hash" else (5 if detail else 4))
        replies = pipe.execute(raise_on_error=False)
        now = int(replies[0][0]) + int(replies[0][1]) / 1e6
        out = []
        i = 1
        for (key, shape), size in zip(wanted, sizes, strict=True):
            got = replies[i:i + size]
            i += size
            pttl = got[1]
            if not isinstance(pttl, int) or pttl == -2:
                continue
            ttl = float("inf") if pttl == -1 else max(pttl, 0) / 1000.0
            entry = _entry(got[2], now)
            make = self._hash if shape == "hash" else self._string
            info = make(key, ttl, entry, got, now * 1000.0, detail)
            if info is not None:
                out.append(info)
        return out

    def _hash(self, key: str, ttl: float, entry: dict[str, Any] | None, got: list[Any],
              now_ms: float, detail: bool) -> LockInfo | None:
        fields = _decoded(got[0])
        if fields is None:
            return None
        queue_length, fair_size, token = _count(got[3]), _count(got[4]), _number(got[5])
        kind = _kind(entry, "lock")
        if kind not in _HASH_KINDS:  # no entry (SCAN), or one that does not fit: by layout
            if "mode" in fields:
                kind = "rw"
            elif queue_length or fair_size:
                kind = "fair"
            elif token is not None:
                kind = "fenced"
            else:
                kind = "lock"
        rw = kind == "rw"
        if rw and fields.get("mode") not in ("read", "write"):
            return None
        holders = _holders(fields, entry, rw)
        if holders is None:
            return None
        details: dict[str, Any] = {}
        if kind == "fair":
            details["queue_length"] = queue_length
            if detail:
                scores = {_text(m): s for m, s in got[7]} if isinstance(got[7], list) else {}
                queue = got[6] if isinstance(got[6], list) else []
                details["queue"] = [{"owner": o, "timeout": _seconds_left(scores.get(o), now_ms)}
                                    for o in map(_text, queue) if o is not None]
        elif rw:
            details["mode"] = fields["mode"]
            details["readers"] = [{"owner": h.owner, "hold_count": h.hold_count}
                                  for h in holders if not h.write]
            writer = next((h for h in holders if h.write), None)
            details["writer"] = (None if writer is None
                                 else {"owner": writer.owner, "hold_count": writer.hold_count})
        elif kind == "fenced":
            details["token"] = token
        return LockInfo(key[len(self.prefix):], key, ttl, holders, fields, kind, details)

    def _string(self, key: str, ttl: float, entry: dict[str, Any] | None, got: list[Any],
                now_ms: float, detail: bool) -> LockInfo | None:
        value = _text(got[0])
        number = _number(value)
        if value is None or number is None:
            return None
        taken = _count(got[3])
        kind = _kind(entry, None)
        if kind not in _STRING_KINDS:
            kind = "permits" if taken else SEMAPHORE_OR_LATCH
        details: dict[str, Any]
        if kind == "semaphore":
            details = {"permits": number}
        elif kind == "permits":
            details = {"permits": number, "taken": taken}
            if detail:
                leases = got[4] if isinstance(got[4], list) else []
                details["leases"] = [
                    {"id": m.hex() if isinstance(m, bytes) else str(m),
                     "ttl": _seconds_left(s, now_ms)} for m, s in leases]
        elif kind == "latch":
            details = {"count": number}
        else:
            details = {"value": number}
        return LockInfo(key[len(self.prefix):], key, ttl, (), {}, kind, details, value)

    # -- force-unlock ------------------------------------------------------------------------
    def clear(self, names: Iterable[str]) -> list[str]:
        """Force-unlock the named locks, each by its kind (delete and publish, so waiters
        wake). Only keys that are one of the kinds are touched. Returns the names unlocked."""
        return [info.name for info in self.read(names) if self.force(info)]

    def force(self, info: LockInfo) -> bool:
        """Force-unlock one lock as read (its kind decides how); True if it was deleted.

        This process's holds of it are dropped (their owners find them lost) and the
        ``force_unlocked`` event is sent, as ``RLock.force_unlock`` does.
        """
        if info.kind == "lock":
            from .lock import RLock

            return RLock(self.client, info.name, prefix=self.prefix).force_unlock()
        key, aux, index = info.key, _Keys(info.key), self._index_of(info.key)
        script: Script
        if info.kind == "fair":
            script, keys, args = (FAIR_CLEAR_SCRIPT, (key, aux.queue, aux.fair_timeouts, index),
                                  (lock_channel(key), UNLOCK_MESSAGE))
        elif info.kind == "rw":
            script, keys, args = (RW_CLEAR_SCRIPT, (key, index),
                                  (prefix_name(RWLOCK_CHANNEL_PREFIX, key), READ_UNLOCK_MESSAGE))
        elif info.kind == "fenced":
            script, keys, args = (FENCED_CLEAR_SCRIPT, (key, index),
                                  (lock_channel(key), UNLOCK_MESSAGE))
        elif info.kind == "latch":
            script, keys, args = (LATCH_CLEAR_SCRIPT, (key, index),
                                  (latch_channel(key), READ_UNLOCK_MESSAGE))
        else:  # semaphore, permits, or a string that may be either a semaphore or a latch
            script, keys = SEMAPHORE_CLEAR_SCRIPT, (key, aux.permit_timeouts, index)
            args = (prefix_name(SEMAPHORE_CHANNEL_PREFIX, key), "0")
            if info.kind == SEMAPHORE_OR_LATCH:
                args += (latch_channel(key), READ_UNLOCK_MESSAGE)
        before = watchdog().holds_of(server_id(self.client), key)
        deleted = bool(call(self.client, script, keys, args))
        watchdog().drop_holds(before if deleted else [])
        if events.listeners:
            events.emit("force_unlocked", name=info.name, key=key, label=None, deleted=deleted)
        return deleted


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

    def _read(self, keys: Sequence[str], detail: bool = False) -> list[LockInfo]:
        return [info for k in keys for info in self._node(k)._read([k], detail)]


def describe_holders(client: Any, key: str, prefix: str = "") -> str:
    """Who holds ``key`` now, for a log line ("nobody" if free); never raises."""
    try:
        info = Locks(client, prefix)._read([key])
    except Exception:
        return "?"
    if not info:
        return "nobody"
    if not info[0].holders:
        return f"{info[0].kind}: {info[0].summary()}"
    return ", ".join(h.describe() for h in info[0].holders)
