"""The one wait loop every kind shares (threads and asyncio tasks).

A kind supplies ``attempt(claim)``: one acquire round trip that returns ``None`` when it got
what it wanted, else how long (ms) it may be worth waiting before the next try (the holder's
PTTL, the nearest permit expiry; ``-1`` when nothing bounds it). The loop joins the channel's
queue on the process's one subscription *before* its first retry, so a message that lands
between a failed attempt and the park is never lost, and parks until woken, until that bound,
or until the caller's budget runs out (invariant 4). Expiry publishes nothing: the bound is
what finds it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .. import events
from ..scripts import CLAIMED
from ..waiters import Parked
from . import settings
from .channel import WakePolicy
from .manager import PubSubManager, manager
from .slot import Slot
from .waiter import HandOff

__all__ = ["HandOff", "Wait", "await_", "park_timeout", "refused", "wait"]


def park_timeout(ttl: int, deadline: float | None, recheck: float | None = None) -> float | None:
    """Seconds to park after an attempt that returned ``ttl`` ms.

    ``recheck`` caps a wait with nothing to bound it (no TTL): a kind whose state changes
    without a message it could miss re-checks at least that often (invariant 18).
    """
    # Redis expires a key once its deadline has *passed*: PTTL 0 is still there (invariant 4).
    timeout = (ttl + 1) / 1000.0 if ttl >= 0 else recheck
    if deadline is not None:
        left = deadline - time.monotonic()
        timeout = left if timeout is None else min(timeout, left)
    return None if timeout is None else min(timeout, threading.TIMEOUT_MAX)


def _park_for(w: Wait, ttl: int, deadline: float | None) -> float | None:
    timeout = park_timeout(ttl, deadline, w.recheck)
    if w.moved is not None and w.moved():
        # Its subscription is on the node the slot left (invariant 28).
        recheck = settings.MOVED_RECHECK
        timeout = recheck if timeout is None else min(timeout, recheck)
    return timeout


@dataclass(slots=True, eq=False)
class Wait:
    """What one wait is about: the server (``client``: the sync client whose subscription is
    used), the channel and key, how a message wakes (``wakes``) and how often a wait with no
    bound re-checks (``recheck``), whether the lock's slot moved since (``moved``, on a
    cluster: ``SlotBound``), and, for kinds with a hand-off, what a release needs to hand the
    lock over (``handoff``). ``name``, ``label``, ``kind``, ``owner`` and ``since`` (monotonic
    time of the call) are what the ``wait_started`` / ``wait_ended`` events report.

    Made once per wait and never changed; not ``frozen``, whose ``__init__`` (a
    ``object.__setattr__`` per field) costs six times a plain one's on every contended acquire.
    """

    client: Any
    channel: bytes
    key: str
    wakes: WakePolicy | None = None
    recheck: float | None = None
    moved: Callable[[], bool] | None = None
    handoff: HandOff | None = None
    name: str = ""
    label: str | None = None
    kind: str = ""
    owner: str = ""
    since: float | None = None

    def enter(self, mgr: PubSubManager, loop: asyncio.AbstractEventLoop | None = None) -> Slot:
        return mgr.enter(self.channel, self.key, wakes=self.wakes, handoff=self.handoff,
                         loop=loop)


def _started(w: Wait) -> None:
    events.emit("wait_started", name=w.name, key=w.key, label=w.label, kind=w.kind,
                owner=w.owner)


def _ended(w: Wait, acquired: bool, ended: bool, handed_over: bool) -> None:
    """``wait_ended``, on the waiter's thread (or task) as its wait returns or raises."""
    since = w.since
    now = time.monotonic()
    events.emit("wait_ended", name=w.name, key=w.key, label=w.label, kind=w.kind,
                owner=w.owner, outcome="acquired" if acquired else "timeout" if ended else "error",
                wait=0.0 if since is None else now - since, handed_over=acquired and handed_over,
                client=None if acquired else w.client)


def refused(client: Any, name: str, key: str, label: str | None, kind: str, owner: str,
            since: float) -> None:
    """A one-shot acquire (no wait) found the lock taken: the ``refused`` event."""
    if events.listeners:
        events.emit("refused", name=name, key=key, label=label, kind=kind, owner=owner,
                    wait=time.monotonic() - since, client=client)


def _first_park_end(slot: Slot, park_until: float, deadline: float | None) -> float:
    """When a park before the wait's first attempt ends. An asyncio waiter not in line yet may
    be put there by a release of its process (invariant 44), with an entry valid for a grant
    lease plus the slack: it parks at most a grant lease, then its attempt renews the entry
    (as every waiter's attempts do within their entry's validity, invariant 20)."""
    end = park_until if deadline is None else min(park_until, deadline)
    if slot.waiter.aio and slot.waiter.token is not None and not slot.registered:
        end = min(end, time.monotonic() + settings.GRANT_LEASE)
    return end


def _over(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def wait(w: Wait, attempt: Callable[[bool], int | None], budget: float | None,
         give_back: Callable[[], Any] | None = None, park_until: float = 0.0,
         withdraw: Callable[[], Any] | None = None,
         verify: Callable[[], bool] | None = None, parked: Parked | None = None) -> bool:
    """Wait for ``attempt`` to succeed within ``budget`` seconds (None: forever).

    ``give_back`` undoes a hand-off that reached us as we gave up (RLock's only, invariant 7);
    ``withdraw`` takes our entry out of the cross-process hand-off queue (or gives back the
    grant that raced with our giving up, invariant 24). ``verify()`` decides whether a grant
    booked for us may be returned as a hold (invariant 31): False means it was gone in Redis
    and is unbooked; the wait goes on. ``parked``: the waiter's record, written if the park
    before its first attempt (``park_until``) lasts, taken out as it ends (invariant 41).
    """
    deadline = None if budget is None else time.monotonic() + budget
    sub_timeout = settings.SUBSCRIBE_TIMEOUT
    if budget is not None:
        sub_timeout = min(sub_timeout, budget)
    slot = w.enter(manager(w.client))
    acquired = ended = False
    if events.listeners:
        _started(w)
    try:
        if not slot.confirmed.is_set():
            # If the subscription cannot be confirmed in time the waits below are still
            # bounded; we only lose the early wake-up.
            slot.confirmed.wait(sub_timeout)
        if park_until:
            end = _first_park_end(slot, park_until, deadline)
            if parked is not None:
                parked.start(end)  # its record, if the park lasts (invariant 41)
            acquired = slot.park(end - time.monotonic())
        while True:
            while not acquired:
                if slot.begin_attempt():
                    acquired = True
                    break
                sent = time.monotonic()
                ttl = attempt(True)  # claim mode: a hand-off is taken as is (invariant 2)
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
                ended = True
                return acquired
            slot.ungrant()
            acquired = False
            if _over(deadline):
                ended = True
                return False
    finally:
        granted = slot.leave()
        if events.listeners:
            _ended(w, acquired, ended, granted)
        if parked is not None:
            parked.forget()
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
                 verify: Callable[[], Awaitable[bool]] | None = None,
                 parked: Parked | None = None) -> bool:
    """``wait`` for an asyncio task: it parks on its own loop, never on a thread."""
    deadline = None if budget is None else time.monotonic() + budget
    sub_timeout = settings.SUBSCRIBE_TIMEOUT
    if budget is not None:
        sub_timeout = min(sub_timeout, budget)
    mgr = manager(w.client)
    loop = asyncio.get_running_loop()
    slot = w.enter(mgr, loop)
    acquired = ended = False
    if events.listeners:
        _started(w)
    try:
        confirmed = mgr.confirmation(slot, loop)
        if confirmed is not None:
            # ``asyncio.timeout``, not ``wait_for``: on Python 3.11 a ``wait_for`` cancelled
            # just as its future resolves returns the result and drops the cancellation, and
            # the cancelled waiter would go on waiting (in line) as if nothing happened.
            try:
                async with asyncio.timeout(sub_timeout):
                    await confirmed
            except TimeoutError:
                pass
        if park_until:
            end = _first_park_end(slot, park_until, deadline)
            if parked is not None:
                parked.start(end)
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
                ended = True
                return acquired
            slot.ungrant()
            acquired = False
            if _over(deadline):
                ended = True
                return False
    finally:
        granted = await slot.aleave()
        if events.listeners:
            _ended(w, acquired, ended, granted)
        if parked is not None:
            parked.forget()
        if not acquired:
            # Handed the lock just as we gave up (budget spent, cancelled): give it back
            # ourselves, now, as its owner (invariant 7); or take our place in line back
            # (invariant 24).
            try:
                if granted and give_back is not None:
                    await give_back()
                elif slot.registered and withdraw is not None:
                    await withdraw()
            except Exception:
                pass
