"""List, show and force-unlock the live locks of a cache alias: the command's and admin's core.

A lock is recognised by shape, not by name alone: a HASH under the prefix whose every field is
``<client id>:<thread id>`` with an integer hold count (Redisson's layout). Anything else under
the prefix (a cache value, somebody's own hash) is never listed and never deleted.

Listing scales to many locks without KEYS: SCAN (``MATCH prefix+glob TYPE hash``) collects the
candidate keys, then pipelined batches check their shape (HLEN first, so a big foreign hash is
never read whole). The admin pages by slicing the sorted names and reads only the rows of the
page (HGETALL + PTTL), so a page of 100 out of 10,000 locks costs one SCAN sweep plus one small
pipeline. A SCAN-cursor page would be cheaper still but cannot be sorted, counted or jumped to.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .connection import cache_alias, get_client, get_prefix
from .engine import RLock

#: SCAN COUNT hint: keys the server visits per call.
SCAN_COUNT = 1000
#: Keys checked per pipeline round trip.
BATCH = 500
#: A lock hash has one field (its owner); more than this and it is not a lock, and is not read.
MAX_FIELDS = 16

_FIELD = re.compile(r"(.+):(\d+)", re.DOTALL)
_COUNT = re.compile(r"\d+")
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def _batches(items: Sequence[str], size: int = BATCH) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


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


@dataclass(frozen=True)
class Holder:
    """One hash field: who holds the lock and how many times (reentrancy)."""

    client_id: str
    thread_id: int
    hold_count: int


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
            "holders": [{"client_id": h.client_id, "thread_id": h.thread_id,
                         "hold_count": h.hold_count} for h in self.holders],
        }


def _parse(raw: Any) -> tuple[dict[str, str], tuple[Holder, ...]] | None:
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
        holders.append(Holder(m.group(1), int(m.group(2)), int(v)))
    return fields, tuple(holders)


class LockInspector:
    """The locks of one cache alias (default ``RLOCK['CACHE']``), under its prefix."""

    def __init__(self, cache: str | None = None) -> None:
        self.alias = cache_alias(cache)
        self.client = get_client(self.alias)
        self.prefix = get_prefix(self.alias)

    def names(self, match: str = "*") -> list[str]:
        """Sorted names of the live locks whose name matches the Redis glob ``match``."""
        keys = {_text(k) for k in self.client.scan_iter(
            match=glob_escape(self.prefix) + match, count=SCAN_COUNT, _type="hash")}
        keys.discard(None)
        keys.discard(self.prefix)  # a lock name is never empty
        found: list[str] = []
        for chunk in _batches(sorted(keys)):  # type: ignore[type-var]
            found.extend(info.name for info in self._read(chunk))
        return found

    def fetch(self, names: Iterable[str]) -> list[LockInfo]:
        """The named locks still live, in the given order; gone or non-lock keys left out."""
        out: list[LockInfo] = []
        for chunk in _batches([self.prefix + n for n in names if n]):
            out.extend(self._read(chunk))
        return out

    def locks(self, match: str = "*") -> list[LockInfo]:
        """Every live lock whose name matches ``match``, sorted by name."""
        return self.fetch(self.names(match))

    def show(self, name: str) -> LockInfo | None:
        """The raw hash and TTL of one lock; None if there is no such lock."""
        found = self._read([self.prefix + name])
        return found[0] if found else None

    def clear(self, names: Iterable[str]) -> list[str]:
        """Force-unlock the named locks (delete and publish, so waiters wake).

        Only keys that are lock hashes are touched. Returns the names actually unlocked.
        """
        cleared = []
        for info in self.fetch(names):
            if RLock(self.client, info.name, prefix=self.prefix).force_unlock():
                cleared.append(info.name)
        return cleared

    def clear_all(self, match: str = "*") -> list[str]:
        """Force-unlock every live lock whose name matches ``match``."""
        return self.clear(self.names(match))

    def _read(self, keys: Sequence[str]) -> list[LockInfo]:
        """Lock-shaped hashes among ``keys`` with their fields and TTL: two round trips."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hlen(key)
        sizes = pipe.execute(raise_on_error=False)  # WRONGTYPE comes back as an exception
        small = [k for k, n in zip(keys, sizes, strict=True)
                 if isinstance(n, int) and 0 < n <= MAX_FIELDS]
        if not small:
            return []
        for key in small:
            pipe.hgetall(key)
            pipe.pttl(key)
        replies = pipe.execute(raise_on_error=False)
        out = []
        for i, key in enumerate(small):
            parsed, pttl = _parse(replies[2 * i]), replies[2 * i + 1]
            if parsed is None or not isinstance(pttl, int) or pttl == -2:
                continue
            ttl = float("inf") if pttl == -1 else max(pttl, 0) / 1000.0
            out.append(LockInfo(key[len(self.prefix):], key, ttl, parsed[1], parsed[0]))
        return out


def list_locks(match: str = "*", *, cache: str | None = None) -> list[LockInfo]:
    return LockInspector(cache).locks(match)


def show(name: str, *, cache: str | None = None) -> LockInfo | None:
    return LockInspector(cache).show(name)


def clear(names: Iterable[str], *, cache: str | None = None) -> list[str]:
    return LockInspector(cache).clear(names)


def clear_all(match: str = "*", *, cache: str | None = None) -> list[str]:
    return LockInspector(cache).clear_all(match)
