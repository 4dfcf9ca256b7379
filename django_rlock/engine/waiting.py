"""The one wait loop every kind shares (threads and asyncio tasks).

A kind supplies ``attempt(claim)``: one acquire round trip that returns ``None`` when it got
what it wanted, else how long (ms) it may be worth waiting before the next try (the holder's
PTTL, the nearest permit expiry; ``-1`` when nothing bounds it). The loop joins the channel's
queue on the process's one subscription *before* its first retry, so a message that lands
between a failed attempt and the park is never lost, and parks until woken, until that bound,
or until the caller's budget runs out. Expiry publishes nothing: the bound is what finds it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import pubsub
from .scripts import CLAIMED

#: Longest a waiter waits for its SUBSCRIBE to be confirmed before relying on its bound alone.
SUBSCRIBE_TIMEOUT = 7.5


def park_timeout(ttl: int, deadline: float | None, recheck: float | None = None) -> float | None:
    """Seconds to park after an attempt that returned ``ttl`` ms.

    ``recheck`` caps a wait with nothing to bound it (no TTL): a kind whose state changes
    without a message it could miss re-checks at least that often.
    """
    # Redis expires a key once its deadline has *passed*: PTTL 0 is still there.
    timeout = (ttl + 1) / 1000.0 if ttl >= 0 else recheck
    if deadline is not None:
        left = deadline - time.monotonic()
        timeout = left if timeout is None else min(timeout, left)
    return None if timeout is None else min(timeout, threading.TIMEOUT_MAX)


#: Longest park of a wait whose lock's slot moved to another node since it subscribed (a
#: cluster resharding or failover): its subscription is on the old node and hears nothing.
MOVED_RECHECK = 0.2


def _park_for(w: Wait, ttl: int, deadline: float | None) -> float | None:
    timeout = park_timeout(ttl, deadline, w.recheck)
    if w.moved is not None and w.moved():
        timeout = MOVED_RECHECK if timeout is None else min(timeout, MOVED_RECHECK)
    return timeout


class Wait:
    """What one wait is about: the channel and, for a hand-off, who waits."""

    __slots__ = ("client", "channel", "key", "owner", "lease_ms", "on_grant", "info", "wakes",
                 "recheck", "grant", "token", "registered", "grant_ms", "line", "moved")

    def __init__(self, client: Any, channel: bytes, key: str, *, owner: str = "",
                 lease_ms: int = 0, on_grant: Callable[..., Any] | None = None,
                 info: str = "", wakes: pubsub.WakePolicy | None = None,
                 recheck: float | None = None, grant: bytes | None = None,
                 token: bytes | None = None, registered: bool = False,
                 grant_ms: int = 0, line: Any = None,
                 moved: Callable[[], bool] | None = None) -> None:
        self.client = client  # the sync client whose server's subscription is used
        self.channel = channel
        self.key = key
        self.owner = owner
        self.lease_ms = lease_ms
        self.on_grant = on_grant
        self.info = info
        self.wakes = wakes
        self.recheck = recheck
        # The cross-process hand-off (kinds with one): where grants are announced, the token
        # this wait registers under, whether its first attempt did so already, and the lease
        # a grant starts with.
        self.grant = grant
        self.token = token
        self.registered = registered
        self.grant_ms = grant_ms
        self.line = line  # the thread's own wake line, if ``token`` names it
        #: On a cluster: has the lock's slot moved to another node since (``SlotBound``)?
        self.moved = moved

    def enter(self, mgr: pubsub.PubSubManager, loop: Any = None) -> pubsub.Slot:
        return mgr.enter(self.channel, self.owner, self.lease_ms, self.on_grant, loop, self.key,
                         self.info, self.wakes, self.grant, self.token, self.registered,
                         self.grant_ms, self.line)


def _over(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def wait(w: Wait, attempt: Callable[[bool], int | None], budget: float | None,
         give_back: Callable[[], Any] | None = None, park_until: float = 0.0,
         withdraw: Callable[[], Any] | None = None,
         verify: Callable[[], bool] | None = None) -> bool:
    """Wait for ``attempt`` to succeed within ``budget`` seconds (None: forever).

    ``give_back`` undoes a hand-off that reached us as we gave up (RLock's only);
    ``withdraw`` takes our entry out of the cross-process hand-off queue (or gives back the
    grant that raced with our giving up). ``verify()`` decides whether a grant booked for us
    may be returned as a hold (invariant 31): False means it was gone in Redis and is
    unbooked; the wait goes on.
    """
    deadline = None if budget is None else time.monotonic() + budget
    sub_timeout = SUBSCRIBE_TIMEOUT if budget is None else min(SUBSCRIBE_TIMEOUT, budget)
    slot = w.enter(pubsub.manager(w.client))
    acquired = False
    try:
        if not slot.confirmed.is_set():
            # If the subscription cannot be confirmed in time the waits below are still
            # bounded; we only lose the early wake-up.
            slot.confirmed.wait(sub_timeout)
        if park_until:
            end = park_until if deadline is None else min(park_until, deadline)
            acquired = slot.park(end - time.monotonic())
        while True:
            while not acquired:
                if slot.begin_attempt():
                    acquired = True
                    break
                sent = time.monotonic()
                ttl = attempt(True)
                if ttl == CLAIMED:
                    acquired = slot.claim(sent)
                    break
                again = slot.attempted(ttl is None, ttl)
                if ttl is None or slot.granted:
                    acquired = True
                elif again:
                    continue
                elif _over(deadline):
                    break
                else:
                    acquired = slot.park(_park_for(w, ttl, deadline))
            if not acquired or verify is None or not slot.granted or verify():
                return acquired
            slot.ungrant()
            acquired = False
            if _over(deadline):
                return False
    finally:
        granted = slot.leave()
        if not acquired:
            try:
                if granted and give_back is not None:
                    # Handed the lock just as we gave up (budget spent, or an exception): back.
                    give_back()
                elif slot.registered and withdraw is not None:
                    withdraw()
            except Exception:
                pass


async def await_(w: Wait, attempt: Callable[[bool], Awaitable[int | None]],
                 budget: float | None, give_back: Callable[[], Awaitable[Any]] | None = None,
                 park_until: float = 0.0,
                 withdraw: Callable[[], Awaitable[Any]] | None = None,
                 verify: Callable[[], Awaitable[bool]] | None = None) -> bool:
    """``wait`` for an asyncio task: it parks on its own loop, never on a thread."""
    deadline = None if budget is None else time.monotonic() + budget
    sub_timeout = SUBSCRIBE_TIMEOUT if budget is None else min(SUBSCRIBE_TIMEOUT, budget)
    mgr = pubsub.manager(w.client)
    loop = asyncio.get_running_loop()
    slot = w.enter(mgr, loop)
    acquired = False
    try:
        confirmed = mgr.confirmation(slot, loop)
        if confirmed is not None:
            try:
                await asyncio.wait_for(confirmed, sub_timeout)
            except TimeoutError:
                pass
        if park_until:
            end = park_until if deadline is None else min(park_until, deadline)
            acquired = await slot.apark(end - time.monotonic())
        while True:
            while not acquired:
                if await slot.abegin_attempt():
                    acquired = True
                    break
                sent = time.monotonic()
                ttl = await attempt(True)
                if ttl == CLAIMED:
                    acquired = slot.claim(sent)
                    break
                again = slot.attempted(ttl is None, ttl)
                if ttl is None or slot.granted:
                    acquired = True
                elif again:
                    continue
                elif _over(deadline):
                    break
                else:
                    acquired = await slot.apark(_park_for(w, ttl, deadline))
            if not acquired or verify is None or not slot.granted or await verify():
                return acquired
            slot.ungrant()
            acquired = False
            if _over(deadline):
                return False
    finally:
        granted = await slot.aleave()
        if not acquired:
            # Handed the lock just as we gave up (budget spent, cancelled): give it back
            # ourselves, now, as its owner; or take our place in line back.
            try:
                if granted and give_back is not None:
                    await give_back()
                elif slot.registered and withdraw is not None:
                    await withdraw()
            except Exception:
                pass
