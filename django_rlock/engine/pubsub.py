"""One pub/sub subscription per Redis server per process, shared by every waiting thread.

Waiters never poll. Each waiting thread parks on its own ``threading.Lock``; an unlock
message wakes one waiter of that channel (FIFO), which retries the acquire. Waiters join
the queue *before* their first retry, so a message that lands between a failed attempt and
the park is not lost: the park returns at once. While a woken waiter's retry is in flight,
further messages are folded into one "retry again" flag instead of waking more threads
(each would only find the lock taken). After a reconnect every waiter is woken, because
messages may have been missed; and no waiter relies on a message alone: each parks at most
until the holder's PTTL runs out, since expiry publishes nothing.

A subscription outlives its last waiter by ``LINGER`` seconds, so a contended lock does not
pay SUBSCRIBE/UNSUBSCRIBE round trips on every wait.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis.crc import key_slot

from . import identity
from .clients import sharded
from .watchdog import server_id

logger = logging.getLogger("django_rlock")

#: Seconds a subscription is kept after its last waiter leaves.
LINGER = 2.0
#: Longest a waiter waits for the outcome of a hand-off to it (the releasing thread's round
#: trip), give or take the listener's one-second housekeeping tick. Past it, the waiter stops
#: counting on that outcome and carries on as a plain waiter: its next attempt (claim mode)
#: takes the lock if the hand-off landed meanwhile.
HANDOFF_TIMEOUT = 5.0
#: Seconds between housekeeping passes (lingering unsubscribes, a PING on a quiet line).
_HOUSEKEEPING = 1.0
_PING_AFTER = 30.0
_PONG_TIMEOUT = 5.0
#: Longest a grant lease lasts (seconds): a waiter granted the lock by a release holds it for
#: this long (or its own lease, if shorter) until it renews (its watchdog does so early).
GRANT_LEASE = 3.0
#: After a grant to another process's waiter: if no message on the lock's channels follows
#: within this long, the heir may have died unannounced; one waiter here re-checks.
GRANT_WATCH = GRANT_LEASE + 0.1
#: Seconds a grant to a waiter of ours that has not joined its queue yet is kept for it.
_EARLY_KEEP = 10.0


class Waiter:
    """One waiting thread, or one waiting asyncio task (``loop`` given).

    ``signaled``: woken, its retry not yet done. ``reserved``: chosen by a releasing thread
    of this process for a direct hand-off whose outcome is not known yet. ``granted``: the
    hand-off happened; this waiter owns the lock without sending anything. ``detached``: it
    stopped waiting for a hand-off's outcome (``HANDOFF_TIMEOUT``).
    """

    __slots__ = ("_park", "_loop", "_event", "signaled", "reserved", "granted", "abandoned",
                 "attempting", "key", "owner", "lease_ms", "on_grant", "info", "detached",
                 "seen", "token", "registered", "grant_ms", "line", "pending", "deliver")

    def __init__(self, owner: str = "", lease_ms: int = 0,
                 on_grant: Callable[..., Any] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, key: str = "",
                 info: str = "", token: bytes | None = None, registered: bool = False,
                 grant_ms: int = 0, line: Any = None) -> None:
        self._loop = loop
        #: A thread with a wake line of its own (``wakeline``) sleeps on it, not on a lock:
        #: a wake is then ``pending`` plus a poke, and a grant is read and ``deliver``-ed there.
        self.line = line
        self.pending = False
        self.deliver: Callable[[bytes], Any] | None = None
        if loop is None:
            if line is None:
                self._park = threading.Lock()
                self._park.acquire()
        else:
            self._event = asyncio.Event()
        self.signaled = False
        self.reserved = False
        self.granted = False
        self.abandoned = False
        self.attempting = False  # its own acquire is in flight: not a hand-off candidate
        self.key = key  # channels are shared by {K} and K: a hand-off must match the key
        self.owner = owner
        self.lease_ms = lease_ms
        self.on_grant = on_grant
        self.info = info  # what the index shows about it once handed the lock
        self.detached = False
        self.seen = 0  # its channel's message count when its last attempt began
        #: The cross-process hand-off: the token its failed attempts register under,
        #: whether an entry may be live in Redis (a give-up must withdraw it), and the short
        #: lease a release grants it with.
        self.token = token
        self.registered = registered
        self.grant_ms = grant_ms

    def park(self, timeout: float | None) -> None:
        if self.line is not None:
            self.line.park(self, timeout, self.deliver)
            return
        if timeout is None:
            self._park.acquire()
        elif timeout > 0:
            self._park.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))
        else:
            self._park.acquire(blocking=False)

    async def apark(self, timeout: float | None) -> None:
        if timeout is None or timeout > 0:
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                pass
        # No await between the wake and this clear: a wake cannot slip in and be lost.
        self._event.clear()

    def _unpark(self) -> bool:
        """Wake it; False if it is gone (its event loop closed under it)."""
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._event.set)
            except RuntimeError:  # its loop is closed: the waiter is gone
                self.abandoned = True
                return False
            return True
        if self.line is not None:
            self.pending = True
            self.line.poke()
            return True
        try:
            self._park.release()
        except RuntimeError:  # already released: a wake is pending anyway
            pass
        return True

    def _signal(self) -> bool:
        self.signaled = True
        if self._unpark():
            return True
        self.signaled = False
        return False


class Channel:
    """The waiters of one lock channel in this process."""

    __slots__ = ("name", "queue", "active", "pending", "refs", "want", "confirmed",
                 "idle_since", "expires_hint", "echoes", "confirm_futures", "wakes",
                 "messages", "grant", "grant_want", "grant_watch")

    def __init__(self, name: bytes, wakes: WakePolicy | None = None) -> None:
        self.name = name
        #: The grant channel, subscribed beside ``name`` once a waiter that can be granted the
        #: lock by another process joins (``naming.grant_channel``), and its confirmation.
        self.grant: bytes | None = None
        self.grant_want = 0
        #: When a grant to another process's waiter should have been followed by a message
        #: (its release) if that waiter is alive: past it, one waiter here re-checks.
        self.grant_watch = 0.0
        #: How many waiters a message wakes (None: one, the lock's rule, with echoes and
        #: hand-off). A kind whose message means more (a write unlock, new permits, a latch
        #: at zero) says so here; its waiters retry and re-park like any other.
        self.wakes = wakes
        self.messages = 0  # messages seen (a multi-wake waiter retries if one came mid-attempt)
        self.queue: collections.deque[Waiter] = collections.deque()
        self.active = 0            # woken or reserved waiters whose outcome is not known yet
        self.pending = False       # a wake arrived while one was in flight
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

    def wake_one(self) -> None:
        if self.active > 0:
            self.pending = True
            return
        while self.queue:
            self.active += 1
            if self.queue.popleft()._signal():
                return
            self.active -= 1  # a waiter whose event loop is gone: try the next

    def wake_all(self) -> None:
        while self.queue:
            self.active += 1
            if not self.queue.popleft()._signal():
                self.active -= 1

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
                self.active += 1
                if self.queue.popleft()._signal():
                    n -= 1
                else:
                    self.active -= 1


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


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Slot:
    """A thread's place in a channel's queue for the length of one wait."""

    __slots__ = ("_mgr", "channel", "_waiter")

    def __init__(self, mgr: PubSubManager, channel: Channel, waiter: Waiter) -> None:
        self._mgr = mgr
        self.channel = channel
        self._waiter = waiter

    def _settled(self, then: Callable[[], Any]) -> Any:
        """Wait out a hand-off to us that is in flight (its outcome comes within one round
        trip; or the listener detaches us after ``HANDOFF_TIMEOUT``), then run ``then``
        under the manager lock."""
        w = self._waiter
        while True:
            with self._mgr._lock:
                if not w.reserved:
                    return then()
            w.park(None)

    async def _asettled(self, then: Callable[[], Any], abandon_on_cancel: bool = False) -> Any:
        """``_settled`` for an asyncio waiter. ``abandon_on_cancel``: if cancelled meanwhile,
        leave the hand-off to the releasing thread to undo."""
        w = self._waiter
        while True:
            with self._mgr._lock:
                if not w.reserved:
                    return then()
            try:
                await w.apark(None)
            except BaseException:
                if not abandon_on_cancel:
                    raise
                with self._mgr._lock:
                    if not w.reserved:
                        return then()
                    w.abandoned = True
                    then()
                    raise

    def park(self, timeout: float | None) -> bool:
        """Sleep until woken or ``timeout``; True if a releasing thread handed us the lock."""
        self._waiter.park(timeout)
        return bool(self._settled(lambda: self._waiter.granted))

    async def apark(self, timeout: float | None) -> bool:
        """``park`` for an asyncio waiter."""
        await self._waiter.apark(timeout)
        return bool(await self._asettled(lambda: self._waiter.granted))

    @property
    def granted(self) -> bool:
        return self._waiter.granted

    @property
    def confirmed(self) -> threading.Event:
        """Set once the channel's subscription is confirmed by Redis."""
        return self.channel.confirmed

    def begin_attempt(self) -> bool:
        """Call before sending an acquire. True: a hand-off already gave us the lock, send
        nothing (a reentrant acquire on top would count it twice)."""
        return bool(self._settled(self._begin_locked))

    async def abegin_attempt(self) -> bool:
        """``begin_attempt`` for an asyncio waiter."""
        return bool(await self._asettled(self._begin_locked))

    def _begin_locked(self) -> bool:
        w = self._waiter
        if w.granted:
            return True
        w.attempting = True  # no hand-off to us while our own acquire is in flight
        w.seen = self.channel.messages
        if w.token is not None:
            w.registered = True  # it may be, once the attempt lands (even if we never hear)
        return False

    def claim(self, since: float | None = None) -> bool:
        """A claim attempt (sent at ``since``) found the lock granted to us
        (``scripts.CLAIMED``): book it unless the grant's message already did. Always True:
        we hold it."""
        with self._mgr._lock:
            w = self._waiter
            w.attempting = False
            if not w.granted:
                self._mgr._take_grant(self.channel, w, None, since)
            return True

    def ungrant(self) -> None:
        """A grant booked for us was found gone in Redis (it ran out while we could not run,
        invariant 31): we never held it. Back to the head of the line, as a waiter whose
        entry is gone (its next attempt registers it again)."""
        with self._mgr._lock:
            w = self._waiter
            w.granted = False
            w.registered = False
            self.channel.queue.appendleft(w)

    def attempted(self, acquired: bool, ttl_ms: int | None = None) -> bool:
        """Record the outcome of a retry. True means: retry again now, do not park."""
        ch, w = self.channel, self._waiter
        with self._mgr._lock:
            w.attempting = False
            if w.token is not None:
                w.registered = not acquired  # a failed attempt with a token registers it
            if w.granted:
                return False  # granted while the attempt was in flight: the park returns at once
            if ttl_ms is not None and ttl_ms >= 0:
                ch.expires_hint = time.monotonic() + ttl_ms / 1000.0
            if not acquired and ch.wakes is not None and ch.messages != w.seen:
                # A multi-wake kind: a message came while this attempt was in flight (it may
                # have read the state before the change the message announces): retry now.
                # Woken or still queued, it keeps its place.
                return True
            if w.signaled:
                w.signaled = False
                ch.active -= 1
                if acquired:
                    ch.pending = False
                    return False
                if ch.pending:
                    ch.pending = False
                    ch.active += 1
                    w.signaled = True
                    return True
                ch.queue.appendleft(w)  # it was first in line; it stays first
                return False
            if acquired:
                ch.pending = False
                try:
                    ch.queue.remove(w)
                except ValueError:
                    pass
            return False

    def leave(self) -> bool:
        """Leave the queue. True if a hand-off gave us the lock: the caller owns it now and
        must give it back itself, before it acquires anything again (nobody else releases on
        an owner's behalf, or a later acquire of that owner could be the one released)."""
        return bool(self._settled(self._leave_locked))

    async def aleave(self) -> bool:
        """``leave`` for an asyncio waiter."""
        return bool(await self._asettled(self._leave_locked, abandon_on_cancel=True))

    @property
    def registered(self) -> bool:
        """After ``leave``: an entry of ours may still be in the hand-off queue in Redis (or a
        grant to us be under way there), so a waiter that gives up must withdraw it."""
        return self._waiter.registered and not self._waiter.granted

    def _leave_locked(self) -> bool:
        ch, w = self.channel, self._waiter
        if w.token is not None:
            self._mgr._tokens.pop(w.token, None)  # a grant message from now on finds nobody
        if w.reserved:
            pass  # abandoned (cancelled twice): the releasing thread settles it
        elif w.signaled:
            # Woken but leaving (budget spent, interrupted): hand the wake on.
            w.signaled = False
            ch.active -= 1
            ch.wake_one()
        else:
            try:
                ch.queue.remove(w)
            except ValueError:
                pass
            if not w.granted and w.token is not None and ch.queue:
                # Its turn may have been the next grant: one waiter of ours that may not be
                # registered yet (it parked first) takes its place in line.
                ch.wake_one()
        ch.refs -= 1
        if ch.refs == 0:
            ch.idle_since = time.monotonic()
        return w.granted


_SHARDED_KINDS = {b"smessage": b"message", b"ssubscribe": b"subscribe",
                  b"sunsubscribe": b"unsubscribe"}


class PubSubManager:
    """The subscription connection to one Redis server and its listener thread."""

    def __init__(self, client: Any) -> None:
        self._client = client
        #: Sharded pub/sub (a Redis 7+ or Valkey cluster node: ``clients.sharded``): the scripts
        #: SPUBLISH, so channels are SSUBSCRIBEd, one slot per command.
        self._sharded = sharded(client)
        self._sub = "SSUBSCRIBE" if self._sharded else "SUBSCRIBE"
        self._unsub = "SUNSUBSCRIBE" if self._sharded else "UNSUBSCRIBE"
        self._lock = threading.Lock()
        self._channels: dict[bytes, Channel] = {}
        self._conn: Any = None
        self._connected = False
        self._sent: dict[bytes, int] = {}
        self._acked: dict[bytes, int] = {}
        self._thread: threading.Thread | None = None
        self._last_io = time.monotonic()
        self._ping_at = 0.0  # when a PING went out that no reply has followed yet
        #: Heirs of hand-offs in flight: channel, and since when (see ``_detach_overdue``).
        self._reserved: dict[Waiter, tuple[bytes, float]] = {}
        #: Waiters that can be granted the lock by any process's release, by token.
        self._tokens: dict[bytes, Waiter] = {}
        #: Grants to a token of this process whose waiter has not joined yet (its first,
        #: registering attempt raced the release): since when (pruned after ``_EARLY_KEEP``).
        self._early: dict[bytes, float] = {}
        #: Grant channel -> its lock channel's queue.
        self._grants: dict[bytes, Channel] = {}
        self._token_prefix = identity.process_id().encode()
        #: The earliest ``grant_watch`` of any channel (0: none): the listener wakes for it.
        self._next_watch = 0.0
        #: Reconnections so far (read by tests).
        self.reconnects = 0

    # -- used by waiting threads ------------------------------------------------------
    def busy(self, channel: bytes) -> bool:
        ch = self._channels.get(channel)
        return ch is not None and ch.busy()

    def subscribed(self, channel: bytes) -> bool:
        ch = self._channels.get(channel)
        return ch is not None and self._connected and ch.confirmed.is_set()

    def grants_heard(self, channel: bytes) -> bool:
        """A grant on ``channel``'s grant channel published now would reach us."""
        ch = self._channels.get(channel)
        return (ch is not None and ch.grant is not None and self._connected
                and ch.confirmed.is_set())

    def wake(self, channel: bytes, data: Any = b"0") -> None:
        """A release in this process freed the lock: wake a local waiter without waiting
        for the message to come back from Redis."""
        with self._lock:
            ch = self._channels.get(channel)
            if ch is not None:
                ch.wake_message(data)

    def reserve(self, channel: bytes, key: str) -> Waiter | None:
        """Pick this process's first waiter for a direct hand-off by a releasing thread.

        Only when the subscription is confirmed, so the release script's NUMSUB counts us
        and can tell whether any *other* process waits (then there is no hand-off).
        """
        with self._lock:
            ch = self._channels.get(channel)
            if (ch is None or not ch.queue or ch.active or not self._connected
                    or not ch.confirmed.is_set() or ch.queue[0].attempting
                    or ch.queue[0].key != key or not ch.queue[0].owner
                    or ch.queue[0].registered):
                # (Registered: it is in the hand-off queue in Redis, where the release script
                # finds it in its turn.)
                # (No owner: a waiter of another kind on the same channel, e.g. a FencedLock,
                # whose acquire must run its own script: never handed an RLock grant.)
                return None
            w = ch.queue.popleft()
            w.reserved = True
            ch.active += 1
            self._reserved[w] = (channel, time.monotonic())
            return w

    def _detach_overdue(self, now: float) -> None:
        """Under the lock (housekeeping): a hand-off whose outcome has not come within
        ``HANDOFF_TIMEOUT`` (the releasing thread's round trip hangs) stops holding its heir:
        the heir goes back to the head of the queue and is woken to carry on by itself."""
        for w, (channel, since) in list(self._reserved.items()):
            if now - since < HANDOFF_TIMEOUT:
                continue
            del self._reserved[w]
            ch = self._channels.get(channel)
            logger.warning("django-rlock: a hand-off of %r is still unsettled after %.1f s (the "
                           "releasing thread's round trip hangs); the waiter carries on by itself",
                           w.key, now - since)
            w.reserved = False
            w.detached = True
            if ch is not None:
                ch.active -= 1
                ch.queue.appendleft(w)
            w._unpark()

    def resolve(self, channel: bytes, w: Waiter, granted: bool,
                since: float | None = None) -> bool:
        """Settle a reservation. Returns False if the waiter left meanwhile (the caller must
        then release the lock on its behalf). ``since``: when the release was sent."""
        with self._lock:
            ch = self._channels.get(channel)
            self._reserved.pop(w, None)
            if w.detached:
                # It stopped waiting for us: never grant behind its back, never release on its
                # behalf (it may have acquired again as the same owner). If it still waits,
                # its next claim takes the lock; if it left, the lock expires by its lease.
                w.detached = False
                if granted and ch is not None and w in ch.queue:
                    ch.queue.remove(w)
                    ch.active += 1
                    w._signal()
                elif granted:
                    logger.warning("django-rlock: %r was handed to %s after it stopped waiting; "
                                   "it expires within %d ms", w.key, w.owner, w.lease_ms)
                return True
            w.reserved = False
            if w.abandoned:
                if ch is not None:
                    ch.active -= 1
                    if not granted:
                        ch.wake_one()
                return not granted
            if granted:
                if ch is not None:
                    ch.active -= 1
                    ch.pending = False
                # The waiter acts only under our lock, so the order within it is free.
                if not w._unpark():
                    return False  # its event loop is gone: release on its behalf
                if w.on_grant is not None:
                    # Registered while the waiter cannot yet leave or return.
                    w.on_grant(None, since)
                w.granted = True
            else:
                # Released the ordinary way (or not at all): this waiter retries first.
                w._signal()
            return True

    # -- the cross-process hand-off ------------------------------------------------------
    def _take_grant(self, ch: Channel, w: Waiter, grant_ms: int | None,
                    since: float | None = None) -> bool:
        """Under the lock: ``w`` was granted the lock in Redis; it owns it from now on. Books
        the hold (``on_grant``) before the waiter can see it. False if the waiter is gone.
        ``since``: the grant was made then at the earliest (None: when the wait began)."""
        if w.signaled:
            w.signaled = False
            ch.active -= 1
        else:
            try:
                ch.queue.remove(w)
            except ValueError:
                pass
        w.registered = False
        if not w._unpark():
            return False  # its event loop closed: the grant's short lease ends it
        if w.on_grant is not None:
            w.on_grant(grant_ms, since)
        w.granted = True
        return True

    def granted(self, channel: bytes, token: Any, since: float | None = None) -> None:
        """A release (ours, or another process's, through the grant channel) granted the lock
        to ``token``: if the waiter is ours, it owns the lock now, without a command. Each grant
        is taken once, whichever way it arrives first (the reply, the message, a claim).
        ``since``: our own release's send time (else the grant counts from the wait's start)."""
        if isinstance(token, str):
            token = token.encode()
        now = time.monotonic()
        with self._lock:
            ch = self._channels.get(channel)
            w = self._tokens.get(token)
            if w is None or ch is None:
                if token.startswith(self._token_prefix):
                    if ch is not None:
                        ch.grant_watch = 0.0
                    self._early[token] = now  # its waiter is about to join (see ``enter``)
                elif ch is not None:
                    # Another process's waiter: if it died before it could take the lock, its
                    # grant expires unannounced; one of ours re-checks just after that.
                    ch.grant_watch = now + GRANT_WATCH
                    if not self._next_watch or ch.grant_watch < self._next_watch:
                        self._next_watch = ch.grant_watch
                return
            ch.grant_watch = 0.0
            if w.granted or w.reserved:
                return  # taken already; or our own release's heir, which ``resolve`` settles
            self._take_grant(ch, w, w.grant_ms, since)

    def confirmation(self, slot: Slot, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """A future resolved when the slot's subscription is confirmed (None: it already is).

        Lets asyncio waiters wait for it on their loop, not on an executor thread each.
        """
        with self._lock:
            ch = slot.channel
            if ch.confirmed.is_set():
                return None
            fut: asyncio.Future[None] = loop.create_future()
            ch.confirm_futures.append((loop, fut))
            return fut

    def expect_echo(self, channel: bytes) -> bool:
        """A release that may publish is about to be sent: its message is not a wake-up."""
        with self._lock:
            ch = self._channels.get(channel)
            if ch is None or not self._connected or not ch.confirmed.is_set():
                return False
            ch.echoes += 1
            return True

    def cancel_echo(self, channel: bytes) -> None:
        """The release published nothing. If a message already used up its credit, that
        message was someone else's wake-up: pass it on."""
        with self._lock:
            ch = self._channels.get(channel)
            if ch is None:
                return
            if ch.echoes > 0:
                ch.echoes -= 1
            else:
                ch.wake_one()

    def expires_hint(self, channel: bytes) -> float:
        ch = self._channels.get(channel)
        return ch.expires_hint if ch is not None else 0.0

    def enter(self, channel: bytes, owner: str = "", lease_ms: int = 0,
              on_grant: Callable[..., Any] | None = None,
              loop: asyncio.AbstractEventLoop | None = None, key: str = "",
              info: str = "", wakes: WakePolicy | None = None, grant: bytes | None = None,
              token: bytes | None = None, registered: bool = False,
              grant_ms: int = 0, line: Any = None) -> Slot:
        """Join the channel's queue, subscribing if needed. Pair with ``Slot.leave()``.

        ``owner``, ``lease_ms``, ``on_grant`` and ``info`` let a releasing thread of this
        process hand the lock straight to this waiter (see ``reserve``). ``wakes``: how many
        waiters one message on this channel wakes (default: one). ``grant`` (the grant
        channel), ``token`` and ``grant_ms``: any process's release may grant it the lock
        (``registered``: its first attempt already put it in line). ``line``: the thread's
        own wake line, where grants to ``token`` arrive (``wakeline``).
        """
        w = Waiter(owner, lease_ms, on_grant, loop, key, info, token, registered, grant_ms, line)
        if line is not None:
            w.deliver = lambda tok: self.granted(channel, tok)
        with self._lock:
            ch = self._channels.get(channel)
            if ch is None:
                ch = self._channels[channel] = Channel(channel, wakes)
            elif wakes is not None:
                ch.wakes = wakes
            ch.refs += 1
            ch.queue.append(w)
            if grant is not None and ch.grant is None:
                ch.grant = grant
                self._grants[grant] = ch
                if ch.want:
                    self._subscribe_grant_locked(ch)
            if token is not None:
                self._tokens[token] = w
                if self._early.pop(token, None) is not None:
                    self._take_grant(ch, w, grant_ms)  # granted before it got here
            if ch.want == 0 or not self._connected:
                self._subscribe_locked(ch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="django-rlock-pubsub",
                                                daemon=True)
                self._thread.start()
        return Slot(self, ch, w)

    @contextmanager
    def waiting(self, channel: bytes, subscribe_timeout: float | None, owner: str = "",
                lease_ms: int = 0, on_grant: Callable[..., Any] | None = None) -> Iterator[Slot]:
        """``enter`` for a thread, waiting for the subscription before the body runs."""
        slot = self.enter(channel, owner, lease_ms, on_grant)
        try:
            if not slot.confirmed.is_set():
                # If the subscription cannot be confirmed in time the waits below are still
                # bounded by the holder's PTTL; we only lose the early wake-up.
                slot.confirmed.wait(subscribe_timeout)
            yield slot
        finally:
            slot.leave()

    # -- the connection ---------------------------------------------------------------
    def _subscribe_locked(self, ch: Channel) -> None:
        if not self._connected:
            return  # the listener subscribes every channel when it (re)connects
        # One SUBSCRIBE for the channel and its grant channel: a release script's NUMSUB
        # then never sees one of ours on the first but not yet on the second (a "foreign"
        # waiter, which makes it free the lock instead of granting it).
        names = (ch.name,) if ch.grant is None else (ch.name, ch.grant)
        try:
            self._conn.send_command(self._sub, *names, check_health=False)  # one slot
        except Exception:
            self._connected = False
            self._conn.disconnect()
            return
        n = self._sent[ch.name] = self._sent.get(ch.name, 0) + 1
        ch.want = n
        if ch.grant is not None:
            ch.grant_want = self._sent[ch.grant] = self._sent.get(ch.grant, 0) + 1
        self._last_io = time.monotonic()

    def _subscribe_grant_locked(self, ch: Channel) -> None:
        """The channel is subscribed already (a waiter of a kind without hand-off came first):
        add its grant channel; waiters joining from now on wait for that confirmation too."""
        assert ch.grant is not None
        if not self._connected:
            return
        try:
            self._conn.send_command(self._sub, ch.grant, check_health=False)
        except Exception:
            self._connected = False
            self._conn.disconnect()
            return
        ch.grant_want = self._sent[ch.grant] = self._sent.get(ch.grant, 0) + 1
        ch.confirmed.clear()
        self._last_io = time.monotonic()

    def _connect(self) -> None:
        # A connection of our own, outside the pool: pool.disconnect() (client.close(),
        # DJANGO_REDIS_CLOSE_CONNECTION) must not cut every waiter's subscription. Named, so
        # CLIENT LIST shows whose it is. Connected outside our lock: a dead network may block
        # here, and every lock and unlock of the process takes that lock.
        pool = self._client.connection_pool
        db = pool.connection_kwargs.get("db", 0)
        conn = pool.connection_class(**{**pool.connection_kwargs, "client_name": subscriber_name(db)})
        conn.connect()
        with self._lock:
            old, self._conn = self._conn, conn
            first = old is None
            if old is not None:
                try:
                    old.disconnect()
                except Exception:
                    pass
            self._sent.clear()
            self._acked.clear()
            names = []
            for ch in self._channels.values():
                ch.confirmed.clear()
                ch.want = 1
                ch.echoes = 0
                names.append(ch.name)
                if ch.grant is not None:
                    ch.grant_want = 1
                    names.append(ch.grant)
            if names:
                self._send(self._sub, names)
                for name in names:
                    self._sent[name] = 1
            self._connected = True
            self._last_io = time.monotonic()
            if not first:
                # Messages may have been missed while we were away: everyone re-checks.
                for ch in self._channels.values():
                    ch.wake_all()

    def _run(self) -> None:
        backoff = 0.05
        next_housekeeping = time.monotonic() + _HOUSEKEEPING
        while True:
            try:
                if not self._connected:
                    if self._conn is not None:
                        self.reconnects += 1
                    self._connect()
                timeout = _HOUSEKEEPING
                if self._next_watch:
                    timeout = max(0.0, min(timeout, self._next_watch - time.monotonic()))
                if self._conn.can_read(timeout=timeout):
                    self._dispatch(self._conn.read_response(disconnect_on_error=True, push_request=True))
                now = time.monotonic()
                if self._next_watch and now >= self._next_watch:
                    self._watch(now)
                if now >= next_housekeeping:
                    next_housekeeping = now + _HOUSEKEEPING
                    self._housekeeping(now)
                backoff = 0.05
            except Exception as exc:
                if self._connected:
                    logger.warning("django-rlock: pub/sub connection lost (%s: %s); waiters fall "
                                   "back to the holder's TTL until it is back",
                                   type(exc).__name__, exc)
                self._connected = False
                try:
                    if self._conn is not None:
                        self._conn.disconnect()
                except Exception:
                    pass
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _send(self, command: str, names: list[bytes]) -> None:
        """(UN)SUBSCRIBE ``names``: one command, or one per slot for sharded channels (a
        sharded command may only name channels of one slot)."""
        if not self._sharded:
            self._conn.send_command(command, *names, check_health=False)
            return
        by_slot: dict[int, list[bytes]] = {}
        for name in names:
            by_slot.setdefault(key_slot(name), []).append(name)
        for group in by_slot.values():
            self._conn.send_command(command, *group, check_health=False)

    def _dispatch(self, reply: Any) -> None:
        self._last_io = time.monotonic()
        self._ping_at = 0.0
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind = reply[0]
        if isinstance(kind, str):
            kind = kind.encode()
        if self._sharded:  # smessage, ssubscribe, sunsubscribe: handled as their classic kin
            kind = _SHARDED_KINDS.get(kind, kind)
        name = reply[1]
        if isinstance(name, str):
            name = name.encode()
        grant: tuple[bytes, Any] | None = None
        with self._lock:
            if kind == b"message":
                ch = self._channels.get(name)
                if ch is not None:
                    ch.grant_watch = 0.0
                    if ch.echoes > 0:
                        ch.echoes -= 1  # our own release: its waiters were woken directly
                    else:
                        ch.wake_message(reply[2] if len(reply) > 2 else b"0")
                else:
                    ch = self._grants.get(name)
                    if ch is not None and len(reply) > 2:
                        grant = (ch.name, reply[2])
            elif kind == b"subscribe":
                self._acked[name] = self._acked.get(name, 0) + 1
                ch = self._channels.get(name) or self._grants.get(name)
                if ch is not None and self._acked.get(ch.name, 0) >= ch.want and (
                        ch.grant is None or self._acked.get(ch.grant, 0) >= ch.grant_want):
                    ch.set_confirmed()
            elif (kind == b"unsubscribe" and name not in self._channels
                  and name not in self._grants
                  and self._acked.get(name, 0) >= self._sent.get(name, 0)):
                self._acked.pop(name, None)
                self._sent.pop(name, None)
            elif kind == b"unsubscribe" and self._sharded and name in self._channels:
                # The server dropped a channel we still want: its slot moved to another node.
                # The waiters attempt again (their lock follows the slot) and meanwhile sleep
                # no longer than their bound.
                ch = self._channels[name]
                ch.confirmed.clear()
                ch.wake_all()
        if grant is not None:
            self.granted(*grant)

    def _watch(self, now: float) -> None:
        """A grant to another process's waiter was followed by no message for longer than
        its grant lease: the heir may have died, and the lock expired unannounced. One
        waiter per channel here asks."""
        with self._lock:
            self._next_watch = 0.0
            for ch in self._channels.values():
                if ch.grant_watch and now >= ch.grant_watch:
                    ch.grant_watch = 0.0
                    ch.wake_one()
                elif ch.grant_watch:
                    self._next_watch = min(self._next_watch or ch.grant_watch, ch.grant_watch)

    def _housekeeping(self, now: float) -> None:
        with self._lock:
            if self._reserved:
                self._detach_overdue(now)
            if not self._connected:
                return
            # A Sentinel pool that found a new master (a switchover leaves the old one up, and
            # our subscription on it, until Sentinel demotes it): follow it.
            try:  # (asks the sentinels: once a second per subscription)
                address = getattr(self._client.connection_pool, "master_address", None)
            except Exception:  # no sentinel answers: keep what we have
                address = None
            if address is not None and (getattr(self._conn, "host", None),
                                        getattr(self._conn, "port", None)) != tuple(address):
                self._connected = False
                self._conn.disconnect()
                return
            if self._ping_at and now - self._ping_at >= _PONG_TIMEOUT:
                # A half-open connection (NAT or firewall dropped it) reads nothing forever.
                logger.warning("django-rlock: pub/sub connection silent after PING; reconnecting")
                self._ping_at = 0.0
                self._connected = False
                self._conn.disconnect()
                return
            if self._early:
                for token, since in list(self._early.items()):
                    if now - since >= _EARLY_KEEP:
                        del self._early[token]
            idle = [ch for ch in self._channels.values()
                    if ch.refs == 0 and now - ch.idle_since >= LINGER]
            names = []
            for ch in idle:
                del self._channels[ch.name]
                names.append(ch.name)
                if ch.grant is not None:
                    self._grants.pop(ch.grant, None)
                    names.append(ch.grant)
            try:
                if idle:
                    self._send(self._unsub, names)
                    self._last_io = now
                elif self._channels and not self._ping_at and now - self._last_io >= _PING_AFTER:
                    self._conn.send_command("PING", check_health=False)
                    self._ping_at = now
            except Exception:
                self._connected = False
                self._conn.disconnect()

    def channel_count(self) -> int:
        return len(self._channels)


_managers: dict[tuple[Any, ...], PubSubManager] = {}
_managers_lock = threading.Lock()


def subscriber_name(db: Any = 0) -> str:
    """The CLIENT SETNAME of this process's subscription connection for database ``db``."""
    return f"rlock-pubsub:{identity.process_id()}:{db}"


def _server(client: Any) -> tuple[Any, ...]:
    # Per database: the channel names a key but not its database, so a queue shared by two
    # databases could hand one database's lock to a waiter for the other's.
    return server_id(client)


def manager(client: Any) -> PubSubManager:
    """The manager of ``client``'s server, created on first use."""
    sid = _server(client)
    mgr = _managers.get(sid)
    if mgr is None:
        with _managers_lock:
            mgr = _managers.get(sid)
            if mgr is None:
                mgr = _managers[sid] = PubSubManager(client)
    return mgr


def existing_manager(client: Any) -> PubSubManager | None:
    return _managers.get(_server(client))


def _reset_after_fork() -> None:
    # The parent's listener thread does not exist here, and its socket is the parent's.
    global _managers, _managers_lock
    _managers = {}
    _managers_lock = threading.Lock()


identity.on_fork(_reset_after_fork)
