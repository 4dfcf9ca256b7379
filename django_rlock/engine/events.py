"""Lock events for code without Django: metrics, audit logs, alerts.

    events.add_listener(lambda event, data: print(event, data["name"]))  # engine.events

``event`` is one of ``EVENTS``; ``data`` always has ``name``, ``key`` and ``label`` (the
``@locked`` template, or the ``label=`` given to the lock: a bounded set, fit for metric
labels, where the name is not), plus:

- ``acquired``: ``owner``, ``kind`` (the lock's class name, as in ``wait_started``), ``wait``
  (seconds from the call to the grant), ``lease`` (seconds, ``None`` in watchdog mode). Sent
  when an owner starts holding, not on reentry.
- ``released``: ``owner``, ``held`` (seconds), ``reason`` (``"unlock"``, or ``"owner ended"``
  when the watchdog released the hold of a thread or task that ended without unlocking).
- ``lost``: ``owner``, ``held``, ``how`` (in words), ``reason`` (``"expired"``,
  ``"force_unlocked"``, ``"unconfirmed"``, ``"ran_out"`` or ``"max_hold"``: see ``windows``).
- ``held_long``: ``owner``, ``held``, ``threshold``: a hold older than its
  ``warn_held_after`` (once per hold, from the watchdog's sweep, said on a pool thread).
- ``busy``: ``ttl`` (seconds left on the holder's lease, or None): a ``@locked`` call turned away.
- ``force_unlocked``: ``deleted`` (whether a lock was there).
- ``backend_unavailable``: ``backend`` (the cache alias, in words), ``error`` (the redis
  exception), ``first`` (the first call of an outage; the outage ends at the next call that
  reaches the server): a decorated call turned away because Redis did not answer. ``key`` is
  None.
- ``wait_started``: an acquire's first attempt found the lock taken and the caller waits (the
  shared wait loop, every kind): ``kind`` (the lock's class name), ``owner`` (``""`` for
  semaphores and latches). Sent on the waiting thread (or task).
- ``wait_ended``: that wait is over, on the same thread (or task): ``kind``, ``owner``,
  ``outcome`` (``"acquired"``, ``"timeout"``: its budget ran out, ``"error"``: it raised or was
  cancelled), ``wait`` (seconds from the call), ``handed_over`` (the lock was granted to it by a
  release rather than taken by its own attempt), ``client`` (the sync client, to read who holds
  the lock; None when acquired). Each ``wait_started`` has exactly one ``wait_ended``.
- ``refused``: a one-shot acquire (no wait: ``try_lock(0)``, ``acquire(blocking=False)``) found
  the lock taken: ``kind``, ``owner``, ``wait``, ``client``. Every kind, sync and asyncio.
- ``leader_started``, ``leader_elected``, ``leader_revoked``: a ``Leader`` of this process began
  to campaign, won a term, lost or left it; ``group``, and ``term`` (elected, revoked) and
  ``reason`` (revoked: ``"stopped"``, ``"lost"``, ``"in doubt"``). ``label`` is the group's
  lock name. Sent on the Leader's thread (or task), before its callback.

Listeners run synchronously on the thread that caused the event (the watchdog's threads for
``lost``, ``held_long`` and ``owner ended``); an exception in one is logged and never reaches the lock. With
no listener the hot path pays one truth test of a list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_rlock")

EVENTS = ("acquired", "released", "lost", "busy", "force_unlocked", "held_long", "leader_started",
          "leader_elected", "leader_revoked", "backend_unavailable", "wait_started",
          "wait_ended", "refused")

Listener = Callable[[str, dict[str, Any]], Any]

#: Read without a lock on the hot path: replaced, never mutated, so a reader sees a whole list.
listeners: tuple[Listener, ...] = ()


def add_listener(listener: Listener) -> None:
    """Call ``listener(event, data)`` for every lock event in this process."""
    global listeners
    if not callable(listener):
        raise TypeError(f"a lock event listener must be callable, not {type(listener).__name__}")
    if listener not in listeners:
        listeners = (*listeners, listener)


def remove_listener(listener: Listener) -> None:
    global listeners
    listeners = tuple(x for x in listeners if x != listener)


def emit(event: str, **data: Any) -> None:
    """Send ``event`` to every listener. Callers test ``events.listeners`` first."""
    for listener in listeners:
        try:
            listener(event, data)
        except Exception:
            logger.exception("django-rlock: lock event listener %r failed on %s", listener, event)
