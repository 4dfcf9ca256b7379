"""Django signals for lock events, forwarded from the engine's listeners (``engine.events``).

Every signal is sent with ``sender=None`` and at least ``name``, ``key`` and ``label`` (the ``@locked``
template or the lock's ``label=``: bounded, unlike names). The other arguments are the
engine event's (see ``django_rlock.engine.events``):

- ``lock_acquired``: ``owner``, ``wait``, ``lease``.
- ``lock_released``: ``owner``, ``held``, ``reason`` (``"unlock"`` or ``"owner ended"``).
- ``lock_lost``: ``owner``, ``held``, ``how``.
- ``lock_busy``: ``ttl``: a ``@locked`` call turned away.
- ``lock_force_unlocked``: ``deleted``, and ``user``: the admin user, or ``None`` (the
  ``locks clear`` command, or code calling ``force_unlock()``).

Receivers run on the thread that caused the event (the watchdog's for ``lock_lost`` and for
releases of ended owners); an exception in one is logged, never raised into the lock.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_rlock")

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_busy = Signal()
lock_force_unlocked = Signal()

_SIGNALS = {
    "acquired": lock_acquired,
    "released": lock_released,
    "lost": lock_lost,
    "busy": lock_busy,
    "force_unlocked": lock_force_unlocked,
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
    if signal is None or not signal.has_listeners():
        return
    if event == "force_unlocked":
        data = {**data, "user": _user.get()}
    for receiver, result in signal.send_robust(sender=None, **data):
        if isinstance(result, Exception):
            logger.error("django-rlock: receiver %r of lock_%s failed: %r", receiver, event,
                         result, exc_info=result)
