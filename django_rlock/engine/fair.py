"""FairLock: Redisson's ``RFairLock``, a reentrant lock granted in arrival order.

Redisson's layout, so Java and Node clients queue in the same line: the lock is RLock's hash
``<key>`` (field ``<uuid>:<n>`` -> hold count); next to it the list
``redisson_lock_queue:{<key>}`` (waiters in arrival order) and the sorted set
``redisson_lock_timeout:{<key>}`` (each waiter's deadline, ms since the epoch). Each waiter is
woken on a channel of its own, ``redisson_lock__channel:{<key>}:<owner>``, with ``0``: a
release wakes the queue's head and nobody else.

The queue math is Redisson's (redisson.md §1.4, §5.9): a waiter joins with deadline
``(previous waiter's deadline, or now + the lock's PTTL) + allowance``; a waiter whose deadline
passed while it stood first in line is dead (its process crashed, it gave up and could not say
so) and is dropped by the next script that runs; the waiter that takes the lock, and one that
gives up, shifts every deadline behind it by ``-allowance``, so deadlines do not drift
(Redisson #1104, #2099, #5019). The allowance is ``thread_wait_time``, or the caller's own
wait budget when that is shorter (Redisson: ``waitTime`` when given), since a waiter never
waits longer than its budget.

"now" is the Redis server's clock (``TIME`` inside each script), never the client's: scores
written by one process are compared by another, and client clocks disagree.

Where this port differs from Redisson (on purpose):

* ``unlock()`` by a non-owner, or after the lease ran out, raises ``LockNotOwnedError`` as
  ``RLock`` does (Redisson's fair unlock of a missing key returns quietly). It still wakes the
  head waiter when the key is gone, so an expired holder's late unlock hands the lock on.
* A queued waiter parks at most the holder's PTTL (Redisson's first reply is the wait to its
  turn, often much longer): a holder that dies frees the lock silently, and the head must see
  that within the lease. When the lock is free but another waiter is first in line, the
  bound is that waiter's deadline (or its turn's end, if it is ours), capped by the caller's
  own lease (Redisson returns 0 and spins).
* A waiter that gives up while first in line, and a script that drops a dead head, wake the
  new head if the lock is free (Redisson leaves it to its PTTL bound).
* The queue and timeout keys expire at their last deadline plus ``LINE_SLACK_MS``, set by
  every script that leaves anyone in line (Redisson's never expire: a line whose waiters died
  stayed until someone took the same name again).
* A waiter of ours has ``TURN_MS`` to take the lock once its turn began, not its allowance
  (docs/engine.md, invariant 50): the hash ``rlock_fair_ours:{<key>}`` (``naming.fair_ours``)
  marks our waiters in the line (owner -> 0) and, once the lock is free with one of them first,
  when that turn ends. Its scores in the timeout zset are Redisson's and left alone, so the
  deadline chain, its shifts and a Redisson waiter's deadline are what they were; a Redisson
  waiter (no field) is still dropped only at its deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from . import identity
from .aio import AsyncRLock
from .kinds import Kind, declare
from .lock import HoldKey, RLock, check_seconds
from .lockinfo import lease_text
from .lua import Script, source
from .naming import (
    FAIR_QUEUE_PREFIX,
    FAIR_TIMEOUT_PREFIX,
    UNLOCK_MESSAGE,
    fair_ours,
    fair_waiter_channel,
    prefix_name,
)
from .scripts import RENEW_SCRIPT, acall_once, call_once
from .watchdog import HoldKind

logger = logging.getLogger("django_rlock")

# -- Lua: ``lua/fair_*.lua`` (KEYS, ARGV and the reply in each file's header) ------------------
#: How long (ms) the queue and timeout keys outlive the last deadline in them (``keep()`` in
#: ``lua/_fair.lua``). Every script that leaves a line sets both keys to expire then: by that
#: time every waiter in it is one the next script would drop, so the line of a lock nobody
#: takes again does not stay in Redis for ever. The slack only absorbs rounding.
LINE_SLACK_MS = 1000

#: How long (ms) a waiter of ours first in line has to take the free lock once its turn began
#: (``begin()`` in ``lua/_fair.lua``: a release, the watchdog's end, a force unlock, the head
#: giving up, or an attempt of another waiter finding the lock free). A live waiter is woken
#: on its channel (or its park, bounded by the holder's PTTL, ends at the expiry) and takes it
#: within milliseconds; one that has not by then is taken for dead (or frozen) and dropped by
#: the next attempt behind it, which the turn's start woke to park until its end.
TURN_MS = 5000

_VALUES = {"SLACK_MS": LINE_SLACK_MS, "TURN_MS": TURN_MS}
FAIR_ACQUIRE = source("fair_acquire", **_VALUES)
FAIR_RELEASE = source("fair_release", **_VALUES)
FAIR_FORCE = source("fair_force", **_VALUES)
FAIR_END = source("fair_end", **_VALUES)
FAIR_GIVE_UP = source("fair_give_up", **_VALUES)

FAIR_ACQUIRE_SCRIPT = Script(FAIR_ACQUIRE)
FAIR_RELEASE_SCRIPT = Script(FAIR_RELEASE)
FAIR_FORCE_SCRIPT = Script(FAIR_FORCE)
FAIR_END_SCRIPT = Script(FAIR_END)
FAIR_GIVE_UP_SCRIPT = Script(FAIR_GIVE_UP)

#: The allowance (ms) of the acquire call in progress: 0 for a no-wait attempt. Set per call,
#: read where the script's arguments are built (threads each have their own context; asyncio
#: copies it into the task that sends the round trip).
_allowance: ContextVar[int | None] = ContextVar("django_rlock_fair_allowance", default=None)




class _Fair:
    """What FairLock and AsyncFairLock share: scripts, keys, the allowance, no barging."""

    _ACQUIRE = FAIR_ACQUIRE_SCRIPT
    _RELEASE = FAIR_RELEASE_SCRIPT
    _FORCE = FAIR_FORCE_SCRIPT
    # Only the queue decides who is next: no in-process hand-off past it.
    _HANDOFF = False

    key: str
    name: str
    _index: str
    _channel: bytes
    _acquire_keys: tuple[Any, ...]
    _release_keys: tuple[Any, ...]
    _field: Callable[[], str]

    def _fair_setup(self, thread_wait_time: float) -> None:
        twt = check_seconds(thread_wait_time, "thread_wait_time", self.name, zero_ok=False)
        self.thread_wait_time = twt
        self._thread_wait_ms = max(1, math.ceil(twt * 1000))
        #: Redisson's names (the brace rule keeps them in the lock's cluster slot).
        self.queue_key = prefix_name(FAIR_QUEUE_PREFIX, self.key)
        self.timeout_key = prefix_name(FAIR_TIMEOUT_PREFIX, self.key)
        #: Ours: which waiters in the line are django-rlock's (``TURN_MS``), in the slot too.
        self.ours_key = fair_ours(self.key)
        keys = (self.key, self._channel, self._index, self.queue_key, self.timeout_key,
                self.ours_key)
        self._acquire_keys = keys
        self._release_keys = keys

    def _allowance_ms(self, wait: float | None) -> int:
        """A waiter's allowance: ``thread_wait_time``, or its budget when shorter; 0 for one
        attempt (never queued)."""
        if wait == 0:
            return 0
        if wait is None:
            return self._thread_wait_ms
        return min(self._thread_wait_ms, max(1, math.ceil(wait * 1000)))

    def _acquire_args(self, k: HoldKey, lease_ms: int | None, claim: bool = False) -> tuple[Any, ...]:
        # No hand-off, so nothing to claim.
        ms, field, info = super()._acquire_args(k, lease_ms)[:3]  # type: ignore[misc]
        allowance = _allowance.get()
        if allowance is None:
            allowance = self._thread_wait_ms
        return (ms, field, identity.with_kind(info, "fair"), allowance, UNLOCK_MESSAGE)

    def _wait_channel(self, field: str) -> bytes:
        return fair_waiter_channel(self.key, field).encode()  # one naming module (invariant 17)

    def _park_first_until(self, k: HoldKey, wait: float | None) -> float:
        # Fairness is the script's job: the first attempt queues the caller at once.
        return 0.0

    def _give_up_args(self, allowance: int) -> tuple[Any, ...]:
        return (self._field(), allowance, UNLOCK_MESSAGE)

    @property
    def _hold_kind(self) -> HoldKind:
        # Read where the owner registers its hold (its own thread or task).
        return HoldKind(RENEW_SCRIPT, self.key, FAIR_END_SCRIPT, (self._field(), UNLOCK_MESSAGE))


class FairLock(_Fair, RLock):
    """A reentrant lock (the ``RLock`` API) granted in arrival order across threads,
    processes and hosts.

    ``thread_wait_time`` (seconds): Redisson's ``fairLockWaitTimeout``, each waiter's
    allowance in the deadline chain (or its wait budget when shorter): a waiter still queued
    when its deadline passes (a lock held longer than this) is dropped and joins again at the
    back on its next attempt. A waiter of ours that crashes in line holds the free lock up for
    ``TURN_MS`` (5 s) after its turn came, not its allowance; a Redisson client's, for its
    allowance.
    ``try_lock(0)`` / ``acquire(blocking=False)`` make one attempt and never queue: they get
    the lock only if it is free and nobody waits.
    """

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, thread_wait_time: float = 300.0, **kwargs: Any) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, **kwargs)
        self._fair_setup(thread_wait_time)

    def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        allowance = self._allowance_ms(wait)
        reset = _allowance.set(allowance)
        got = False
        try:
            got = super()._acquire(wait, lease_ms)
            return got
        finally:
            _allowance.reset(reset)
            if not got and allowance:
                # Gave up (budget spent, an error, interrupted): leave the line at once.
                try:
                    call_once(self._client, FAIR_GIVE_UP_SCRIPT, self._release_keys,
                              self._give_up_args(allowance))
                except Exception as err:  # its deadline drops it soon anyway
                    logger.debug("django-rlock: fair lock %r: leaving the queue failed: %s",
                                 self.name, err)

    def __enter__(self) -> FairLock:
        self.lock()
        return self


class AsyncFairLock(_Fair, AsyncRLock):
    """``FairLock`` for asyncio: the ``AsyncRLock`` API, owned by the task. A waiting task
    that is cancelled leaves the queue before the cancellation goes on."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, thread_wait_time: float = 300.0, **kwargs: Any) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, **kwargs)
        self._fair_setup(thread_wait_time)

    async def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        allowance = self._allowance_ms(wait)
        reset = _allowance.set(allowance)
        got = False
        try:
            got = await super()._acquire(wait, lease_ms)
            return got
        finally:
            _allowance.reset(reset)
            if not got and allowance:
                # Shielded: a second cancellation must not leave us in the line.
                fut = asyncio.ensure_future(acall_once(
                    self._client, FAIR_GIVE_UP_SCRIPT, self._release_keys,
                    self._give_up_args(allowance)))
                try:
                    await asyncio.shield(fut)
                except asyncio.CancelledError:
                    self._spawn(fut)  # keep it alive until it lands
                    raise
                except Exception as err:
                    logger.debug("django-rlock: fair lock %r: leaving the queue failed: %s",
                                 self.name, err)

    async def __aenter__(self) -> AsyncFairLock:
        await self.lock()
        return self


__all__ = ["AsyncFairLock", "FairLock"]


def _fair_details(probe: dict[str, Any], detail: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"queue_length": probe["queue_length"]}
    if detail:
        out["queue"] = probe["queue"]
    return out


def _fair_lines(d: dict[str, Any]) -> list[str]:
    return [f"queue length: {d['queue_length']}"] + [
        f"  {i}. {w['owner']} (times out in {lease_text(w['timeout'])})"
        for i, w in enumerate(d.get("queue", ()), 1)]


KIND = declare(Kind(
    "fair", "hash",
    note="Its queue of waiters stays: the head of the queue is woken and takes the lock, the "
         "others keep their places (Redisson's forceUnlock).",
    open=FairLock, locks={"fair": FairLock}, async_locks={"fair": AsyncFairLock},
    detect=lambda probe: bool(probe["queue_length"] or probe["fair_size"]),
    details=_fair_details,
    summary=lambda d: f"queue {d['queue_length']}",
    lines=_fair_lines))
