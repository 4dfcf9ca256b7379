"""What a final release settles: the hand-off to a waiter of this process, the grant to a
registered waiter of any process, the echo of our own message, and the polite pause after
waking other processes (invariants 3, 5, 7, 21, 22). ``Releasing`` is a part of
``base.LockBase`` (which provides the attributes it reads: ``_HANDOFF``, ``_sync_client``,
``_channel``, ``_release_args``, the lock's names); ``Release`` is one release's plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import events, identity, withdrawals
from .errors import LockNotOwnedError
from .wait import manager as pubsub
from .watchdog import watchdog

#: After a release that woke waiters in *other* processes, this process lets them have the
#: first go for this long (seconds) instead of re-grabbing at once: a loop of lock/unlock in
#: one process would otherwise starve every other process.
YIELD_WINDOW = 0.005

#: (server, key) -> until when this process lets others have the first go (``be_polite``).
yield_until: dict[tuple[Any, str], float] = {}

HoldKey = tuple[Any, str, str]


class Releasing:
    """The release bookkeeping of a lock (see the module's docstring)."""

    _HANDOFF: bool
    _sync_client: Any
    _channel: bytes
    _server: Any
    _watchdog_ms: int
    key: str
    name: str
    label: str | None
    _release_args: Callable[[str, int], tuple[Any, ...]]  # LockBase's

    # -- release bookkeeping --------------------------------------------------------------
    def _release_plan(self, k: HoldKey) -> Release:
        wd = watchdog()
        hold = wd.get(k)
        # A partial release sets the lease in force again: never past the hold's max_hold.
        plan = Release(k, hold, hold.cap(hold.lease_ms) if hold is not None
                       else self._watchdog_ms)
        if self._HANDOFF and (hold is None or hold.count <= 1):
            # The final release: maybe hand off, maybe publish.
            plan.mgr = pubsub.existing_manager(self._sync_client)
            if plan.mgr is not None:
                plan.heir, plan.echo = plan.mgr.reserve_echo(self._channel, self.key)
        args: tuple[Any, ...] = self._release_args(k[2], plan.lease_ms)
        heir = plan.heir
        if heir is not None:
            args += (heir.owner, heir.lease_ms, 1, heir.info)
        if self._HANDOFF:
            if heir is None:
                args += ("", 0, 0, "")
            args += ("", identity.process_id())
            if (heir is not None and heir.aio and heir.token is not None
                    and heir.handoff is not None):
                # If the release grants the lock to someone in line, it puts the heir (an
                # asyncio task's wait) in line too: its own attempt would have, one round trip
                # later (invariant 44). A thread's heir still attempts itself: measured, the
                # threads' hand-off (bench B, 4 x 2) was no faster for it.
                args += (heir.token, *heir.handoff.register_args())
        plan.args = args
        return plan

    def _release_failed(self, plan: Release) -> None:
        watchdog().released(plan.k, plan.hold, fully=False)
        self._settle(plan, None)
        if self._HANDOFF and (plan.hold is None or plan.hold.count <= 0):
            # The outcome is unknown: it may have granted the lock to a waiter of ours, without
            # a message (the reply was to say so). One of them asks (a claim finds out).
            mgr = pubsub.existing_manager(self._sync_client)
            if mgr is not None:
                mgr.wake(self._channel)

    def _release_done(self, plan: Release, r: Any) -> pubsub.Waiter | None:
        """Book a release reply; returns a waiter to release on behalf of, if any."""
        wd = watchdog()
        if r is None:
            wd.forget(plan.k)
            wd.forget_lost(plan.k)
            self._settle(plan, None)
            raise LockNotOwnedError(
                f"cannot unlock {self.name!r}: it is not held by this owner ({plan.k[2]}); it was "
                f"never acquired, its lease expired, or it was lost or force-unlocked", self.name)
        if isinstance(r, list):  # granted, and our heir put in line (invariant 44)
            r, plan.registered = r[0], True
        if isinstance(r, (bytes, str)):  # granted to a registered waiter
            wd.released(plan.k, plan.hold, fully=True)
            if events.listeners:
                since = plan.hold.since if plan.hold is not None else time.monotonic()
                events.emit("released", name=self.name, key=self.key, label=self.label,
                            owner=plan.k[2], held=time.monotonic() - since, reason="unlock")
            return self._settle(plan, r)
        r = int(r)
        wd.released(plan.k, plan.hold, fully=r != 0)
        if r != 0 and events.listeners:
            since = plan.hold.since if plan.hold is not None else time.monotonic()
            events.emit("released", name=self.name, key=self.key, label=self.label,
                        owner=plan.k[2], held=time.monotonic() - since, reason="unlock")
        return self._settle(plan, r)

    def _orphaned_entry(self, token: bytes, until: float | None) -> None:
        """Our release put a heir in line that left meanwhile: its entry comes out (on the
        withdrawals thread), or the line would grant the lock to a wait that is over."""
        withdrawals.later(self._sync_client, self._release_keys[4], token.decode(), until,
                          at_once=True)

    def _handed_over(self, plan: Release) -> None:
        """The end of a sync release: if it handed the lock to a waiting thread of ours, block
        until that heir runs (at most ``HANDOVER_WAIT``), so the lock's next holder is not kept
        waiting for the interpreter by this thread's own work after ``unlock()``."""
        if plan.handed is not None and plan.mgr is not None:
            plan.mgr.hand_over(plan.handed)

    def _settle(self, plan: Release, r: int | bytes | str | None) -> pubsub.Waiter | None:
        """Tell the pub/sub side what the release did: hand-off, grant, publish, or nothing."""
        token = r if isinstance(r, (bytes, str)) else None
        published = token is None and r is not None and r > 0 and self._HANDOFF  # type: ignore[operator]
        mgr, heir = plan.mgr, plan.heir
        orphan = None
        # An echo counted for a message that never went out: its credit back. With a heir to
        # settle and no grant to book first, in the same visit under the lock.
        unecho = plan.echo and not published
        if mgr is not None:
            try:
                if unecho and (heir is None or token is not None):
                    mgr.cancel_echo(self._channel)
                    unecho = False
                if token is not None:
                    # Granted to a registered waiter: if it is one of ours, it owns the lock
                    # now (its grant message, when it comes, finds it served).
                    plan.handed = mgr.granted(self._channel, token, plan.sent, True)
            finally:
                # Always settled, or the heir would wait for the outcome forever. An unknown
                # outcome (r None) is "not granted": the heir's own claim finds out. Not
                # granted because a registered waiter came first: the heir retries, and so
                # takes its place in line.
                if heir is not None and not mgr.resolve(self._channel, heir, r == -1,
                                                        plan.sent, plan.registered,
                                                        self._orphaned_entry, unecho):
                    orphan = heir  # it left before the hand-off settled: release for it
                if heir is not None and r == -1 and orphan is None:
                    plan.handed = heir
        if published:
            receivers = r - 1
            if mgr is None:
                mgr = pubsub.existing_manager(self._sync_client)
            if mgr is not None:
                if mgr.subscribed(self._channel):
                    receivers -= 1  # our own subscription got the message too
                mgr.wake(self._channel)
            if receivers > 0:
                be_polite(self._server, self.key)
        return orphan


class Release:
    __slots__ = ("k", "hold", "lease_ms", "mgr", "heir", "echo", "args", "sent", "handed",
                 "registered")

    @property
    def final(self) -> bool:
        """The hold's last local count: whatever the reply (deleted, still held, not ours, or
        none: invariant 1), the hold is dropped; ``drop`` may do it before the reply."""
        return self.hold is not None and self.hold.count <= 1

    def drop(self) -> None:
        """Drop a final hold (``final``); booking the reply later finds it gone and does not
        count it twice (``Watchdog.released`` checks the hold's identity)."""
        watchdog().released(self.k, self.hold, fully=True)

    def __init__(self, k: HoldKey, hold: Any, lease_ms: int) -> None:
        self.k = k
        self.hold = hold
        self.lease_ms = lease_ms
        self.mgr: pubsub.PubSubManager | None = None
        self.heir: pubsub.Waiter | None = None
        self.echo = False
        self.args: tuple[Any, ...] = ()
        self.sent: float | None = None  # when the release went out (a heir's lease starts later)
        #: The waiter of ours it gave the lock to (``heir``, or a registered one granted by
        #: token): ``_handed_over`` lets it run first.
        self.handed: pubsub.Waiter | None = None
        #: The release put ``heir`` in line (it granted the lock to someone else).
        self.registered = False


def be_polite(server: Any, key: str) -> None:
    if len(yield_until) > 1024:
        now = time.monotonic()
        for stale, t in list(yield_until.items()):  # other threads insert and pop meanwhile
            if t <= now:
                yield_until.pop(stale, None)
    yield_until[(server, key)] = time.monotonic() + YIELD_WINDOW
