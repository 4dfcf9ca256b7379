"""Django signals for lock events, forwarded from the engine's listeners (``engine.events``).

Every signal is sent with ``sender=None`` and at least ``name``, ``key`` and ``label`` (the ``@locked``
template or the lock's ``label=``: bounded, unlike names). The other arguments are the
engine event's (see ``django_rlock.engine.events``):

- ``lock_acquired``: ``owner``, ``wait``, ``lease``. Also a renewed permit taken (every
  ``@limited`` call's: ``owner`` is the permit id, ``label`` the template), and its
  ``lock_released`` / ``lock_lost`` as a lock's.
- ``lock_released``: ``owner``, ``held``, ``reason`` (``"unlock"`` or ``"owner ended"``).
- ``lock_lost``: ``owner``, ``held``, ``how``, ``reason`` (``"max_hold"``, ``"expired"``, ...).
- ``lock_held_long``: ``owner``, ``held``, ``threshold``: held longer than ``warn_held_after``
  (once per hold).
- ``lock_busy``: ``ttl``: a ``@locked`` / ``@limited`` / ``@rate_limited`` call turned away.
- ``lock_backend_unavailable``: ``backend``, ``error``, ``first``: a ``@locked`` /
  ``@limited`` / ``@rate_limited`` call turned away (a view's 503, a task's retry) because its
  Redis did not answer; ``first`` is True for the first such call of an outage (the one the
  WARNING is logged for). ``key`` is None.
- ``lock_force_unlocked``: ``deleted``, and ``user``: the admin user, or ``None`` (the
  ``locks clear`` command, or code calling ``force_unlock()``).
- ``leader_elected``: ``group``, ``term``: a ``Leader`` of this process won a term.
- ``leader_revoked``: ``group``, ``term``, ``reason`` (``"stopped"``, ``"lost"``, ``"in
  doubt"``): it left or lost it. Both on the Leader's thread (or task), before its callback.

Receivers run on the thread that caused the event (the watchdog's for ``lock_lost`` and for
releases of ended owners); an exception in one is logged, never raised into the lock. Async
receivers work too: from an asyncio lock on its event loop, a signal that has one is sent by
``asend_robust`` in a task on that loop, just after the event (Django then runs its sync
receivers in a thread); elsewhere ``send_robust`` runs them through ``async_to_sync``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_rlock")

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_busy = Signal()
lock_force_unlocked = Signal()
leader_elected = Signal()
leader_revoked = Signal()
lock_held_long = Signal()
lock_backend_unavailable = Signal()

_SIGNALS = {
    "acquired": lock_acquired,
    "released": lock_released,
    "lost": lock_lost,
    "busy": lock_busy,
    "force_unlocked": lock_force_unlocked,
    "leader_elected": leader_elected,
    "leader_revoked": leader_revoked,
    "held_long": lock_held_long,
    "backend_unavailable": lock_backend_unavailable,
}

_user: contextvars.ContextVar[Any] = contextvars.ContextVar("django_rlock_force_user", default=None)


@contextlib.contextmanager
def force_unlocked_by(user: Any) -> Iterator[None]:
    """Force-unlocks inside this block are reported with ``user`` (the admin's request user)."""
    token = _user.set(user)
    try:
        yield
    finally:
        _user.reset(token)


def forward(event: str, data: dict[str, Any]) -> None:
    """The engine listener (installed by the app's ``ready()``): one event -> one signal."""
    signal = _SIGNALS.get(event)
    # Django's own fast path (Signal.send): a list truth test, where has_listeners() takes the
    # signal's lock and walks its receivers on every acquire and release of every lock.
    if signal is None or not signal.receivers:
        return
    if event == "force_unlocked":
        data = {**data, "user": _user.get()}
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        previous = _last.get(loop)
        # An asyncio lock, on its event loop: send_robust would run the async receivers
        # through async_to_sync, which refuses to run there; asend_robust in a task runs
        # them on this loop (and the sync ones in a thread) right after.
        # Chained: each send waits for the previous one on this loop, so receivers see
        # the events in order (acquired before released) whatever the thread pool does;
        # a signal with sync receivers only queues too while such a send is under way.
        if _has_async_receiver(signal) or (previous is not None and not previous.done()):
            task = loop.create_task(_asend(signal, event, data, previous))
            _last[loop] = task
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)
            return
    _log_failures(event, signal.send_robust(sender=None, **data))


#: Sends under way on event loops: a task only weakly referenced by its loop could be collected.
_tasks: set[asyncio.Task[None]] = set()


def _has_async_receiver(signal: Signal) -> bool:
    # Signal.receivers holds (lookup key, receiver, is_async) since Django 5.0; another layout
    # reads as "none", which leaves send_robust (async receivers fail, logged, from a loop).
    return any(len(entry) > 2 and entry[2] is True for entry in signal.receivers)


#: The last send started on each loop (the next one waits for it).
_last: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary())


async def _asend(signal: Signal, event: str, data: dict[str, Any],
                 previous: asyncio.Task[None] | None) -> None:
    if previous is not None and not previous.done():
        await asyncio.wait([previous])
    _log_failures(event, await signal.asend_robust(sender=None, **data))


def _log_failures(event: str, results: Iterable[tuple[Any, Any]]) -> None:
    for receiver, result in results:
        if isinstance(result, Exception):
            logger.error("django-rlock: receiver %r of %s failed: %r", receiver,
                         event if event.startswith("leader_") else f"lock_{event}", result,
                         exc_info=result)
