"""A hold turned into a plain lease: ``release_as_lease`` (``@locked(hold_at_least=...)``,
ShedLock's lockAtLeastFor), shared by the sync and asyncio locks.

The owner's field is replaced by a lease field (``<process uuid>~lease:<serial>``, with the
kind's suffix: ``:write``), so nobody can re-enter, release or renew it (not even the same
thread: its next acquire finds the lock held), and the key's TTL is set to the rest of the
window; the key then expires on the server's clock whatever any host's clock says. Waiters
parked on a longer TTL are woken to read the new one (on the lock's channel: a fair lock's
queued waiters, each on a channel of its own, are not, and look again at the TTL they read,
at most ``watchdog_timeout`` later).
"""

from __future__ import annotations

import math
import time
from typing import Any

from . import events
from .base import check_seconds
from .errors import LockNotOwnedError
from .lua import Script, source
from .naming import UNLOCK_MESSAGE

LEASE_OUT_SCRIPT = Script(source("lease_out"))

#: What the owner id's process part gets in a lease's field.
LEASE_MARK = "~lease"


def lease_field(field: str, owner: str) -> str:
    """The lease's hash field for an owner's ``field`` (which starts with ``owner``)."""
    process, _, serial = owner.rpartition(":")
    return f"{process}{LEASE_MARK}:{serial}{field[len(owner):]}"


def message_of(lock: Any) -> str:
    """What a release of ``lock``'s kind publishes (a read-write lock's ``_MESSAGE``, else
    Redisson's ``0``): the lease's wake-up says the same to its waiters."""
    return str(getattr(type(lock), "_MESSAGE", UNLOCK_MESSAGE))


def lease_ms(seconds: Any, name: str) -> int:
    """The lease in ms (0: release now); TypeError/ValueError naming the lock."""
    s = check_seconds(seconds, "seconds", name, zero_ok=True)
    return 0 if s <= 0 else max(1, math.ceil(s * 1000))


def booked(wd: Any, k: Any, hold: Any, r: Any, name: str, key: str, label: str | None) -> bool:
    """Book the script's reply: the hold is over (True: the lock is a lease now), or one
    reentrant level of it is (False); not held: ``LockNotOwnedError``."""
    if r is None:
        wd.forget(k)
        raise LockNotOwnedError(
            f"cannot release {name!r} as a lease: it is not held by this owner ({k[2]}); its "
            f"lease expired, or it was lost or force-unlocked", name)
    leased = int(r) == 1
    wd.released(k, hold, fully=leased)
    if leased and events.listeners:
        since = hold.since if hold is not None else time.monotonic()
        events.emit("released", name=name, key=key, label=label, owner=k[2],
                    held=time.monotonic() - since, reason="lease")
    return leased
