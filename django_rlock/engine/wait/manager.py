"""The waiting side of one server, as the lock kinds see it: ``manager(client)``.

A ``PubSubManager`` puts together the server's channels and their lock (``Channels``), its
hand-off bookkeeping (``HandOffs``) and its subscription (``Subscription``). Waiters join
through ``enter`` (the wait loop does that); releasing threads ``reserve`` and ``resolve`` a
hand-off, report grants (``granted``) and echoes, and wake local waiters.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .. import process
from ..watchdog import server_id
from .channel import Channel, Channels, WakePolicy
from .handoff import HandOffs
from .slot import Slot
from .subscription import Subscription
from .waiter import HandOff, Waiter


class PubSubManager:
    """The subscription to one server (database) and the waiters of this process on it."""

    def __init__(self, client: Any) -> None:
        self.channels = Channels()
        self.handoffs = HandOffs(self.channels)
        self.subscription = Subscription(client, self.channels, self.handoffs)

    @property
    def reconnects(self) -> int:
        """Reconnections of the subscription so far."""
        return self.subscription.reconnects

    def channel(self, name: bytes) -> Channel | None:
        """The channel ``name`` while this process has (or recently had) waiters on it."""
        return self.channels.get(name)

    # -- joining ---------------------------------------------------------------------------
    def enter(self, channel: bytes, key: str = "", *, wakes: WakePolicy | None = None,
              handoff: HandOff | None = None,
              loop: asyncio.AbstractEventLoop | None = None) -> Slot:
        """Join the channel's queue, subscribing if needed. Pair with ``Slot.leave()``.

        ``wakes``: how many waiters one message on this channel wakes (default: one).
        ``handoff``: what a release needs to hand or grant the lock to this waiter.
        ``loop``: the waiter is an asyncio task of that loop.
        """
        w = Waiter(key, handoff, loop)
        if w.line is not None:
            w.deliver = lambda tok: self.handoffs.granted(channel, tok)
        channels = self.channels
        with channels.lock:
            ch = channels.by_name.get(channel)
            if ch is None:
                ch = channels.by_name[channel] = Channel(channel, wakes)
            elif wakes is not None:
                ch.wakes = wakes
            ch.join(w)
            self.subscription.add(ch, None if handoff is None else handoff.grant)
            if w.token is not None:
                self.handoffs.join(ch, w)  # (granted already if its grant came first)
        return Slot(channels, ch, self.handoffs, w)

    def confirmation(self, slot: Slot,
                     loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """A future resolved when the slot's subscription is confirmed (None: it already is).

        Lets asyncio waiters wait for it on their loop, not on an executor thread each.
        """
        with self.channels.lock:
            ch = slot.channel
            if ch.confirmed.is_set():
                return None
            fut: asyncio.Future[None] = loop.create_future()
            ch.confirm_futures.append((loop, fut))
            return fut

    # -- what releasing and attempting threads ask -------------------------------------------
    def busy(self, channel: bytes) -> bool:
        ch = self.channels.get(channel)
        return ch is not None and ch.busy()

    def subscribed(self, channel: bytes) -> bool:
        ch = self.channels.get(channel)
        return ch is not None and self.subscription.heard(ch)

    def grants_heard(self, channel: bytes) -> bool:
        """A grant on ``channel``'s grant channel published now would reach us."""
        ch = self.channels.get(channel)
        return ch is not None and ch.grant is not None and self.subscription.heard(ch)

    def expires_hint(self, channel: bytes) -> float:
        ch = self.channels.get(channel)
        return ch.expires_hint if ch is not None else 0.0

    def wake(self, channel: bytes, data: Any = b"0") -> None:
        """A release in this process freed the lock: wake a local waiter without waiting
        for the message to come back from Redis."""
        with self.channels.lock:
            ch = self.channels.get(channel)
            if ch is not None:
                ch.wake_message(data)

    def expect_echo(self, channel: bytes) -> bool:
        """A release that may publish is about to be sent: its message is not a wake-up
        (invariant 3)."""
        with self.channels.lock:
            ch = self.channels.get(channel)
            if ch is None or not self.subscription.heard(ch):
                return False
            ch.echoes += 1
            return True

    def cancel_echo(self, channel: bytes) -> None:
        """The release published nothing. If a message already used up its credit, that
        message was someone else's wake-up: pass it on (invariant 3)."""
        with self.channels.lock:
            ch = self.channels.get(channel)
            if ch is not None:
                ch.unecho()

    # -- hand-off (``handoff``) ----------------------------------------------------------
    def reserve(self, channel: bytes, key: str) -> Waiter | None:
        """Pick this process's first waiter for a direct hand-off (invariant 5)."""
        return self.handoffs.reserve(channel, key, self.subscription.heard)

    def reserve_echo(self, channel: bytes, key: str) -> tuple[Waiter | None, bool]:
        """``reserve`` and ``expect_echo`` in one visit under the lock (a final release)."""
        return self.handoffs.reserve_echo(channel, key, self.subscription.heard)

    def resolve(self, channel: bytes, w: Waiter, granted: bool,
                since: float | None = None, registered: bool = False,
                orphaned: Callable[[bytes, float | None], Any] | None = None,
                unecho: bool = False) -> bool:
        """Settle a reservation; False: the heir left meanwhile, release for it.
        ``registered``: the release put the heir in line instead; ``unecho``: take back the
        release's echo credit in the same visit (``HandOffs.resolve``)."""
        return self.handoffs.resolve(channel, w, granted, since, registered, orphaned, unecho)

    def hand_over(self, heir: Waiter) -> None:
        """A sync release handed the lock to ``heir``: let it run first (bounded)."""
        self.handoffs.hand_over(heir)

    def granted(self, channel: bytes, token: Any, since: float | None = None,
                by_release: bool = False) -> Waiter | None:
        """A release granted the lock to ``token`` (invariant 22); ``by_release``: our own
        release's reply (returns the waiter of ours it went to, for ``hand_over``)."""
        return self.handoffs.granted(channel, token, since, by_release)


# -- per-process state: one manager per server, reset in a forked child ---------------------
class _Managers:
    __slots__ = ("by_server", "lock")

    def __init__(self) -> None:
        self.by_server: dict[tuple[Any, ...], PubSubManager] = {}
        self.lock = threading.Lock()


def _forked(old: _Managers) -> None:
    # The parent's subscription sockets, inherited: the child closes its copies (a server
    # counts a subscriber while any process keeps its socket open, so a dead parent's waiters
    # would still look alive to the release script: invariants 25, 44).
    for mgr in old.by_server.values():
        mgr.subscription.abandon()


#: This process's managers (none in a forked child: the parent's listener threads do not exist
#: there, and their sockets are the parent's).
_state = process.local(_Managers, _forked)


def manager(client: Any) -> PubSubManager:
    """The manager of ``client``'s server, created on first use. Per database: the channel
    names a key but not its database, so a queue shared by two databases could hand one
    database's lock to a waiter for the other's (invariant 5)."""
    sid = server_id(client)
    managers = _state()
    mgr = managers.by_server.get(sid)
    if mgr is None:
        with managers.lock:
            mgr = managers.by_server.get(sid)
            if mgr is None:
                mgr = managers.by_server[sid] = PubSubManager(client)
    return mgr


def existing_manager(client: Any) -> PubSubManager | None:
    return _state().by_server.get(server_id(client))
