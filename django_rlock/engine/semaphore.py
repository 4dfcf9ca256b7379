"""Semaphore and PermitExpirableSemaphore: Redisson's ``RSemaphore`` / ``RPermitExpirableSemaphore``.

Redisson's layout, so Java and Node clients share the very same permits:

- ``Semaphore``: the string ``<key>`` holds the permits available; every change that frees
  permits publishes the new count on ``redisson_sc:{<key>}``. Permits have no owner and no
  lease: a holder that crashes keeps its permits for good (as in Redisson).
- ``PermitExpirableSemaphore``: the string ``<key>`` holds the permits available, the zset
  ``{<key>}:timeout`` the permits taken (member: the permit id's 16 raw bytes, shown to
  callers as 32 hex chars; score: expiry in ms, server time), same channel. Every script that
  changes it first reclaims expired ids (drops them, counts them back, publishes). A permit
  taken without a lease is renewed by the process's watchdog until released, so a crashed
  holder's permit comes back within ``watchdog_timeout`` (unlike Redisson's plain semaphore).

Neither is a lock: there is no owner field and no hand-off. Both wait with the engine's one
wait loop (``waiting``) on the process's one subscription, and a message (the permits now
free) wakes that many waiters (``pubsub.wake_count``). Permits can change with no message (a
permit expiring, a count set by hand, a message lost over a reconnect), so every park is
bounded: by the nearest permit expiry where there is one, and by ``RECHECK`` seconds always.

``_Named`` is what these non-lock kinds share with ``latch.CountDownLatch``: validation before
any Redis command, names, the index entry, and the sync/asyncio client pair.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from .clients import SlotBound, async_twin, check_client, is_cluster_node, sync_twin
from .errors import LockNotOwnedError
from .lock import check_name, check_seconds
from .naming import SEMAPHORE_CHANNEL_PREFIX, index_key, prefix_name, suffix_name
from .scripts import _STAMP, Script, acall_once, call, call_once
from .wait import loop as waiting
from .wait.channel import wake_count
from .watchdog import HoldKind, server_id, watchdog

logger = logging.getLogger("django_rlock")

#: Longest a waiter parks without re-checking (seconds). A lost message (a reconnect), a
#: count changed by hand or by a client that does not publish, or an expiry nobody reclaimed
#: yet would otherwise leave it waiting for a message that never comes.
RECHECK = 5.0

#: Background tasks (permits given back after a twice-cancelled acquire): kept alive.
_background: set[asyncio.Future[Any]] = set()


# -- Lua shared by the kinds -------------------------------------------------------------------
def _made(kind: str) -> str:
    """``made(key, index)``: list ``key`` in the index if it does not exist yet (call it just
    before a write that may create it)."""
    return """
local function made(key, index)
  if redis.call('exists', key) == 0 then
    """ + _STAMP + """
    redis.call('hset', index, key, stamp .. ' KIND')
  end
end
""".replace("KIND", '{"kind":"' + kind + '"}')


# Milliseconds of server time, and a permit id (32 hex chars) as its 16 raw bytes.
_NOW = """
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function raw(hex)
  return (string.gsub(hex, '..', function(c) return string.char(tonumber(c, 16)) end))
end
local function ms(x) return string.format('%.0f', x) end
"""

# -- Semaphore ---------------------------------------------------------------------------------
_SEM = _made("semaphore")

# KEYS[1] key; ARGV[1] permits. Reply 1 = taken, 0 = not enough.
SEM_ACQUIRE = """
local v = redis.call('get', KEYS[1])
if v ~= false and tonumber(v) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

# KEYS[1] key, KEYS[2] channel, KEYS[3] index; ARGV[1] permits. Reply: permits now.
SEM_RELEASE = _SEM + """
made(KEYS[1], KEYS[3])
local v = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], v)
return v
"""

# KEYS as SEM_RELEASE; ARGV[1] permits. Reply 1 = set (it had none), 0 = kept its own.
SEM_TRY_SET = _SEM + """
if redis.call('exists', KEYS[1]) == 1 then return 0 end
made(KEYS[1], KEYS[3])
redis.call('set', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
"""

# KEYS as SEM_RELEASE; ARGV[1] permits to add (may be negative). Reply: permits now.
SEM_ADD = _SEM + """
made(KEYS[1], KEYS[3])
local v = tonumber(redis.call('get', KEYS[1]) or 0) + tonumber(ARGV[1])
redis.call('set', KEYS[1], v)
redis.call('publish', KEYS[2], v)
return v
"""

# KEYS[1] key. Reply: the permits taken (all there were).
SEM_DRAIN = """
local v = redis.call('get', KEYS[1])
if v == false then return 0 end
redis.call('set', KEYS[1], 0)
return tonumber(v)
"""

# KEYS[1..n-1] keys, KEYS[n] index. Reply: keys deleted.
DELETE = """
local n = 0
for i = 1, #KEYS - 1 do n = n + redis.call('del', KEYS[i]) end
redis.call('hdel', KEYS[#KEYS], KEYS[1])
return n
"""

# -- PermitExpirableSemaphore ------------------------------------------------------------------
# KEYS[1] key (available), KEYS[2] timeout zset, KEYS[3] channel, KEYS[4] index in every script.
_PES = _made("permits") + _NOW + """
local function reclaim(now)
  local n = redis.call('zremrangebyscore', KEYS[2], '-inf', ms(now))
  if n > 0 then
    made(KEYS[1], KEYS[4])
    redis.call('publish', KEYS[3], redis.call('incrby', KEYS[1], n))
  end
end
local now = now_ms()
"""

# ARGV[1] permit id (hex), ARGV[2] lease ms. Reply: nil = taken; else ms to the nearest expiry
# of a taken permit (-1: none has one).
PES_ACQUIRE = _PES + """
reclaim(now)
local v = redis.call('get', KEYS[1])
if v ~= false and tonumber(v) >= 1 then
  redis.call('decr', KEYS[1])
  redis.call('zadd', KEYS[2], ms(now + tonumber(ARGV[2])), raw(ARGV[1]))
  local ttl = redis.call('pttl', KEYS[1])
  if ttl > 0 then redis.call('pexpire', KEYS[2], ttl) end
  return nil
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[2] then return math.max(0, tonumber(first[2]) - now) end
return -1
"""

# ARGV[1] permit id (hex). Reply 1 = released (and published), 0 = unknown or expired.
PES_RELEASE = _PES + """
reclaim(now)
if redis.call('zrem', KEYS[2], raw(ARGV[1])) == 0 then return 0 end
made(KEYS[1], KEYS[4])
redis.call('publish', KEYS[3], redis.call('incrby', KEYS[1], 1))
return 1
"""

# ARGV[1] permit id (hex), ARGV[2] lease ms. Reply 1 = its expiry is now + lease, 0 = unknown.
PES_UPDATE = _PES + """
reclaim(now)
if not redis.call('zscore', KEYS[2], raw(ARGV[1])) then return 0 end
redis.call('zadd', KEYS[2], 'XX', ms(now + tonumber(ARGV[2])), raw(ARGV[1]))
return 1
"""

# ARGV[1] permits. Reply 1 = set, 0 = it has a count already. A semaphore whose counter is gone
# while permits are still out (the key alone deleted) counts those as taken: at most ARGV[1]
# permits are ever out at once. Expired ones are dropped (nothing counts them back).
PES_TRY_SET = _PES + """
if redis.call('exists', KEYS[1]) == 1 then
  reclaim(now)
  return 0
end
redis.call('zremrangebyscore', KEYS[2], '-inf', ms(now))
local v = tonumber(ARGV[1]) - redis.call('zcard', KEYS[2])
made(KEYS[1], KEYS[4])
redis.call('set', KEYS[1], v)
redis.call('publish', KEYS[3], v)
return 1
"""

# ARGV[1] permits to add (may be negative). Reply: permits available now.
PES_ADD = _PES + """
reclaim(now)
made(KEYS[1], KEYS[4])
local v = tonumber(redis.call('get', KEYS[1]) or 0) + tonumber(ARGV[1])
redis.call('set', KEYS[1], v)
redis.call('publish', KEYS[3], v)
return v
"""

# Reply: permits available (expired ones counted back first).
PES_AVAILABLE = _PES + """
reclaim(now)
return tonumber(redis.call('get', KEYS[1]) or 0)
"""

# The watchdog's renewal: KEYS = timeout zsets, ARGV = (permit id hex, lease ms) per key.
# Reply: 1 per permit still there (its expiry moved to now + lease), else 0 (lost).
PES_RENEW = _NOW + """
local now = now_ms()
local result = {}
for i = 1, #KEYS do
  local id = raw(ARGV[2 * i - 1])
  if redis.call('zscore', KEYS[i], id) then
    redis.call('zadd', KEYS[i], 'XX', ms(now + tonumber(ARGV[2 * i])), id)
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""

SEM_ACQUIRE_SCRIPT = Script(SEM_ACQUIRE)
SEM_RELEASE_SCRIPT = Script(SEM_RELEASE)
SEM_TRY_SET_SCRIPT = Script(SEM_TRY_SET)
SEM_ADD_SCRIPT = Script(SEM_ADD)
SEM_DRAIN_SCRIPT = Script(SEM_DRAIN)
DELETE_SCRIPT = Script(DELETE)
PES_ACQUIRE_SCRIPT = Script(PES_ACQUIRE)
PES_RELEASE_SCRIPT = Script(PES_RELEASE)
PES_UPDATE_SCRIPT = Script(PES_UPDATE)
PES_TRY_SET_SCRIPT = Script(PES_TRY_SET)
PES_ADD_SCRIPT = Script(PES_ADD)
PES_AVAILABLE_SCRIPT = Script(PES_AVAILABLE)
PES_RENEW_SCRIPT = Script(PES_RENEW)


# -- what the non-lock kinds share -------------------------------------------------------------
class _Named(SlotBound):
    """Validation, names and the client pair of a semaphore or latch.

    A sync object sends on ``client`` and waits on it; an asyncio one sends on its
    ``redis.asyncio`` client and waits (and renews) through a sync twin of it
    (``clients.sync_twin``, or ``sync_client``), like ``AsyncRLock``.
    """

    #: What it is called in error messages, and its kind in the index.
    _WHAT = "semaphore"
    #: How many local waiters one message on its channel wakes.
    _WAKES = staticmethod(wake_count)
    #: Longest park without a re-check (seconds).
    _RECHECK = RECHECK

    def __init__(self, client: Any, name: str, prefix: str, *, aio: bool = False,
                 sync_client: Any = None) -> None:
        check_name(name)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__} "
                            f"({self._WHAT} {name!r})")
        for c in (client, sync_client):
            if c is not None:
                check_client(c, f"{self._WHAT} {name!r}", cluster_ok=c is client, aio=aio)
        if client is None:
            raise TypeError(f"client must be a redis-py client, not NoneType "
                            f"({self._WHAT} {name!r})")
        self.name = name
        self.prefix = prefix
        self.key = prefix + name
        self._aio = aio
        client = self._bind(client)  # on a cluster: its slot's master (a sync client)
        self._index = index_key(prefix, self.key if is_cluster_node(client) else None)
        if self._cluster is not None:
            sync_client = client
        elif sync_client is None:
            sync_client = sync_twin(client) if aio else client
        self._sync_client = sync_client
        self._server = server_id(sync_client)
        self._channel = prefix_name(SEMAPHORE_CHANNEL_PREFIX, self.key).encode()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} key={self.key!r}>"

    @property
    def client(self) -> Any:
        return self._client

    @property
    def _client(self) -> Any:
        # An asyncio one on a cluster: the asyncio twin (for the running loop) of the slot
        # master's client.
        node = SlotBound._client.fget(self)  # type: ignore[attr-defined]
        return async_twin(node) if self._aio and self._cluster is not None else node

    @property
    def channel(self) -> str:
        """The pub/sub channel its changes are published on."""
        return self._channel.decode()

    # -- validation (before any Redis command) ---------------------------------------------
    def _count(self, n: Any, what: str = "permits", *, negative_ok: bool = False,
               least: int = 0) -> int:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"{what} must be an int, not {type(n).__name__} "
                            f"({self._WHAT} {self.name!r})")
        if n < least and not negative_ok:
            raise ValueError(f"{what} must be >= {least}, got {n!r} ({self._WHAT} {self.name!r})")
        return n

    def _budget(self, wait_time: Any, what: str = "wait_time") -> float | None:
        """Seconds to wait (None: no limit)."""
        if wait_time is None:
            return None
        w = check_seconds(wait_time, what, self.name, zero_ok=True, inf_ok=True)
        return None if math.isinf(w) else w

    # -- waiting ---------------------------------------------------------------------------
    def _wait(self) -> waiting.Wait:
        self._fresh()  # on a cluster, an attempt redirected: subscribe where the slot is now
        return waiting.Wait(self._sync_client, self._channel, self.key, wakes=self._WAKES,
                            recheck=self._RECHECK, moved=self._moved_check())

    def _bound(self, ttl: int) -> int:
        """A wait bound in ms from Redis, capped so a lost message costs ``RECHECK`` at most."""
        cap = int(self._RECHECK * 1000)
        return -1 if ttl < 0 or ttl > cap else ttl

    def _waits(self, attempt: Callable[[], int | None], budget: float | None) -> bool:
        """One attempt, then the shared wait loop for what is left of ``budget``."""
        if attempt() is None:
            return True
        if budget == 0:
            return False
        return waiting.wait(self._wait(), lambda claim: attempt(), budget)

    async def _awaits(self, attempt: Callable[[], Awaitable[int | None]],
                      budget: float | None) -> bool:
        if await attempt() is None:
            return True
        if budget == 0:
            return False

        async def again(claim: bool) -> int | None:
            return await attempt()

        return await waiting.await_(self._wait(), again, budget)


async def _uncancellable(send: Callable[[], Awaitable[int | None]],
                         undo: Callable[[], Awaitable[Any]]) -> int | None:
    """One acquire round trip that a cancellation cannot split.

    ``send`` resolves to None (taken) or a wait bound. If the caller is cancelled while it is
    in flight, the round trip still lands; what it took is given back (``undo``) before the
    cancellation goes on, so a cancelled waiter never keeps a permit nobody knows about.
    """
    fut = asyncio.ensure_future(send())
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        try:
            ttl = await asyncio.shield(fut)
        except asyncio.CancelledError:  # cancelled twice: give it back when it lands
            fut.add_done_callback(lambda f: _undo_later(f, undo))
            raise
        except Exception:
            raise asyncio.CancelledError from None
        if ttl is None:
            try:
                await undo()
            except Exception as exc:
                logger.warning("django-rlock: could not give back a permit taken by a cancelled "
                               "acquire (%s: %s)", type(exc).__name__, exc)
        raise


def _undo_later(fut: asyncio.Future[Any], undo: Callable[[], Awaitable[Any]]) -> None:
    if fut.cancelled() or fut.exception() is not None or fut.result() is not None:
        return
    task = asyncio.ensure_future(undo())
    _background.add(task)
    task.add_done_callback(_background.discard)


# -- Semaphore ---------------------------------------------------------------------------------
class _SemaphoreBase(_Named):
    def __init__(self, client: Any, name: str, prefix: str = "", *, aio: bool = False,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=aio, sync_client=sync_client)
        self._keys = (self.key, self._channel, self._index)

    def _ttl_of(self, reply: Any) -> int | None:
        return None if int(reply) == 1 else -1


class Semaphore(_SemaphoreBase):
    """Redisson's ``RSemaphore``: a count of permits shared by every client of the key.

    Permits have no owner: any caller may release any number (a release beyond the count set
    raises it), and a holder that dies keeps its permits (use ``PermitExpirableSemaphore``
    where that matters). May be used without ``try_set_permits``: it starts at 0.
    ``with sem:`` takes one permit and gives it back.
    """

    def try_set_permits(self, permits: int) -> bool:
        """Set the count if the semaphore has none yet; True if it was set."""
        n = self._count(permits)
        return bool(call_once(self._client, SEM_TRY_SET_SCRIPT, self._keys, (n,)))

    def add_permits(self, permits: int) -> None:
        """Add to the count (negative: take away; the count may go below zero)."""
        n = self._count(permits, negative_ok=True)
        call_once(self._client, SEM_ADD_SCRIPT, self._keys, (n,))

    def acquire(self, permits: int = 1) -> None:
        """Take ``permits``, waiting as long as it takes."""
        self._take(self._count(permits), None)

    def try_acquire(self, permits: int = 1, wait_time: float = 0.0) -> bool:
        """Take ``permits`` within ``wait_time`` seconds (0: one attempt); True if taken."""
        return self._take(self._count(permits), self._budget(wait_time))

    def _take(self, n: int, budget: float | None) -> bool:
        if n == 0:
            return True

        def attempt() -> int | None:
            return self._ttl_of(call_once(self._client, SEM_ACQUIRE_SCRIPT, (self.key,), (n,)))

        return self._waits(attempt, budget)

    def release(self, permits: int = 1) -> None:
        """Give ``permits`` back (publishing the count now, which wakes that many waiters)."""
        n = self._count(permits)
        if n:
            call_once(self._client, SEM_RELEASE_SCRIPT, self._keys, (n,))

    def available_permits(self) -> int:
        return int(self._reader.get(self.key) or 0)

    def drain_permits(self) -> int:
        """Take every permit available; returns how many that was."""
        return int(call_once(self._client, SEM_DRAIN_SCRIPT, (self.key,), ()))

    def delete(self) -> bool:
        """Delete the semaphore (its count); True if there was one."""
        return bool(call(self._client, DELETE_SCRIPT, (self.key, self._index), ()))

    def __enter__(self) -> Semaphore:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class AsyncSemaphore(_SemaphoreBase):
    """``Semaphore`` for asyncio (``redis.asyncio`` client). A cancelled ``acquire`` never
    keeps a permit: one its round trip took as it was cancelled is given back first."""

    def __init__(self, client: Any, name: str, prefix: str = "", *,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=True, sync_client=sync_client)

    async def try_set_permits(self, permits: int) -> bool:
        n = self._count(permits)
        return bool(await acall_once(self._client, SEM_TRY_SET_SCRIPT, self._keys, (n,)))

    async def add_permits(self, permits: int) -> None:
        n = self._count(permits, negative_ok=True)
        await acall_once(self._client, SEM_ADD_SCRIPT, self._keys, (n,))

    async def acquire(self, permits: int = 1) -> None:
        await self._take(self._count(permits), None)

    async def try_acquire(self, permits: int = 1, wait_time: float = 0.0) -> bool:
        return await self._take(self._count(permits), self._budget(wait_time))

    async def _take(self, n: int, budget: float | None) -> bool:
        if n == 0:
            return True

        async def send() -> int | None:
            return self._ttl_of(await acall_once(self._client, SEM_ACQUIRE_SCRIPT, (self.key,),
                                                 (n,)))

        async def undo() -> None:
            await acall_once(self._client, SEM_RELEASE_SCRIPT, self._keys, (n,))

        return await self._awaits(lambda: _uncancellable(send, undo), budget)

    async def release(self, permits: int = 1) -> None:
        n = self._count(permits)
        if n:
            # Shielded: a cancelled caller's release still lands (or the permits would leak).
            await asyncio.shield(acall_once(self._client, SEM_RELEASE_SCRIPT, self._keys, (n,)))

    async def available_permits(self) -> int:
        return int(await self._reader.get(self.key) or 0)

    async def drain_permits(self) -> int:
        return int(await acall_once(self._client, SEM_DRAIN_SCRIPT, (self.key,), ()))

    async def delete(self) -> bool:
        return bool(await acall_once(self._client, DELETE_SCRIPT, (self.key, self._index), ()))

    async def __aenter__(self) -> AsyncSemaphore:
        await self.acquire()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.release()


# -- PermitExpirableSemaphore ------------------------------------------------------------------
def new_permit_id() -> str:
    """A permit id: 16 random bytes as 32 hex chars (Redisson's form)."""
    return os.urandom(16).hex()


class _PermitsBase(_Named):
    _WHAT = "semaphore"

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, aio: bool = False, sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=aio, sync_client=sync_client)
        wt = check_seconds(watchdog_timeout, "watchdog_timeout", name, zero_ok=False)
        self.watchdog_timeout = wt
        self._watchdog_ms = max(1, math.ceil(wt * 1000))
        #: Redisson's ``{<key>}:timeout``: the permits taken and when each expires.
        self.timeout_key = suffix_name(self.key, "timeout")
        self._keys = (self.key, self.timeout_key, self._channel, self._index)

    def _lease_ms(self, lease_time: Any) -> int | None:
        if lease_time is None:
            return None
        lease = check_seconds(lease_time, "lease_time", self.name, zero_ok=False)
        return max(1, math.ceil(lease * 1000))

    def _permit(self, permit_id: Any) -> str:
        if not isinstance(permit_id, str):
            raise TypeError(f"permit_id must be a str, not {type(permit_id).__name__} "
                            f"(semaphore {self.name!r})")
        try:
            ok = len(permit_id) == 32 and len(bytes.fromhex(permit_id)) == 16
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"permit_id must be 32 hex chars, got {permit_id!r} "
                             f"(semaphore {self.name!r})")
        return permit_id.lower()

    def _hold_key(self, permit_id: str) -> tuple[Any, str, str]:
        return (self._server, self.key, permit_id)

    def _renewed(self, permit_id: str, sent: float) -> bool:
        """A permit taken without a lease: the watchdog renews it until it is released or
        the process dies. Not tied to the thread or task that took it (anyone may release
        it, and it outlives them), so no owner is watched. Its lease counts from ``sent``,
        when the acquire went out (invariant 31). False: the reply came after half the lease
        (a frozen process), so it must be checked (``_late_check``) before it counts."""
        self._fresh()  # renewed where the slot is now (a redirected acquire)
        watchdog().acquired(
            self._hold_key(permit_id), self._sync_client, self.name, self._watchdog_ms, True,
            self.watchdog_timeout, None, scripts_keys=self._keys,
            kind=HoldKind(PES_RENEW_SCRIPT, self.timeout_key, PES_RELEASE_SCRIPT, (permit_id,)),
            since=sent)
        return time.monotonic() - sent <= self._watchdog_ms / 2000.0

    def _late_checked(self, permit_id: str, sent: float, reply: Any) -> int | None:
        """The check of a permit whose reply came late: None (still ours, its lease set again
        from ``sent``), or 0 (gone while its process could not run: unbooked, try again)."""
        k = self._hold_key(permit_id)
        hold = watchdog().get(k)
        if reply and int(reply[0]):
            if hold is not None:
                watchdog().confirmed(k, hold, sent, self._watchdog_ms)
            return None
        if hold is not None:
            watchdog().discard(k, hold)
        logger.info("django-rlock: a permit of %r ran out before its process could run; "
                    "never held, trying again", self.name)
        return 0

    def _unrenewed(self, permit_id: str) -> None:
        watchdog().forget(self._hold_key(permit_id))

    def _ttl_of(self, reply: Any) -> int | None:
        return None if reply is None else self._bound(int(reply))

    def _not_released(self, permit_id: str) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"cannot release permit {permit_id} of semaphore {self.name!r}: it has already been "
            f"released, it expired, or it never existed", self.name)


class PermitExpirableSemaphore(_PermitsBase):
    """Redisson's ``RPermitExpirableSemaphore``: each permit taken has an id and an expiry.

    ``acquire(lease_time)`` returns the permit's id (32 hex chars); pass it to ``release``.
    With ``lease_time=None`` the permit is renewed by this process's watchdog (every
    ``watchdog_timeout / 3``) until released, so it comes back within ``watchdog_timeout``
    if the process dies; with a lease it comes back when the lease ends. A permit is not the
    thread's: any thread or process may release it by id (a renewed permit released
    elsewhere is logged as lost by this process's watchdog at its next renewal, and no
    longer renewed). ``update_lease_time`` gives a permit a fixed lease: no longer renewed.
    The semaphore must be given permits first (``try_set_permits`` / ``add_permits``).
    """

    def __init__(self, client: Any, name: str, prefix: str = "",
                 watchdog_timeout: float = 30.0) -> None:
        super().__init__(client, name, prefix, watchdog_timeout)

    def try_set_permits(self, permits: int) -> bool:
        """Set the count if the semaphore has none yet; True if it was set."""
        n = self._count(permits)
        return bool(call_once(self._client, PES_TRY_SET_SCRIPT, self._keys, (n,)))

    def add_permits(self, permits: int) -> None:
        """Add to the count (negative: take away; it may go below zero)."""
        n = self._count(permits, negative_ok=True)
        call_once(self._client, PES_ADD_SCRIPT, self._keys, (n,))

    def acquire(self, lease_time: float | None = None) -> str:
        """Take a permit, waiting as long as it takes; returns its id."""
        return self._take(None, self._lease_ms(lease_time))  # type: ignore[return-value]

    def try_acquire(self, wait_time: float = 0.0, lease_time: float | None = None) -> str | None:
        """Take a permit within ``wait_time`` seconds (0: one attempt); its id, or None."""
        budget = self._budget(wait_time)
        return self._take(budget, self._lease_ms(lease_time))

    def _take(self, budget: float | None, lease_ms: int | None) -> str | None:
        permit_id = new_permit_id()
        ms = self._watchdog_ms if lease_ms is None else lease_ms

        def attempt() -> int | None:
            sent = time.monotonic()
            ttl = self._ttl_of(call_once(self._client, PES_ACQUIRE_SCRIPT, self._keys,
                                         (permit_id, ms)))
            if ttl is None and lease_ms is None and not self._renewed(permit_id, sent):
                again = time.monotonic()
                return self._late_checked(permit_id, again, call_once(
                    self._client, PES_RENEW_SCRIPT, (self.timeout_key,), (permit_id, ms)))
            return ttl

        return permit_id if self._waits(attempt, budget) else None

    def release(self, permit_id: str) -> None:
        """Give the permit back. Raises ``LockNotOwnedError`` (a ``LockError``) if it was
        released already, has expired, or never existed."""
        if not self.try_release(permit_id):
            raise self._not_released(permit_id)

    def try_release(self, permit_id: str) -> bool:
        """Give the permit back; False if it was released already, expired or never existed."""
        pid = self._permit(permit_id)
        self._unrenewed(pid)  # in doubt (an error), it expires within the watchdog timeout
        return bool(call_once(self._client, PES_RELEASE_SCRIPT, self._keys, (pid,)))

    def update_lease_time(self, permit_id: str, lease_time: float) -> bool:
        """Make the permit expire ``lease_time`` seconds from now (no longer renewed by the
        watchdog); False if it was released, expired or never existed."""
        pid = self._permit(permit_id)
        ms = self._lease_ms(lease_time)
        if ms is None:
            raise TypeError(f"lease_time must be a number of seconds, not None "
                            f"(semaphore {self.name!r})")
        self._unrenewed(pid)
        return bool(call_once(self._client, PES_UPDATE_SCRIPT, self._keys, (pid, ms)))

    def available_permits(self) -> int:
        """Permits free now (expired permits are counted back first)."""
        return int(call(self._client, PES_AVAILABLE_SCRIPT, self._keys, ()))

    def delete(self) -> bool:
        """Delete the semaphore (count and taken permits); True if there was one."""
        return bool(call(self._client, DELETE_SCRIPT, (self.key, self.timeout_key, self._index),
                         ()))


class AsyncPermitExpirableSemaphore(_PermitsBase):
    """``PermitExpirableSemaphore`` for asyncio. Renewal is the process watchdog's (through a
    sync twin of the client); a permit is not tied to the task that took it. A cancelled
    ``acquire`` never keeps a permit."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, aio=True,
                         sync_client=sync_client)

    async def try_set_permits(self, permits: int) -> bool:
        n = self._count(permits)
        return bool(await acall_once(self._client, PES_TRY_SET_SCRIPT, self._keys, (n,)))

    async def add_permits(self, permits: int) -> None:
        n = self._count(permits, negative_ok=True)
        await acall_once(self._client, PES_ADD_SCRIPT, self._keys, (n,))

    async def acquire(self, lease_time: float | None = None) -> str:
        return await self._take(None, self._lease_ms(lease_time))  # type: ignore[return-value]

    async def try_acquire(self, wait_time: float = 0.0,
                          lease_time: float | None = None) -> str | None:
        budget = self._budget(wait_time)
        return await self._take(budget, self._lease_ms(lease_time))

    async def _take(self, budget: float | None, lease_ms: int | None) -> str | None:
        permit_id = new_permit_id()
        ms = self._watchdog_ms if lease_ms is None else lease_ms

        async def send() -> int | None:
            return self._ttl_of(await acall_once(self._client, PES_ACQUIRE_SCRIPT, self._keys,
                                                 (permit_id, ms)))

        async def undo() -> None:
            await acall_once(self._client, PES_RELEASE_SCRIPT, self._keys, (permit_id,))

        async def attempt() -> int | None:
            sent = time.monotonic()
            ttl = await _uncancellable(send, undo)
            if ttl is None and lease_ms is None and not self._renewed(permit_id, sent):
                again = time.monotonic()
                return self._late_checked(permit_id, again, await acall_once(
                    self._client, PES_RENEW_SCRIPT, (self.timeout_key,), (permit_id, ms)))
            return ttl

        return permit_id if await self._awaits(attempt, budget) else None

    async def release(self, permit_id: str) -> None:
        if not await self.try_release(permit_id):
            raise self._not_released(permit_id)

    async def try_release(self, permit_id: str) -> bool:
        pid = self._permit(permit_id)
        self._unrenewed(pid)
        return bool(await asyncio.shield(acall_once(self._client, PES_RELEASE_SCRIPT,
                                                    self._keys, (pid,))))

    async def update_lease_time(self, permit_id: str, lease_time: float) -> bool:
        pid = self._permit(permit_id)
        ms = self._lease_ms(lease_time)
        if ms is None:
            raise TypeError(f"lease_time must be a number of seconds, not None "
                            f"(semaphore {self.name!r})")
        self._unrenewed(pid)
        return bool(await acall_once(self._client, PES_UPDATE_SCRIPT, self._keys, (pid, ms)))

    async def available_permits(self) -> int:
        return int(await acall_once(self._client, PES_AVAILABLE_SCRIPT, self._keys, ()))

    async def delete(self) -> bool:
        return bool(await acall_once(self._client, DELETE_SCRIPT,
                                     (self.key, self.timeout_key, self._index), ()))


__all__ = ["AsyncPermitExpirableSemaphore", "AsyncSemaphore", "PermitExpirableSemaphore",
           "Semaphore", "RECHECK"]
