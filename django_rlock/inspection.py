"""List, show and force-unlock the live locks of a cache alias: the command's and admin's core.

The reading is the engine's (``engine.listing``): locks are listed from the index that the
acquire and release scripts keep, so a listing costs the same with 50 keys in the database or
20 million; ``scan=True`` walks the keyspace with SCAN (MATCH prefix+glob) instead,
to find locks taken by other Redisson clients (Java, Node), which never enter the index. The
admin pages by slicing the sorted names and reads only the rows of the page.

Every kind of the family is listed (``LockInfo.kind``: lock, fair, rw, semaphore, permits,
latch, fenced) with its details, and force-unlocked the way its waiters expect
(``engine.listing.Locks.force``). Only what is provably a lock is listed or cleared: a plain
integer string that no index entry names (a cache value, or a Redisson semaphore or latch,
which look the same) never is, by name or by SCAN.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .connection import cache_alias, get_client, get_prefix
from .engine import kinds
from .engine.kinds import SEMAPHORE_OR_LATCH
from .engine.listing import Holder, LockInfo, Locks, glob_escape


def __getattr__(name: str) -> Any:
    # ``KINDS``: every kind's name, from the registry.
    if name == "KINDS":
        return kinds.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SEMAPHORE_OR_LATCH", "Holder", "LockInfo", "LockInspector", "clear",
           "clear_all", "glob_escape", "list_locks", "show"]


class LockInspector:
    """The locks of one cache alias (default ``RLOCK['CACHE']``), under its prefix."""

    def __init__(self, cache: str | None = None) -> None:
        self.alias = cache_alias(cache)
        self.client: Any = get_client(self.alias)
        self.prefix = get_prefix(self.alias)
        self._locks = Locks(self.client, self.prefix)

    def names(self, match: str = "*", *, scan: bool = False) -> list[str]:
        """Sorted names of the live locks whose name matches the Redis glob ``match``."""
        return self._locks.names(match, scan=scan)

    def fetch(self, names: Iterable[str]) -> list[LockInfo]:
        """The named locks still live, in the given order; gone or non-lock keys left out."""
        return self._locks.read(names)

    def locks(self, match: str = "*", *, scan: bool = False) -> list[LockInfo]:
        """Every live lock whose name matches ``match``, sorted by name."""
        return self.fetch(self.names(match, scan=scan))

    def show(self, name: str) -> LockInfo | None:
        """The raw hash (or value), holders, TTL and the kind's details of one lock (a fair
        lock's queue, each permit's lease); None if there is no such lock."""
        return self._locks.show(name)

    def exists(self, name: str) -> bool:
        """Whether the key of ``name`` exists at all (lock or not): ``locks clear`` and
        ``show`` tell a key that is there but not provably a lock from one that is gone."""
        return bool(name) and bool(self.client.exists(self.prefix + name))

    def clear(self, names: Iterable[str]) -> list[str]:
        """Force-unlock the named locks, each as its kind needs (delete its keys and publish,
        so waiters wake). Only keys that are one of the kinds are touched. Returns the names
        actually unlocked."""
        return self._locks.clear(names)

    def clear_all(self, match: str = "*", *, scan: bool = False) -> list[str]:
        """Force-unlock every live lock whose name matches ``match``."""
        return self.clear(self.names(match, scan=scan))


def list_locks(match: str = "*", *, cache: str | None = None, scan: bool = False) -> list[LockInfo]:
    return LockInspector(cache).locks(match, scan=scan)


def show(name: str, *, cache: str | None = None) -> LockInfo | None:
    return LockInspector(cache).show(name)


def clear(names: Iterable[str], *, cache: str | None = None) -> list[str]:
    return LockInspector(cache).clear(names)


def clear_all(match: str = "*", *, cache: str | None = None, scan: bool = False) -> list[str]:
    return LockInspector(cache).clear_all(match, scan=scan)
