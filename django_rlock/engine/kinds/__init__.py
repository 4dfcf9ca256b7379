"""The kind registry: every kind of the family is declared once, here read by every layer.

A kind module declares its ``Kind`` at its end (``declare``): how listing recognises it, what
a force-unlock of it removes and whom it wakes, and the lock objects ``get_lock(kind=...)`` and
``@locked(kind=...)`` build from it. Listing, ``manage.py locks``, the admin and the Django
factories ask this module and never name a kind themselves, so adding a kind touches its
module, its Lua and one entry in ``MODULES`` (docs/engine.md, "How to add a kind").

The kind modules are imported on first use of the registry, not when it is imported: a kind
module imports the registry to declare itself.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The modules (under ``django_rlock.engine``) that declare kinds, in listing's order of
#: recognition for keys found without an index entry (a SCAN): the first whose ``detect``
#: says yes, else the layout's fallback (the kind without ``detect``).
MODULES = ("rwlock", "fair", "fenced", "nonreentrant", "aio", "semaphore", "permits", "latch",
           "leader", "ratelimit")

#: A string key found by SCAN with no index entry: Redisson stores a semaphore and a latch
#: alike (an integer string), so it is shown as either.
SEMAPHORE_OR_LATCH = "semaphore|latch"


@dataclass(frozen=True)
class Kind:
    """One kind of the family, as the layers above the engine see it.

    ``name``: the kind's name in listings (and in the index entry the acquire script writes).
    ``layout``: the Redis type of its main key, ``"hash"`` or ``"string"``.
    ``note``: what a force-unlock removes beyond the key and whom it wakes (the admin's
    confirmation page and ``locks clear`` say it; docs/django.md lists them).
    ``open(client, name, prefix)``: an object of the kind whose ``force_unlock()`` is *the*
    force-unlock of the kind (the same from the engine, ``locks clear`` and the admin).
    ``locks`` / ``async_locks``: the ``kind=`` names ``get_lock`` and ``@locked`` accept, each
    a factory ``(client, name, prefix, **options)`` of an object with the ``RLock`` API.
    ``modes``: its hash has a ``mode`` field and ``<owner>:write`` writer fields (read-write).
    ``detect(probe)``: whether a key of its layout found without an index entry is one of it.
    ``details(probe, detail)``: what listing shows beyond the holders (``probe``: what listing
    read of the key and its auxiliary keys, see ``listing``); ``summary(details)``: them in a
    few words, for a table cell; ``lines(details)``: them one per line (``locks show``).
    ``read(client, key)``: for a kind whose hash holds settings, not holders (a rate limiter):
    listing shows it with no holders and takes its details from this read (None: not one).
    """

    name: str
    layout: str
    note: str
    open: Callable[[Any, str, str], Any]
    locks: Mapping[str | None, Callable[..., Any]] = field(default_factory=dict)
    async_locks: Mapping[str | None, Callable[..., Any]] = field(default_factory=dict)
    modes: bool = False
    detect: Callable[[dict[str, Any]], bool] | None = None
    details: Callable[[dict[str, Any], bool], dict[str, Any]] | None = None
    summary: Callable[[dict[str, Any]], str] | None = None
    lines: Callable[[dict[str, Any]], list[str]] | None = None
    read: Callable[[Any, str], dict[str, Any] | None] | None = None
    #: The module that declared it (``declare`` fills it in): its place in ``MODULES``.
    module: str = ""


_kinds: dict[str, Kind] = {}
_loaded = False
_load_lock = threading.Lock()


def declare(kind: Kind) -> Kind:
    """Register ``kind`` (a kind module's last statement). A name is declared once."""
    if kind.layout not in ("hash", "string"):
        raise ValueError(f"kind {kind.name!r}: layout must be 'hash' or 'string', not "
                         f"{kind.layout!r}")
    known = _kinds.get(kind.name)
    if known is not None and known.module != sys._getframe(1).f_globals.get("__name__", ""):
        raise ValueError(f"kind {kind.name!r} is declared twice")
    if not kind.module:
        kind = dataclasses.replace(kind, module=sys._getframe(1).f_globals.get("__name__", ""))
    _kinds[kind.name] = kind
    return kind


def _load() -> None:
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if not _loaded:
            for module in MODULES:
                importlib.import_module(f"django_rlock.engine.{module}")
            _loaded = True


def _rank(kind: Kind) -> int:
    module = kind.module.rsplit(".", 1)[-1]
    return MODULES.index(module) if module in MODULES else len(MODULES)


def kinds() -> list[Kind]:
    """Every declared kind, in ``MODULES`` order (then in the order a module declares them)."""
    _load()
    return sorted(_kinds.values(), key=_rank)


def get(name: str | None) -> Kind | None:
    """The kind called ``name`` (None if there is none)."""
    _load()
    return _kinds.get(name) if name is not None else None


def names(layout: str | None = None) -> tuple[str, ...]:
    """The kinds' names (of one layout)."""
    return tuple(k.name for k in kinds() if layout is None or k.layout == layout)


def recognise(layout: str, probe: dict[str, Any]) -> Kind | None:
    """The kind of a key of ``layout`` found without an index entry (see ``MODULES``)."""
    fallback = None
    for kind in kinds():
        if kind.layout != layout:
            continue
        if kind.detect is None:
            fallback = fallback or kind
        elif kind.detect(probe):
            return kind
    return fallback


def lock_names() -> tuple[str | None, ...]:
    """The ``kind=`` values ``get_lock`` and ``@locked`` accept (None: Redisson's RLock)."""
    return tuple(n for k in kinds() for n in k.locks)


def lock_factory(name: str | None, aio: bool = False) -> Callable[..., Any] | None:
    """The factory of ``get_lock(kind=name)`` (``aio``: its asyncio twin); None if unknown."""
    for kind in kinds():
        table = kind.async_locks if aio else kind.locks
        if name in table:
            return table[name]
    return None


__all__ = ["MODULES", "SEMAPHORE_OR_LATCH", "Kind", "declare", "get", "kinds", "lock_factory",
           "lock_names", "names", "recognise"]
