"""Who holds what: list, read and describe the locks under a prefix, without Django.

Listing reads the index (``naming.index_key``), which the acquire and release scripts keep:
one HSCAN of a hash as small as the number of live locks, whatever else the database holds.
Entries are verified on read: a lock deleted or expired behind the index's back is not
listed, and its entry is pruned (by a script that re-checks, so a lock taken again since the
read is never unlisted). ``scan_names`` is the fallback that walks the whole keyspace with
SCAN: it also finds locks that other Redisson clients (Java, Node) took, which never enter
the index.

A lock is recognised by shape, not by name alone: a HASH whose every field is
``<client id>:<thread id>`` with an integer hold count (Redisson's layout). Anything else
(a cache value, somebody's own hash) is never listed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .naming import index_key
from .scripts import PRUNE_INDEX_SCRIPT, call

#: COUNT hint of SCAN / HSCAN: entries the server visits per call.
SCAN_COUNT = 1000
#: Keys checked per pipeline round trip.
BATCH = 500
#: A lock hash has one field (its owner); more than this and it is not a lock, and is not read.
MAX_FIELDS = 16

_FIELD = re.compile(r"(.+):(\d+)", re.DOTALL)
_COUNT = re.compile(r"\d+")
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern (a prefix may contain ``*`` or ``[``)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def _text(value: Any) -> str | None:
    """Replies are bytes, or str with ``decode_responses=True``; None if not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _batches(items: Sequence[str], size: int = BATCH) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


@dataclass(frozen=True)
class Holder:
    """One hash field: who holds the lock, how many times (reentrancy), and, when this
    package took it, where and since when (None for a holder another Redisson client wrote).

    ``thread_id`` is the owner's number in the field (a per-process serial for this package);
    ``os_thread_id`` the OS thread it ran on; ``thread`` the thread or asyncio task name.
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

    def as_dict(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "thread_id": self.thread_id,
                "hold_count": self.hold_count, "host": self.host, "pid": self.pid,
                "process": self.process, "thread": self.thread, "held_for": self.held_for}

    def describe(self) -> str:
        """One line for logs: ``<field> (runserver pid 12 on web-1, thread Thread-3, 2.5 s)``."""
        owner = f"{self.client_id}:{self.thread_id}"
        if self.pid is None:
            return owner
        held = "" if self.held_for is None else f", held {self.held_for:.1f} s"
        return (f"{owner} ({self.process} pid {self.pid} on {self.host}, thread {self.thread}"
                f"{held})")


@dataclass(frozen=True)
class LockInfo:
    """A live lock as read from Redis.

    ``ttl`` is in seconds, ``inf`` when the key has no expiry. ``fields`` is the raw hash.
    """

    name: str
    key: str
    ttl: float
    holders: tuple[Holder, ...]
    fields: dict[str, str] = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``ttl`` is null for a key without expiry."""
        return {
            "name": self.name,
            "key": self.key,
            "ttl": None if self.ttl == float("inf") else self.ttl,
            "holders": [h.as_dict() for h in self.holders],
        }


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


def _holders(raw: Any, entry: dict[str, Any] | None) -> tuple[dict[str, str], tuple[Holder, ...]] | None:
    """The fields and holders of a HGETALL reply, or None if it is not a lock hash."""
    if not isinstance(raw, dict) or not raw:
        return None
    fields: dict[str, str] = {}
    holders = []
    for f, v in raw.items():
        f, v = _text(f), _text(v)
        if f is None or v is None:
            return None
        m = _FIELD.fullmatch(f)
        if m is None or _COUNT.fullmatch(v) is None:
            return None
        fields[f] = v
        holder = Holder(m.group(1), int(m.group(2)), int(v))
        if entry is not None and entry.get("owner") == f:
            holder = Holder(holder.client_id, holder.thread_id, holder.hold_count,
                            _str(entry.get("host")), _int(entry.get("pid")),
                            _str(entry.get("process")), _str(entry.get("thread")),
                            round(float(entry["held_for"]), 3), _int(entry.get("os_thread_id")))
        holders.append(holder)
    return fields, tuple(holders)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class Locks:
    """The locks under one prefix on one redis-py client."""

    def __init__(self, client: Any, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix
        self.index = index_key(prefix)

    def names(self, match: str = "*", *, scan: bool = False) -> list[str]:
        """Sorted names of the live locks whose name matches the Redis glob ``match``.

        From the index (HSCAN of one small hash); ``scan=True`` walks the keyspace with SCAN
        instead, which also finds locks other Redisson clients took.
        """
        pattern = glob_escape(self.prefix) + match
        if scan:
            found = self.client.scan_iter(match=pattern, count=SCAN_COUNT, _type="hash")
        else:
            # Fields and values (HSCAN NOVALUES needs Redis 7.4); values are ~150 bytes.
            found = (f for f, _ in self.client.hscan_iter(self.index, match=pattern,
                                                          count=SCAN_COUNT))
        keys = {k for k in map(_text, found) if k is not None and k != self.prefix}
        if scan:  # anything may be under the prefix: only lock-shaped hashes count
            keys.discard(self.index)
            return [info.name for chunk in _batches(sorted(keys)) for info in self._read(chunk)]
        live: list[str] = []
        gone: list[str] = []
        for chunk in _batches(sorted(keys)):
            pipe = self.client.pipeline(transaction=False)
            for key in chunk:
                pipe.hlen(key)
            sizes = pipe.execute(raise_on_error=False)  # WRONGTYPE comes back as an exception
            for key, n in zip(chunk, sizes, strict=True):
                if isinstance(n, int) and 0 < n <= MAX_FIELDS:
                    live.append(key)
                elif n == 0:
                    gone.append(key)
        self._prune(gone)
        return [k[len(self.prefix):] for k in live]

    def _prune(self, keys: list[str]) -> None:
        for chunk in _batches(keys):
            call(self.client, PRUNE_INDEX_SCRIPT, (self.index, *chunk), ())

    def read(self, names: Iterable[str]) -> list[LockInfo]:
        """The named locks still live, in the given order; gone or non-lock keys left out.

        Two round trips per ``BATCH`` names: sizes first (a big foreign hash is never read
        whole), then fields, PTTL and index entry of the lock-shaped ones, with server TIME.
        """
        out: list[LockInfo] = []
        for chunk in _batches([self.prefix + n for n in names if n]):
            out.extend(self._read(chunk))
        return out

    def show(self, name: str) -> LockInfo | None:
        found = self._read([self.prefix + name])
        return found[0] if found else None

    def _read(self, keys: Sequence[str]) -> list[LockInfo]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hlen(key)
        sizes = pipe.execute(raise_on_error=False)
        small = [k for k, n in zip(keys, sizes, strict=True)
                 if isinstance(n, int) and 0 < n <= MAX_FIELDS]
        if not small:
            return []
        pipe.time()
        for key in small:
            pipe.hgetall(key)
            pipe.pttl(key)
            pipe.hget(self.index, key)
        replies = pipe.execute(raise_on_error=False)
        now = int(replies[0][0]) + int(replies[0][1]) / 1e6
        out = []
        for i, key in enumerate(small):
            raw, pttl, entry = replies[1 + 3 * i: 4 + 3 * i]
            parsed = _holders(raw, _entry(entry, now))
            if parsed is None or not isinstance(pttl, int) or pttl == -2:
                continue
            ttl = float("inf") if pttl == -1 else max(pttl, 0) / 1000.0
            out.append(LockInfo(key[len(self.prefix):], key, ttl, parsed[1], parsed[0]))
        return out


def describe_holders(client: Any, key: str, prefix: str = "") -> str:
    """Who holds ``key`` now, for a log line ("nobody" if free); never raises."""
    try:
        info = Locks(client, prefix)._read([key])
    except Exception:
        return "?"
    if not info:
        return "nobody"
    return ", ".join(h.describe() for h in info[0].holders)
