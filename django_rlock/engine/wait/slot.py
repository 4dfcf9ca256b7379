"""A waiter's place in its channel's queue for the length of one wait.

The wait loop (``loop``) asks its slot before each attempt, books each attempt's outcome in it,
parks on it, and leaves it. A waiter decides anything (return, attempt, leave) only under its
server's lock, and never while a hand-off to it is in flight: it sees either ``RESERVED``
(and waits for the outcome) or the settled state (invariant 5).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .channel import Channel, Channels
from .handoff import HandOffs
from .waiter import State, Waiter


class Slot:
    """A waiter's place in a channel's queue for the length of one wait."""

    __slots__ = ("channels", "channel", "handoffs", "waiter")

    def __init__(self, channels: Channels, channel: Channel, handoffs: HandOffs,
                 waiter: Waiter) -> None:
        self.channels = channels
        self.channel = channel
        self.handoffs = handoffs
        self.waiter = waiter

    def _settled(self, then: Callable[[], Any]) -> Any:
        """Wait out a hand-off to us that is in flight (its outcome comes within one round
        trip; or the listener detaches us after ``HANDOFF_TIMEOUT``, invariant 12), then run
        ``then`` under the lock."""
        w = self.waiter
        while True:
            with self.channels.lock:
                if w.state is not State.RESERVED:
                    return then()
            w.park(None)

    async def _asettled(self, then: Callable[[], Any], abandon_on_cancel: bool = False) -> Any:
        """``_settled`` for an asyncio waiter. ``abandon_on_cancel``: if cancelled meanwhile,
        leave the hand-off to the releasing thread to undo (invariant 7)."""
        w = self.waiter
        while True:
            with self.channels.lock:
                if w.state is not State.RESERVED:
                    return then()
            try:
                await w.apark(None)
            except BaseException:
                if not abandon_on_cancel:
                    raise
                with self.channels.lock:
                    if w.state is not State.RESERVED:
                        return then()
                    w.move(State.ABANDONED)
                    then()
                    raise

    def park(self, timeout: float | None) -> bool:
        """Sleep until woken or ``timeout``; True if the lock was handed or granted to us."""
        self.waiter.park(timeout)
        return bool(self._settled(self._is_granted))

    async def apark(self, timeout: float | None) -> bool:
        """``park`` for an asyncio waiter."""
        await self.waiter.apark(timeout)
        return bool(await self._asettled(self._is_granted))

    def _is_granted(self) -> bool:
        return self.waiter.state is State.GRANTED

    @property
    def granted(self) -> bool:
        return self.waiter.state is State.GRANTED

    @property
    def confirmed(self) -> threading.Event:
        """Set once the channel's subscription is confirmed by Redis."""
        return self.channel.confirmed

    def begin_attempt(self) -> bool:
        """Call before sending an acquire. True: a hand-off already gave us the lock, send
        nothing (a reentrant acquire on top would count it twice, invariant 2)."""
        return bool(self._settled(self._begin_locked))

    async def abegin_attempt(self) -> bool:
        """``begin_attempt`` for an asyncio waiter."""
        return bool(await self._asettled(self._begin_locked))

    def _begin_locked(self) -> bool:
        w = self.waiter
        if w.state is State.GRANTED:
            return True
        if w.state is State.QUEUED:
            w.move(State.ATTEMPTING)  # no hand-off to us while our acquire is in flight
        w.seen = self.channel.messages
        if w.token is not None:
            # In line in Redis from the moment the attempt is sent, even if we never hear
            # (invariant 20).
            w.registered = True
        return False

    def claim(self, since: float | None = None) -> bool:
        """A claim attempt (sent at ``since``) found the lock granted to us
        (``scripts.CLAIMED``): book it unless the grant's message already did (invariant 22).
        Always True: we hold it."""
        with self.channels.lock:
            w = self.waiter
            if w.state is not State.GRANTED:
                self.handoffs.take_grant(self.channel, w, None, since)
            return True

    def ungrant(self) -> None:
        """A grant booked for us was found gone in Redis (it ran out while we could not run,
        invariant 31): we never held it. Back to the head of the line, as a waiter whose
        entry is gone (its next attempt registers it again)."""
        with self.channels.lock:
            w = self.waiter
            w.registered = False
            w.move(State.QUEUED)
            self.channel.queue.appendleft(w)

    def attempted(self, acquired: bool, ttl_ms: int | None = None) -> bool:
        """Record the outcome of an attempt. True means: retry again now, do not park."""
        ch, w = self.channel, self.waiter
        with self.channels.lock:
            if w.state is State.GRANTED:
                return False  # granted while the attempt was in flight: the park returns at once
            if w.token is not None:
                w.registered = not acquired  # a failed attempt with a token registers it
            if ttl_ms is not None and ttl_ms >= 0:
                ch.expires_hint = time.monotonic() + ttl_ms / 1000.0
            if not acquired and ch.wakes is not None and ch.messages != w.seen:
                # A multi-wake kind: a message came while this attempt was in flight (it may
                # have read the state before the change the message announces): retry now.
                # Woken or still queued, it keeps its place (invariant 18).
                if w.state is State.ATTEMPTING:
                    w.move(State.QUEUED)
                return True
            return ch.attempted(w, acquired)

    def leave(self) -> bool:
        """Leave the queue. True if a hand-off gave us the lock: the caller owns it now and
        must give it back itself, before it acquires anything again (invariant 7)."""
        return bool(self._settled(self._leave_locked))

    async def aleave(self) -> bool:
        """``leave`` for an asyncio waiter."""
        return bool(await self._asettled(self._leave_locked, abandon_on_cancel=True))

    @property
    def registered(self) -> bool:
        """After ``leave``: an entry of ours may still be in the hand-off queue in Redis (or a
        grant to us be under way there), so a waiter that gives up must withdraw it
        (invariant 24)."""
        return self.waiter.registered

    def _leave_locked(self) -> bool:
        w = self.waiter
        granted = w.state is State.GRANTED
        # Its wait is over: a releasing thread that waits for this heir to run goes on now,
        # not earlier (woken sooner, it would take a core, even the heir's, for nothing).
        self.handoffs.took_over(w)
        self.handoffs.forget(w)
        self.channel.leave(w)
        return granted
