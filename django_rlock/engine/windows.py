"""Time windows on holds: ``max_hold`` (never renewed past it) and ``warn_held_after`` (one
WARNING and one ``held_long`` event per hold), and how a lost hold is told to its owner.

Both ride the watchdog's timeline (``renewal.Scheduler``): a hold with a window has one more
due time, its *alarm* (the earlier of its ``warn_at`` and, renewed holds only, its
``deadline``), and the timeline entry of the hold is put at the alarm when that comes before
its next renewal. A hold without a window pays one comparison per renewal. What an alarm
decides is decided under the watchdog's lock (``Watchdog.alarm``); what it says (logs,
events, ``on_lost``) runs here, on a renewal pool thread, never under that lock.

Lost reasons (``reason`` of the ``lost`` event, and of ``on_lost`` when it takes one):
``"expired"`` (a renewal found the hold gone), ``"force_unlocked"``, ``"unconfirmed"`` (no
renewal confirmed before its lease ran out), ``"ran_out"`` (a grant or reply that ran out
before its owner could run), ``"max_hold"``.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from . import events

logger = logging.getLogger("django_rlock")

REASONS = ("expired", "force_unlocked", "unconfirmed", "ran_out", "max_hold")


def check_window(value: Any, what: str, name: str) -> float | None:
    """``max_hold`` / ``warn_held_after``: None (off) or a finite number of seconds > 0;
    TypeError/ValueError naming the lock, before any Redis command."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, not "
                        f"{type(value).__name__} (lock {name!r})")
    v = float(value)
    if math.isnan(v) or math.isinf(v) or v <= 0:
        raise ValueError(f"{what} must be a finite number > 0 seconds or None, got {value!r} "
                         f"(lock {name!r})")
    return v


def check_lease(lease_s: float, max_hold: float | None, name: str) -> None:
    """A lease longer than ``max_hold`` would outlive it: refused, not silently cut."""
    if max_hold is not None and lease_s > max_hold:
        raise ValueError(f"lease_time {lease_s:g} s is longer than max_hold {max_hold:g} s "
                         f"(lock {name!r}): give a lease <= max_hold, or none (watchdog mode)")


def holder_text(h: Any) -> str:
    """Who holds ``h``, for a WARNING: the owner id and, if known, its thread."""
    thread = getattr(h.thread, "name", None)
    return h.owner if thread is None else f"{h.owner} (thread {thread!r})"


def notify(notes: list[tuple[str, Any]], tell_lost: Callable[[Any, str, str], None]) -> None:
    """(On a pool thread.) Say what the alarms decided: ``held_long`` and ``max_hold``."""
    now = time.monotonic()
    for what, h in notes:
        held = now - h.since
        try:
            if what == "held_long":
                logger.warning("django-rlock: lock %r (key %r) has been held by %s for %.1f s, "
                               "longer than warn_held_after=%g s", h.name, h.key,
                               holder_text(h), held, h.warn_after)
                if events.listeners:
                    events.emit("held_long", name=h.name, key=h.key, label=h.label,
                                owner=h.owner, held=held, threshold=h.warn_after)
            else:
                logger.warning("django-rlock: lock %r (key %r) held by %s for %.1f s reached its "
                               "max_hold of %g s: no longer renewed, it expires now and the "
                               "holder is told it is lost", h.name, h.key, holder_text(h), held,
                               h.max_hold)
                tell_lost(h, f"was held past its max_hold of {h.max_hold:g} s", "max_hold")
        except Exception:  # never let a pool thread die for a log line or a listener
            logger.exception("django-rlock: telling about lock %r failed", h.name)


def _takes_reason(callback: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "reason" and p.kind in (
        p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) for p in params)


def call_on_lost(callback: Callable[..., Any], name: str, reason: str) -> None:
    """``on_lost(name)``, or ``on_lost(name, reason=...)`` when it takes a ``reason``."""
    try:
        if _takes_reason(callback):
            callback(name, reason=reason)
        else:
            callback(name)
    except Exception:
        logger.exception("django-rlock: on_lost callback for lock %r failed", name)
