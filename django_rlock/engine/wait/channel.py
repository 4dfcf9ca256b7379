"""The waiters of one lock channel in this process, and how a message wakes them.

Waiters never poll. Each parks (a ``threading.Lock``, an ``asyncio.Event``, or its thread's
wake line); a message wakes as many waiters of the channel as it is worth (FIFO), which retry.
Every wake-up is accounted for (invariant 3): ``queue`` holds the parked or about-to-attempt
waiters, ``active`` counts the woken or reserved ones whose outcome is unknown, ``pending``
folds a wake that came while one was active into that waiter's retry, and ``echoes`` counts
our own releases' messages still to come back (not wake-ups).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from .waiter import State, Waiter

#: Message payload -> how many waiters it wakes (-1: all of them).
WakePolicy = Callable[[Any], int]


def wake_all(_data: Any) -> int:
    return -1


def wake_count(data: Any) -> int:
    """Semaphore messages carry the permits now available: wake that many waiters (at least
    one, since a waiter may want fewer than a permit's worth of change shows)."""
    try:
        return max(1, int(data))
    except (TypeError, ValueError):
        return -1


class Channel:
    """The waiters of one lock channel in this process (invariants 3, 18)."""

    __slots__ = ("name", "queue", "active", "pending", "refs", "want", "confirmed",
                 "idle_since", "expires_hint", "echoes", "confirm_futures", "wakes",
                 "messages", "grant", "grant_want", "grant_watch", "direct", "direct_want")

    def __init__(self, name: bytes, wakes: WakePolicy | None = None) -> None:
        self.name = name
        #: The grant channel, subscribed beside ``name`` once a waiter that can be granted the
        #: lock by another process joins (``naming.grant_channel``), and its confirmation.
        self.grant: bytes | None = None
        self.grant_want = 0
        #: This process's own grant channel for the lock (``naming.process_grant_channel``),
        #: subscribed with ``grant``: grants to our asyncio waiters come here alone
        #: (invariant 44).
        self.direct: bytes | None = None
        self.direct_want = 0
        #: When a grant to another process's waiter should have been followed by a message
        #: (its release) if that waiter is alive: past it, one waiter here re-checks
        #: (invariant 23).
        self.grant_watch = 0.0
        #: How many waiters a message wakes (None: one, the lock's rule, with echoes and
        #: hand-off). A kind whose message means more (a write unlock, new permits, a latch
        #: at zero) says so here; its waiters retry and re-park like any other (invariant 18).
        self.wakes = wakes
        self.messages = 0  # messages seen (a multi-wake waiter retries if one came mid-attempt)
        self.queue: collections.deque[Waiter] = collections.deque()
        self.active = 0            # SIGNALED or RESERVED waiters
        self.pending = False       # a wake arrived while one was active
        self.refs = 0              # waiters that joined (keeps the subscription)
        self.want = 0              # the SUBSCRIBE confirmation that covers us
        self.confirmed = threading.Event()
        self.idle_since = 0.0
        self.expires_hint = 0.0    # monotonic time the holder's lease was last seen to end
        self.echoes = 0            # our own unlock messages still to come back: not wake-ups
        self.confirm_futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def set_confirmed(self) -> None:
        self.confirmed.set()
        for loop, fut in self.confirm_futures:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed
                pass
        self.confirm_futures.clear()

    def busy(self) -> bool:
        return bool(self.queue) or self.active > 0

    # -- waking (all under the server's lock) ------------------------------------------------
    def signal(self, w: Waiter) -> bool:
        """Count ``w`` (out of the queue) as active and wake it for a retry; False (and not
        counted) if it is gone."""
        self.active += 1
        if w.signal():
            return True
        self.active -= 1
        return False

    def unecho(self) -> None:
        """Under the lock: a release counted in ``echoes`` published nothing. If a message
        already used up its credit, that message was someone else's wake-up: pass it on
        (invariant 3)."""
        if self.echoes > 0:
            self.echoes -= 1
        else:
            self.wake_one()

    def wake_one(self) -> None:
        if self.active > 0:
            self.pending = True
            return
        while self.queue:
            if self.signal(self.queue.popleft()):
                return
            # (a waiter whose event loop is gone: try the next)

    def wake_all(self) -> None:
        while self.queue:
            self.signal(self.queue.popleft())

    def wake_message(self, data: Any) -> None:
        """A message arrived on this channel: wake as many waiters as it is worth."""
        self.messages += 1
        n = 1 if self.wakes is None else self.wakes(data)
        if n < 0:
            self.wake_all()
        elif n == 1 and self.wakes is None:
            self.wake_one()
        else:
            # Waiters of a multi-wake kind want different things (permits, modes): each woken
            # one retries; none is folded into another's retry.
            while n > 0 and self.queue:
                if self.signal(self.queue.popleft()):
                    n -= 1

    def heard(self, data: Any) -> None:
        """The subscription read a message on this channel."""
        self.grant_watch = 0.0
        if self.echoes > 0:
            self.echoes -= 1  # our own release: its waiters were woken directly (invariant 3)
        else:
            self.wake_message(data)

    # -- a waiter's place (all under the server's lock) ----------------------------------------
    def join(self, w: Waiter) -> None:
        self.refs += 1
        self.queue.append(w)

    def take_out(self, w: Waiter) -> None:
        """``w`` stops waiting here (granted): out of ``active`` or out of the queue."""
        if w.state is State.SIGNALED:
            self.active -= 1
        else:
            self.discard(w)

    def discard(self, w: Waiter) -> None:
        try:
            self.queue.remove(w)
        except ValueError:
            pass

    def attempted(self, w: Waiter, acquired: bool) -> bool:
        """Book the outcome of ``w``'s attempt (ATTEMPTING or SIGNALED). True: retry now."""
        if w.state is State.SIGNALED:
            self.active -= 1
            if acquired:
                self.pending = False
                w.move(State.ACQUIRED)
                return False
            if self.pending:
                # A wake came while this retry was in flight: this waiter retries once more
                # instead of a second one failing (invariant 3).
                self.pending = False
                self.active += 1
                return True
            self.queue.appendleft(w)  # it was first in line; it stays first (invariant 18)
            w.move(State.QUEUED)
            return False
        if acquired:
            self.pending = False
            self.discard(w)
            w.move(State.ACQUIRED)
        else:
            w.move(State.QUEUED)
        return False

    def leave(self, w: Waiter) -> None:
        """``w`` leaves the wait (whatever it got); a wake it was given is passed on."""
        if w.state is State.ABANDONED:
            # Gone with a hand-off in flight: the releasing thread settles it (invariant 7).
            self.discard(w)
        elif w.state is State.SIGNALED:
            # Woken but leaving (budget spent, interrupted): hand the wake on.
            self.active -= 1
            w.move(State.LEFT)
            self.wake_one()
        else:
            granted = w.state is State.GRANTED
            if not granted:  # (a granted waiter is out of the queue already)
                self.discard(w)
            w.move(State.LEFT)
            if not granted and w.token is not None and self.queue:
                # Its turn may have been the next grant: one waiter of ours that may not be
                # registered yet (it parked first) takes its place in line.
                self.wake_one()
        self.refs -= 1
        if self.refs == 0:
            self.idle_since = time.monotonic()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Channels:
    """One server's lock channels in this process, and the lock under which they, their
    waiters, and every hand-off are changed (invariant 5). Shared by the subscription, the
    hand-off bookkeeping and the waiters' slots of that server."""

    __slots__ = ("lock", "by_name", "by_grant")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_name: dict[bytes, Channel] = {}
        #: Grant channel -> its lock channel.
        self.by_grant: dict[bytes, Channel] = {}

    def get(self, name: bytes) -> Channel | None:
        return self.by_name.get(name)
