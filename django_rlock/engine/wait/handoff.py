"""This process's hand-offs on one server: the lock passed to a waiter without its asking.

Two ways in. A releasing thread of this process *reserves* its first local waiter, sends the
release with that waiter as heir, and *resolves* the reservation with the reply (invariant 5).
A release anywhere *grants* the lock to the first live token in the lock's line in Redis; the
grant reaches us as the release's reply, a message on the grant channel or the heir's wake
line, or a claim attempt that finds the lock set to us, and is taken once whichever comes first
(invariants 21, 22, 25). Every change here is made under the server's lock (``Channels.lock``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import identity
from . import settings
from .channel import Channel, Channels
from .waiter import State, Waiter

logger = logging.getLogger("django_rlock")


class HandOffs:
    """Reservations, grants by token, early grants and the grant watch of one server."""

    def __init__(self, channels: Channels) -> None:
        self.channels = channels
        #: Heirs of our own releases in flight: channel, and since when (``detach_overdue``).
        self._reserved: dict[Waiter, tuple[bytes, float]] = {}
        #: Heirs detached meanwhile, whose reservation is still to be resolved.
        self._detached: set[Waiter] = set()
        #: Waiters that can be granted the lock by any process's release, by token.
        self._tokens: dict[bytes, Waiter] = {}
        #: Grants to a token of this process whose waiter has not joined yet (its first,
        #: registering attempt raced the release): since when (kept ``EARLY_KEEP``).
        self._early: dict[bytes, float] = {}
        self._token_prefix = identity.process_id().encode()
        #: The earliest ``grant_watch`` of any channel (0: none): the listener wakes for it.
        self.next_watch = 0.0
        #: Heirs granted by a releasing thread of ours that have not run yet: the lock that
        #: thread blocks on until they do (``hand_over``, ``took_over``).
        self._acks: dict[Waiter, threading.Lock] = {}
        #: Reserved heirs granted by token before their reservation was resolved (our release
        #: put them in line and another process's release granted them at once, invariant
        #: 43): ``resolve`` books the grant.
        self._raced: dict[Waiter, float | None] = {}

    # -- our own releases (invariant 5) ---------------------------------------------------
    def reserve(self, channel: bytes, key: str,
                heard: Callable[[Channel], bool]) -> Waiter | None:
        """Pick this process's first waiter for a direct hand-off by a releasing thread. Only
        when ``heard(channel)`` (the subscription is up and confirmed), so the release script's
        NUMSUB counts us and can tell whether any *other* process waits (then there is no
        hand-off)."""
        with self.channels.lock:
            ch = self.channels.get(channel)
            if ch is None or not heard(ch):
                return None
            return self._reserve(ch, key)

    def reserve_echo(self, channel: bytes, key: str,
                     heard: Callable[[Channel], bool]) -> tuple[Waiter | None, bool]:
        """``reserve``, and count the release's message as an echo to come (invariant 3,
        ``PubSubManager.expect_echo``), in one visit under the lock: a final release's only
        one before its send. Returns (heir or None, whether an echo was counted)."""
        with self.channels.lock:
            ch = self.channels.get(channel)
            if ch is None or not heard(ch):
                return None, False
            ch.echoes += 1
            return self._reserve(ch, key), True

    def _reserve(self, ch: Channel, key: str) -> Waiter | None:
        """Under the lock, ``ch`` heard: its first waiter, reserved, if it may be handed the lock."""
        if not ch.queue or ch.active:
            return None
        w = ch.queue[0]
        # Not while its own acquire is in flight (invariant 2); not for another key of the
        # channel ({K} and K share it); not for a waiter of another kind (no owner: e.g. a
        # FencedLock, whose acquire must run its own script, invariant 17); not for one in
        # the hand-off queue in Redis (registered: the release script finds it in its turn).
        if (w.state is not State.QUEUED or w.key != key or not w.owner or w.registered):
            return None
        ch.queue.popleft()
        ch.active += 1
        w.move(State.RESERVED)
        self._reserved[w] = (ch.name, time.monotonic())
        return w

    def detach_overdue(self, now: float) -> None:
        """Under the lock (housekeeping): a hand-off whose outcome has not come within
        ``HANDOFF_TIMEOUT`` (the releasing thread's round trip hangs) stops holding its heir:
        the heir goes back to the head of the queue and is woken to carry on by itself
        (invariant 12)."""
        if not self._reserved:
            return
        for w, (channel, since) in list(self._reserved.items()):
            if now - since < settings.HANDOFF_TIMEOUT:
                continue
            del self._reserved[w]
            self._detached.add(w)
            ch = self.channels.get(channel)
            if w.state is not State.RESERVED:
                # Abandoned meanwhile: nobody waits for this outcome any more; its wake passes
                # on, and a late grant expires by its lease.
                if ch is not None:
                    ch.active -= 1
                    ch.wake_one()
                continue
            logger.warning("django-rlock: a hand-off of %r is still unsettled after %.1f s (the "
                           "releasing thread's round trip hangs); the waiter carries on by itself",
                           w.key, now - since)
            w.move(State.QUEUED)
            if ch is not None:
                ch.active -= 1
                ch.queue.appendleft(w)
            w.wake()

    def resolve(self, channel: bytes, w: Waiter, granted: bool,
                since: float | None = None, registered: bool = False,
                orphaned: Callable[[bytes, float | None], Any] | None = None,
                unecho: bool = False) -> bool:
        """Settle a reservation. Returns False if the waiter left meanwhile (the caller must
        then release the lock on its behalf). ``since``: when the release was sent.
        ``registered``: the release put the waiter in line in Redis instead (it granted the
        lock to someone else, invariant 44); the waiter stays parked at the head of our queue
        and now withdraws when it gives up. If it is gone, ``orphaned(token, deadline)`` takes
        its entry out. ``unecho``: the release counted an echo and published nothing; its
        credit is taken back first, in the same visit (``PubSubManager.cancel_echo``)."""
        with self.channels.lock:
            ch = self.channels.get(channel)
            if unecho and ch is not None:
                ch.unecho()
            self._reserved.pop(w, None)
            raced = w in self._raced
            raced_since = self._raced.pop(w, None)
            if registered and raced and w.state is State.RESERVED and w not in self._detached \
                    and ch is not None:
                # Put in line by this release and granted by the next one before this reply
                # was booked: it holds the lock.
                ch.active -= 1
                ch.pending = False
                return self.take_grant(ch, w, w.handoff.grant_ms if w.handoff else None,
                                       raced_since)
            if registered and raced and w.state is State.ABANDONED and w not in self._detached:
                # (A detached one was counted out by ``detach_overdue`` already.)
                if ch is not None:
                    ch.active -= 1
                return False  # granted to a waiter that is gone: release on its behalf
            if registered:
                if w.state in (State.ABANDONED, State.LEFT):
                    if orphaned is not None and w.token is not None and w.handoff is not None:
                        orphaned(w.token, w.handoff.deadline)
                else:
                    w.registered = True
            if w in self._detached:
                # It stopped waiting for us: never grant behind its back, never release on its
                # behalf (it may have acquired again as the same owner, invariants 7, 12). If it
                # still waits, its next claim takes the lock; if it left, the lock expires by
                # its lease.
                self._detached.discard(w)
                if granted and ch is not None and w in ch.queue:
                    ch.queue.remove(w)
                    ch.signal(w)
                elif granted:
                    logger.warning("django-rlock: %r was handed to %s after it stopped waiting; "
                                   "it expires within %d ms", w.key, w.owner, w.lease_ms)
                return True
            if w.state is State.ABANDONED:
                if ch is not None:
                    ch.active -= 1
                    if not granted:
                        ch.wake_one()
                return not granted
            if granted:
                if ch is not None:
                    ch.active -= 1
                    ch.pending = False
                if not self._give(w, None, since, True):
                    return False  # its event loop is gone: release on its behalf
            elif registered and ch is not None:
                # In line in Redis now, as its own attempt would have put it: it sleeps on
                # until its grant (or its park's bound), first in our queue as it was.
                ch.active -= 1
                w.move(State.QUEUED)
                ch.queue.appendleft(w)
                if ch.pending:  # a wake came meanwhile: it was this waiter's to use
                    ch.pending = False
                    ch.wake_one()
            elif not w.signal() and ch is not None:
                # Released the ordinary way (or not at all): this waiter was to retry first;
                # it is gone, so the wake passes on.
                ch.active -= 1
                ch.wake_one()
            return True

    def _give(self, w: Waiter, grant_ms: int | None, since: float | None,
              by_release: bool) -> bool:
        """Under the lock: ``w`` owns the lock now. Book its hold (``on_grant``), mark it
        granted and wake it; False (nothing booked) if it is gone (its event loop closed).
        ``by_release``: a releasing thread of ours gave it, and may wait in ``hand_over``.

        The waiter acts only under our lock, so the order within it is free. A thread on a
        wake line is woken last (its wake cannot fail): by the time it runs, the releasing
        thread has done its work and blocks in ``hand_over``, and the heir takes the
        interpreter at once instead of waking a second time for it."""
        if w.line is None and not w.wake():
            return False
        if w.handoff is not None and w.handoff.on_grant is not None:
            # Booked while the waiter cannot yet leave or return.
            w.handoff.on_grant(grant_ms, since)
        w.move(State.GRANTED)
        if by_release and settings.HANDOVER_WAIT > 0:
            ack = threading.Lock()
            ack.acquire()
            self._acks[w] = ack
        if w.line is not None:
            w.wake()
        return True

    def took_over(self, w: Waiter) -> None:
        """Under the lock: ``w`` runs and has seen how its hand-off ended; a releasing thread
        blocked in ``hand_over`` for it goes on."""
        if self._acks:
            ack = self._acks.pop(w, None)
            if ack is not None:
                ack.release()

    def hand_over(self, w: Waiter) -> None:
        """After a sync release handed the lock to ``w`` (not under the lock): block until the
        heir runs, at most ``HANDOVER_WAIT``. Gives the heir the interpreter the moment it
        wakes; without it, the heir waits for the GIL until this thread next blocks (its next
        I/O, or the 5 ms switch interval if it computes), and then wakes a second time."""
        ack = self._acks.get(w)
        if ack is None or ack.acquire(timeout=settings.HANDOVER_WAIT):
            return  # (``took_over`` dropped it: no lock taken here, which the heir may hold)
        with self.channels.lock:
            self._acks.pop(w, None)

    # -- grants from any process's release (invariants 21, 22) ------------------------------
    def join(self, ch: Channel, w: Waiter) -> None:
        """Under the lock: ``w`` (with a token) joined ``ch``; a grant that came first is its."""
        assert w.token is not None
        self._tokens[w.token] = w
        if self._early.pop(w.token, None) is not None:
            self.take_grant(ch, w, w.handoff.grant_ms if w.handoff else None)

    def forget(self, w: Waiter) -> None:
        """Under the lock: ``w`` leaves; a grant message from now on finds nobody."""
        if w.token is not None:
            self._tokens.pop(w.token, None)

    def take_grant(self, ch: Channel, w: Waiter, grant_ms: int | None,
                   since: float | None = None, by_release: bool = False) -> bool:
        """Under the lock: ``w`` was granted the lock in Redis; it owns it from now on. Books
        the hold (``on_grant``) before the waiter can see it. False if the waiter is gone
        (its event loop closed: the grant's short lease ends it). ``since``: the grant was
        made then at the earliest (None: when the wait began, invariant 31). ``by_release``:
        the grant is our own release's reply (``hand_over`` may follow)."""
        ch.take_out(w)
        w.registered = False
        return self._give(w, grant_ms, since, by_release)

    def granted(self, channel: bytes, token: Any, since: float | None = None,
                by_release: bool = False) -> Waiter | None:
        """A release (ours, or another process's, through the grant channel or a wake line)
        granted the lock to ``token``: if the waiter is ours, it owns the lock now, without a
        command. ``since``: our own release's send time (else the grant counts from the wait's
        start, invariant 31). ``by_release``: it is our own release's reply; returns the
        waiter it went to, if this call gave it the lock (for ``hand_over``)."""
        if isinstance(token, str):
            token = token.encode()
        now = time.monotonic()
        with self.channels.lock:
            ch = self.channels.get(channel)
            w = self._tokens.get(token)
            if w is None or ch is None:
                if token.startswith(self._token_prefix):
                    if ch is not None:
                        ch.grant_watch = 0.0
                    self._early[token] = now  # its waiter is about to join
                elif ch is not None:
                    # Another process's waiter: if it died before it could take the lock, its
                    # grant expires unannounced; one of ours re-checks just after that
                    # (invariant 23).
                    self._watch_grant(ch, now)
                return None
            ch.grant_watch = 0.0
            if w.state is State.RESERVED:
                # Our own release's heir, which ``resolve`` settles: that release put it in
                # line and this grant came first (invariant 44).
                self._raced[w] = since
                return None
            if w.state in (State.GRANTED, State.ACQUIRED):
                return None  # taken already
            if self.take_grant(ch, w, w.handoff.grant_ms if w.handoff else None, since,
                               by_release):
                return w
            # Ours, but gone with its event loop: as for a dead heir elsewhere (invariant 23).
            self._watch_grant(ch, now)
            return None

    def _watch_grant(self, ch: Channel, now: float) -> None:
        """Under the lock: a grant went to a waiter that may never take it; its short lease
        then ends unannounced, and one of our waiters on ``ch`` asks just after."""
        ch.grant_watch = now + settings.GRANT_WATCH
        if not self.next_watch or ch.grant_watch < self.next_watch:
            self.next_watch = ch.grant_watch

    def prune_early(self, now: float) -> None:
        """Under the lock (housekeeping): drop early grants nobody came for."""
        if self._early:
            for token, since in list(self._early.items()):
                if now - since >= settings.EARLY_KEEP:
                    del self._early[token]

    def watch(self, now: float) -> None:
        """A grant to another process's waiter was followed by no message for longer than
        its grant lease: the heir may have died, and the lock expired unannounced. One
        waiter per channel here asks (invariant 23)."""
        with self.channels.lock:
            self.next_watch = 0.0
            for ch in self.channels.by_name.values():
                if ch.grant_watch and now >= ch.grant_watch:
                    ch.grant_watch = 0.0
                    ch.wake_one()
                elif ch.grant_watch:
                    self.next_watch = min(self.next_watch or ch.grant_watch, ch.grant_watch)
