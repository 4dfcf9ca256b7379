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
  bound is that waiter's deadline, capped by the caller's own lease (Redisson returns 0 and
  spins).
* A waiter that gives up while first in line, and a script that drops a dead head, wake the
  new head if the lock is free (Redisson leaves it to its PTTL bound).
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
from .naming import FAIR_QUEUE_PREFIX, FAIR_TIMEOUT_PREFIX, UNLOCK_MESSAGE, prefix_name
from .scripts import _STAMP, RENEW_SCRIPT, Script, acall_once, call_once
from .watchdog import HoldKind

logger = logging.getLogger("django_rlock")

# -- Lua ----------------------------------------------------------------------------------------
# Every script: KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner),
# KEYS[3] index, KEYS[4] queue list, KEYS[5] timeout zset.
_LIB = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Drop the waiters first in line whose deadline has passed (or that have none); how many.
local function prune()
  local n = 0
  while true do
    local head = redis.call('lindex', KEYS[4], 0)
    if not head then return n end
    local s = tonumber(redis.call('zscore', KEYS[5], head))
    if s and s > now then return n end
    redis.call('lpop', KEYS[4])
    redis.call('zrem', KEYS[5], head)
    n = n + 1
  end
end
-- Wake the waiter first in line, on its own channel.
local function notify(msg)
  local head = redis.call('lindex', KEYS[4], 0)
  if head then redis.call('publish', KEYS[2] .. ':' .. head, msg) end
end
"""

# ARGV[1] lease ms, ARGV[2] owner, ARGV[3] holder info, ARGV[4] allowance ms (0: the no-wait
# variant, which never queues), ARGV[5] message.
# Reply: nil = acquired (new or reentrant); else how long (ms) the caller may park at most:
# the holder's PTTL (-1: no expiry), or, the lock being free with another waiter first in line,
# that waiter's time left (capped by the caller's lease).
FAIR_ACQUIRE = _LIB + """
local pruned = prune()
local head = redis.call('lindex', KEYS[4], 0)
local free = redis.call('exists', KEYS[1]) == 0
if free and (not head or head == ARGV[2]) then
  if head then
    redis.call('lpop', KEYS[4])
    redis.call('zrem', KEYS[5], ARGV[2])
    local wait = tonumber(ARGV[4])
    if wait > 0 then
      local rest = redis.call('zrange', KEYS[5], 0, -1)
      for i = 1, #rest do redis.call('zincrby', KEYS[5], -wait, rest[i]) end
    end
  end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  """ + _STAMP + """
  redis.call('hset', KEYS[3], KEYS[1], stamp .. ' ' .. ARGV[3])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if pruned > 0 and free then notify(ARGV[5]) end
local pttl = redis.call('pttl', KEYS[1])
local wait = tonumber(ARGV[4])
if wait == 0 then return math.max(0, pttl) end
if not redis.call('zscore', KEYS[5], ARGV[2]) then
  local last = redis.call('lindex', KEYS[4], -1)
  local base = last and tonumber(redis.call('zscore', KEYS[5], last))
  if not base then base = now + math.max(0, pttl) end
  if redis.call('zadd', KEYS[5], base + wait, ARGV[2]) == 1 then
    redis.call('rpush', KEYS[4], ARGV[2])
  end
end
if free then
  local s = tonumber(redis.call('zscore', KEYS[5], head)) or now
  return math.max(0, math.min(s - now, tonumber(ARGV[1])))
end
return pttl
"""

# ARGV[1] owner, ARGV[2] lease ms in force, ARGV[3] message.
# Reply: nil = not held by the owner (the head is woken if the lock is gone); 0 = still held;
# 1 = released (the head, if any, woken).
FAIR_RELEASE = _LIB + """
prune()
if redis.call('exists', KEYS[1]) == 0 then
  notify(ARGV[3])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return nil end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
notify(ARGV[3])
return 1
"""

# ARGV[1] message. Reply: 1 deleted (the head woken), 0 not locked. The queue stays. A key
# recreated as something else since a listing read it is left alone.
FAIR_FORCE = _LIB + """
if redis.call('type', KEYS[1]).ok ~= 'hash' then return 0 end
prune()
redis.call('hdel', KEYS[3], KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  notify(ARGV[1])
  return 1
end
return 0
"""

# The watchdog's release of a hold whose owner ended. ARGV[1] owner, ARGV[2] message.
# Reply: 1 deleted (the head woken), 0 not held by it.
FAIR_END = _LIB + """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
prune()
notify(ARGV[2])
return 1
"""

# Redisson's acquireFailed: a waiter gives up (budget spent, error, cancelled). ARGV[1] owner,
# ARGV[2] its allowance ms, ARGV[3] message. Everyone behind it moves up by its allowance; if it
# was first in line and the lock is free, the new head is woken. Reply: 1 left, 0 not queued.
FAIR_GIVE_UP = _LIB + """
local q = redis.call('lrange', KEYS[4], 0, -1)
local i = 1
while i <= #q and q[i] ~= ARGV[1] do i = i + 1 end
redis.call('zrem', KEYS[5], ARGV[1])
if i > #q then return 0 end
for j = i + 1, #q do redis.call('zincrby', KEYS[5], -tonumber(ARGV[2]), q[j]) end
redis.call('lrem', KEYS[4], 0, ARGV[1])
if i == 1 and redis.call('exists', KEYS[1]) == 0 then notify(ARGV[3]) end
return 1
"""

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
        keys = (self.key, self._channel, self._index, self.queue_key, self.timeout_key)
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
        return self._channel + b":" + field.encode()

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

    ``thread_wait_time`` (seconds): how long a waiter may stand first in line without taking
    the lock before it is taken for dead and dropped (Redisson's ``fairLockWaitTimeout``); a
    waiter that crashes holds the line up for at most that long. A live waiter dropped that
    way (a lock held longer than this) joins again at the back on its next attempt.
    ``try_lock(0)`` / ``acquire(blocking=False)`` make one attempt and never queue: they get
    the lock only if it is free and nobody waits.
    """

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, thread_wait_time: float = 300.0, **kwargs: Any) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, **kwargs)
        self._fair_setup(thread_wait_time)

    def _info(self, owner: str) -> str:
        return identity.thread_info(owner)

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

    def _info(self, owner: str) -> str:
        return identity.task_info(owner)

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
