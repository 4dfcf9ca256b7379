"""A hold (one key held by one owner of this process) as the watchdog keeps it, how a kind
renews and ends its holds (``HoldKind``), and which Redis database a client is
(``server_id``): the records ``watchdog`` keeps and ``renewal`` schedules.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .scripts import FORCE_UNLOCK_OWNER_SCRIPT, RENEW_SCRIPT, Script

LostCallback = Callable[..., Any]
INF = float("inf")

_server_ids: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def server_id(client: Any) -> tuple[Any, ...]:
    """Identify the Redis database behind a client, so clients sharing one agree on holds.

    Django's built-in RedisCache hands out a new client (and per-thread pools) per call; a
    lock taken through one must be released and renewed through another.
    """
    pool = client.connection_pool
    try:
        return _server_ids[pool]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        return ("pool", id(pool))
    kw = getattr(pool, "connection_kwargs", {})
    ident: tuple[Any, ...] = (
        type(pool).__name__,
        getattr(pool, "service_name", None),
        kw.get("host"),
        kw.get("port"),
        kw.get("path"),
        kw.get("db", 0),
        kw.get("username"),
    )
    _server_ids[pool] = ident
    return ident



class Hold:
    """One key held by one owner of this process."""

    __slots__ = ("client", "server", "key", "name", "owner", "count", "lease_ms", "renew",
                 "period", "due", "lost", "on_lost", "expires_at", "thread", "since", "label",
                 "scripts_keys", "valid_until", "renew_script", "renew_key", "end_script",
                 "end_args", "top_up_ms", "slack", "queued", "ending", "late_at", "deadline",
                 "max_hold", "warn_at", "warn_after", "next_due", "next_slack", "reason")

    def __init__(self, client: Any, server: tuple[Any, ...], key: str, name: str, owner: str) -> None:
        self.client = client
        self.server = server
        self.key = key
        self.name = name
        self.owner = owner
        self.count = 0
        self.lease_ms = 0
        self.renew = False          # watchdog mode: renewed until released
        self.period = 0.0
        self.due = 0.0              # monotonic time of the next renewal (or of forgetting a lease hold)
        self.lost = False
        self.on_lost: LostCallback | None = None
        self.expires_at = 0.0       # lease mode: when the lease we set runs out
        self.thread: threading.Thread | None = None  # the owner thread (None: a task, a mark)
        self.since = time.monotonic()
        self.label: str | None = None
        self.scripts_keys: tuple[Any, ...] = ()  # (key, channel, index) for a release on its behalf
        self.valid_until = 0.0      # monotonic end of the last lease confirmed (acquire, renewal)
        # How a kind renews and ends its holds: the script run per hold (KEYS[i] renew_key,
        # ARGV owner and lease ms), and the one that releases a hold whose owner ended
        # (KEYS scripts_keys, ARGV end_args). The lock's own by default.
        self.renew_script: Script = RENEW_SCRIPT
        self.renew_key = key
        self.end_script: Script = FORCE_UNLOCK_OWNER_SCRIPT
        self.end_args: tuple[Any, ...] = (owner, "0")
        #: A lease hold granted with a shorter lease than its own: the lease (ms) its one
        #: early renewal sets, once due (0: none pending, or sent).
        self.top_up_ms = 0
        #: How early (s) a sweep may renew it, to batch it with others: half a period,
        #: except for a first renewal brought forward by a short grant lease.
        self.slack = 0.0
        self.queued = False         # in its server's renewal queue
        self.ending = False         # its owner thread ended: queued to be released
        #: Sent after this (monotonic), a renewal is late: less than a sixth of the lease in
        #: force is left (set when the sweep takes it).
        self.late_at = float("inf")
        #: ``max_hold`` (s, 0: none) and the monotonic time past which the hold is never
        #: renewed nor any lease of it set (``cap``); ``warn_held_after`` and when its one
        #: warning is due (inf: none, or given). See ``windows``.
        self.max_hold = 0.0
        self.deadline = INF
        self.warn_after = 0.0
        self.warn_at = INF
        #: The next due time and slack of its own (renewal, top-up, forgetting), which its
        #: timeline entry (``due``) may precede for an alarm.
        self.next_due = 0.0
        self.next_slack = 0.0
        self.reason = ""            # why it was lost (``windows.REASONS``)

    def cap(self, ms: int, now: float | None = None) -> int:
        """A lease of ``ms`` set at ``now`` (default: now), cut so it ends by the hold's
        ``max_hold``. Without one: ``ms``, and not even a clock read."""
        if self.deadline == INF:
            return ms
        if now is None:
            now = time.monotonic()
        return max(1, min(ms, int((self.deadline - now) * 1000)))

    def alarm_at(self) -> float:
        """When a window of this hold is due (inf: none)."""
        return min(self.warn_at, self.deadline) if self.renew else self.warn_at


HoldKey = tuple[tuple[Any, ...], str, str]


class HoldKind:
    """How holds of one lock kind are renewed and, when their owner ends, released.

    ``renew_script`` runs batched like RENEW: KEYS are the holds' ``renew_key``, ARGV one
    (owner, lease ms) pair per key, reply one 1/0 per key. ``end_script`` runs with the
    hold's ``scripts_keys`` and ``end_args`` and replies 1 if it released something.
    """

    __slots__ = ("renew_script", "renew_key", "end_script", "end_args")

    def __init__(self, renew_script: Script, renew_key: str, end_script: Script,
                 end_args: tuple[Any, ...]) -> None:
        self.renew_script = renew_script
        self.renew_key = renew_key
        self.end_script = end_script
        self.end_args = end_args
