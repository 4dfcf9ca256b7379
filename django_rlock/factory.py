"""Locks, semaphores and latches on the Redis connection of a Django cache alias: ``get_lock``,
``get_semaphore``, ``get_latch`` (public as ``django_rlock.get_lock``, ...).

The kinds themselves (``lock_of_kind``, ``check_kind``, ``check_permits``) are in
``django_rlock.kinds``, which needs no Django (``@locked(client=...)`` uses it), and are
re-exported here. Layering: ``conf``, ``connection``, ``kinds`` <- this module;
``decorators`` imports ``kinds`` (and ``connection`` when a call needs it), never this one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from .conf import lock_options
from .connection import cache_alias, get_client, get_prefix, multi_lock
from .engine import RLock
from .engine.lock import IN_EVENT_LOOP as ENGINE_IN_EVENT_LOOP
from .lockkinds import async_clients, async_lock_of_kind, check_kind, check_permits, lock_of_kind

__all__ = ["IN_EVENT_LOOP", "async_lock_of_kind", "cache_aliases", "check_kind",
           "check_permits", "get_latch", "get_lock", "get_semaphore", "lock_of_kind",
           "one_cache", "window_options"]

#: The ``RuntimeWarning`` of a sync lock (``get_lock()`` without ``aio=True``) taken in a thread
#: running an event loop: the engine's (``django_rlock.engine.lock.IN_EVENT_LOOP``), given where
#: the lock is taken, wherever it was made.
IN_EVENT_LOOP = ENGINE_IN_EVENT_LOOP


if TYPE_CHECKING:  # what get_lock returns, per kind, for type checkers (mypy --strict)
    from .engine import (
        AsyncFairLock,
        AsyncFencedLock,
        AsyncMultiLock,
        AsyncNonReentrantLock,
        AsyncReadLock,
        AsyncRLock,
        AsyncWriteLock,
        CountDownLatch,
        FairLock,
        FencedLock,
        MultiLock,
        NonReentrantLock,
        PermitExpirableSemaphore,
        ReadLock,
        WriteLock,
    )

    Caches = list[str] | tuple[str, ...]

    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: None = None,
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[False] = False) -> RLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["fair"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[False] = False) -> FairLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["read"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[False] = False) -> ReadLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["write"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[False] = False) -> WriteLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["fenced"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[False] = False) -> FencedLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["non_reentrant"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[False] = False) -> NonReentrantLock: ...
    @overload
    def get_lock(name: str, *, cache: Caches, label: str | None = None,
                 quorum: bool = False, kind: None = None, max_hold: float | None = None,
                 warn_held_after: float | None = None,
                 aio: Literal[False] = False) -> MultiLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: None = None,
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[True]) -> AsyncRLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["fair"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[True]) -> AsyncFairLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["read"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[True]) -> AsyncReadLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["write"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[True]) -> AsyncWriteLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["fenced"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[True]) -> AsyncFencedLock: ...
    @overload
    def get_lock(name: str, *, cache: str | None = None, label: str | None = None,
                 quorum: Literal[False] = False, kind: Literal["non_reentrant"],
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: Literal[True]) -> AsyncNonReentrantLock: ...
    @overload
    def get_lock(name: str, *, cache: Caches, label: str | None = None,
                 quorum: bool = False, kind: None = None, max_hold: float | None = None,
                 warn_held_after: float | None = None,
                 aio: Literal[True]) -> AsyncMultiLock: ...
    @overload
    def get_lock(name: str, *, cache: str | Sequence[str] | None = None,
                 label: str | None = None, quorum: bool = False, kind: str | None = None,
                 max_hold: float | None = None, warn_held_after: float | None = None,
                 aio: bool = False) -> RLock | MultiLock | AsyncRLock: ...


def get_lock(name: str, *, cache: str | Sequence[str] | None = None,  # type: ignore[misc]
             label: str | None = None, quorum: bool = False, kind: str | None = None,
             max_hold: float | None = None, warn_held_after: float | None = None,
             aio: bool = False) -> Any:
    """A lock on the cache's Redis connection, with the configured prefix, watchdog and
    replica sync. ``label``: what events and metrics call it (a template, never the name).

    ``kind``: None (an ``RLock``), ``"fair"`` (``FairLock``), ``"read"`` / ``"write"`` (the
    ``read_lock()`` / ``write_lock()`` of the ``ReadWriteLock`` of that name), ``"fenced"``
    (``FencedLock``) or ``"non_reentrant"``. Every kind has the ``RLock`` API.

    ``cache=["a", "b", "c"]``: a ``MultiLock`` over those aliases' servers (each with its own
    prefix), or with ``quorum=True`` a ``RedLock`` (a majority of them); only of RLocks.

    ``max_hold`` / ``warn_held_after``: seconds (``RLOCK["MAX_HOLD"]`` /
    ``RLOCK["WARN_HELD_AFTER"]`` when None): a hold is never renewed past ``max_hold``; one
    older than ``warn_held_after`` is logged once (``django_rlock.engine.windows``).

    ``aio=True``: the asyncio twin of the same lock (``AsyncRLock``, ``AsyncFairLock``, ...,
    ``AsyncMultiLock`` / ``AsyncRedLock``), owned by the asyncio task, on the cache's
    ``redis.asyncio`` twin for the running loop: call it inside the coroutine that uses it.
    Without it, the lock taken in a thread running an event loop warns (``IN_EVENT_LOOP``): an
    RLock there is owned by the loop's thread, which every task shares, so it excludes nothing
    between them. A warning, not an error: a one-shot ``try_lock`` with no ``await`` before
    its ``unlock`` still excludes, and code that works must not break on an upgrade.
    """
    check_kind(kind, name)
    options = window_options(lock_options(), max_hold, warn_held_after, name)
    if aio:
        return _async_lock(name, cache, label, quorum, kind, options)
    if isinstance(cache, (list, tuple)):
        if kind is not None:
            raise ValueError(f"kind={kind!r} cannot span several caches: a MultiLock/RedLock "
                             f"is made of plain RLocks (lock {name!r})")
        return multi_lock([RLock(get_client(a), name, prefix=get_prefix(a), label=label,
                                 **options) for a in cache_aliases(cache)], quorum)
    if quorum:
        raise ValueError(f"quorum=True needs a list of cache aliases (lock {name!r})")
    return lock_of_kind(kind, get_client(cache), name, get_prefix(cache), label=label,
                        **options)


def in_event_loop() -> bool:
    """Whether this thread runs an event loop now (``sync_to_async`` code runs in another
    thread: False there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _async_lock(name: str, cache: str | Sequence[str] | None, label: str | None, quorum: bool,
                kind: str | None, options: dict[str, Any]) -> Any:
    """``get_lock(aio=True)``: checked like the sync form, then built on the asyncio twins of
    the caches' clients for the running loop (they renew and wait on the sync clients)."""
    from .engine import AsyncMultiLock, AsyncRedLock

    several = isinstance(cache, (list, tuple))
    if several and kind is not None:
        raise ValueError(f"kind={kind!r} cannot span several caches: an AsyncMultiLock/"
                         f"AsyncRedLock is made of plain AsyncRLocks (lock {name!r})")
    if quorum and not several:
        raise ValueError(f"quorum=True needs a list of cache aliases (lock {name!r})")
    aliases = cache_aliases(cache) if several else [cache_alias(cache)]  # type: ignore[arg-type]
    if not in_event_loop():
        raise RuntimeError(f"get_lock(aio=True) needs a running event loop: call it in the "
                           f"coroutine that uses the lock (lock {name!r})")
    members = []
    for a in aliases:
        aclient, _, sync = async_clients(get_client(a))
        members.append(async_lock_of_kind(None if several else kind, aclient, name,
                                          get_prefix(a), label=label, sync_client=sync,
                                          **options))
    if several:
        return AsyncRedLock(*members) if quorum else AsyncMultiLock(*members)
    return members[0]


def window_options(options: dict[str, Any], max_hold: Any, warn_held_after: Any,
                   name: str) -> dict[str, Any]:
    """``options`` with the call's own time windows over the settings' (checked here,
    before any command)."""
    from .engine.windows import check_window

    if max_hold is not None:
        options = {**options, "max_hold": check_window(max_hold, "max_hold", name)}
    if warn_held_after is not None:
        options = {**options, "warn_held_after": check_window(warn_held_after,
                                                              "warn_held_after", name)}
    return options


def get_semaphore(name: str, permits: int | None = None, *,
                  cache: str | None = None) -> PermitExpirableSemaphore:
    """A ``PermitExpirableSemaphore`` on the cache's Redis connection (prefix and watchdog
    timeout from the settings): permits taken without a lease are renewed while their holder
    lives and come back within ``WATCHDOG_TIMEOUT`` after a crash.

    ``permits``: set the number of permits if the semaphore has none yet (``try_set_permits``,
    one command now); an existing semaphore keeps its own count. None: leave it alone.
    """
    from .engine.lock import check_name

    check_name(name)
    one_cache(cache, f"semaphore {name!r}")
    if permits is not None:
        check_permits(permits, name)
    from .engine.semaphore import PermitExpirableSemaphore

    options = lock_options()
    sem = PermitExpirableSemaphore(get_client(cache), name, get_prefix(cache),
                                   watchdog_timeout=options["watchdog_timeout"],
                                   max_hold=options.get("max_hold"),
                                   warn_held_after=options.get("warn_held_after"))
    if permits is not None:
        sem.try_set_permits(permits)
    return sem


def get_latch(name: str, *, cache: str | None = None) -> CountDownLatch:
    """A ``CountDownLatch`` on the cache's Redis connection, at the configured prefix."""
    from .engine.lock import check_name

    check_name(name)
    one_cache(cache, f"latch {name!r}")
    from .engine.latch import CountDownLatch

    return CountDownLatch(get_client(cache), name, get_prefix(cache))


def one_cache(cache: Any, what: str) -> None:
    """``cache`` of a factory over one server: an alias or None (TypeError naming ``what``,
    before any Redis command; only ``get_lock`` and ``@locked`` span a list of caches)."""
    if cache is not None and not isinstance(cache, str):
        raise TypeError(f"cache must be a cache alias (str) or None, not "
                        f"{type(cache).__name__} ({what}); only get_lock() and @locked take a "
                        f"list of caches")


def cache_aliases(caches_: Sequence[str]) -> list[str]:
    """A list of cache aliases for a MultiLock/RedLock: non-empty, distinct, known."""
    aliases = list(caches_)
    if not aliases or not all(isinstance(a, str) for a in aliases):
        raise ValueError(f"cache must be an alias or a non-empty list of aliases, got {caches_!r}")
    if len(set(aliases)) != len(aliases):
        raise ValueError(f"cache aliases repeat: {aliases!r}")
    return [cache_alias(a) for a in aliases]

