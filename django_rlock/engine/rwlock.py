"""ReadWriteLock: Redisson's read-write lock (many readers or one writer, non-fair).

Redisson's layout, so Java and Node clients contend for the same lock: the hash ``<key>``
holds ``mode`` (``read`` | ``write``), one field per reader ``<owner>`` -> hold count and the
writer's ``<owner>:write`` -> hold count. Each read hold also has a string of its own,
``{key}:<owner>:rwlock_timeout:<k>`` (k = 1..count) with its own expiry, because read
expiry is per hold: a reader that dies leaves a field behind, and only its timeout keys
tell the others it is gone. Both locks wait on ``redisson_rwlock:{key}``; a read unlock
that frees the lock publishes ``0``, a write unlock ``1``, and every message wakes every
local waiter (several readers may enter together).

A writer may take read holds (downgrade); a reader may not take the write lock (upgrade):
it waits, as in Redisson. Each kind is a set of scripts on ``RLock`` / ``AsyncRLock``:
waiting, renewal, replica sync and bookkeeping are the engine's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import identity
from .aio import AsyncRLock
from .lock import HoldKey, RLock
from .naming import READ_UNLOCK_MESSAGE, RWLOCK_CHANNEL_PREFIX, UNLOCK_MESSAGE, prefix_name
from .scripts import _STAMP, RENEW_SCRIPT, Script
from .wait.channel import wake_all
from .watchdog import HoldKind

# -- Lua ----------------------------------------------------------------------------------------
# Names and sums every script needs. ``tkeys`` is naming.suffix_name(key, field +
# ":rwlock_timeout") (Redisson's brace rule): scripts must name *other* owners' timeout keys,
# which no caller could pass in (a test checks both agree).
_LIB = """
local function tkeys(key, field)
  if string.find(key, '{', 1, true) then return key .. ':' .. field .. ':rwlock_timeout' end
  return '{' .. key .. '}:' .. field .. ':rwlock_timeout'
end
-- The longest PTTL over every live read hold's timeout key (-2 or less: none is alive).
local function maxread(key)
  local m = -3
  local f = redis.call('hgetall', key)
  for i = 1, #f, 2 do
    local c = tonumber(f[i + 1])
    if f[i] ~= 'mode' and c and string.sub(f[i], -6) ~= ':write' then
      local p = tkeys(key, f[i])
      for k = 1, c do m = math.max(m, redis.call('pttl', p .. ':' .. k)) end
    end
  end
  return m
end
-- After a hold left: keep the hash as long as its longest live read hold (never shorter than
-- a writer's lease in write mode), or delete it, unlist it and publish when nothing is left.
-- Returns true if the lock still exists.
local function settle(key, channel, index, msg)
  local mode = redis.call('hget', key, 'mode')
  if redis.call('hlen', key) > 1 then
    local m = maxread(key)
    if mode == 'write' then
      if m > redis.call('pttl', key) then redis.call('pexpire', key, m) end
      return true
    end
    if m > 0 then
      redis.call('pexpire', key, m)
      return true
    end
  end
  redis.call('del', key)
  redis.call('hdel', index, key)
  redis.call('publish', channel, msg)
  return false
end
-- Drop every read hold's timeout key (force unlock).
local function dropreads(key)
  local f = redis.call('hgetall', key)
  for i = 1, #f, 2 do
    local c = tonumber(f[i + 1])
    if f[i] ~= 'mode' and c then
      local p = tkeys(key, f[i])
      for k = 1, c do redis.call('del', p .. ':' .. k) end
    end
  end
end
"""

# KEYS[1] hash, KEYS[2] index; ARGV[1] lease ms, ARGV[2] reader field <owner>, ARGV[3] holder
# info, ARGV[4] the same owner's writer field. Reply: nil = acquired, else the hash's PTTL.
# Readers enter in read mode, or in write mode when they are the writer (downgrade). The hash
# lives at least as long as its longest read hold.
READ_ACQUIRE = _LIB + """
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', tkeys(KEYS[1], ARGV[2]) .. ':1', 1, 'px', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  """ + _STAMP + """
  redis.call('hset', KEYS[2], KEYS[1], stamp .. ' ' .. ARGV[3])
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[4]) == 1) then
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', tkeys(KEYS[1], ARGV[2]) .. ':' .. n, 1, 'px', ARGV[1])
  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('pexpire', KEYS[1], ARGV[1])
  end
  return nil
end
return redis.call('pttl', KEYS[1])
"""

# KEYS[1] hash, KEYS[2] channel, KEYS[3] index; ARGV[1] reader field, ARGV[2] lease ms
# (unused: each read hold has its own expiry), ARGV[3] message, ARGV[4] (optional) "all": drop
# every hold of that owner (its thread or task ended).
# Reply: nil = not a reader; 0 = it still has read holds; 1 = it has none left.
READ_RELEASE = _LIB + """
local c = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if redis.call('hget', KEYS[1], 'mode') == false or not c then
  return nil
end
local p = tkeys(KEYS[1], ARGV[1])
local n = c - 1
if ARGV[4] == 'all' then n = 0 end
if n <= 0 then
  redis.call('hdel', KEYS[1], ARGV[1])
else
  redis.call('hset', KEYS[1], ARGV[1], n)
end
for k = math.max(n, 0) + 1, c do redis.call('del', p .. ':' .. k) end
if settle(KEYS[1], KEYS[2], KEYS[3], ARGV[3]) and n > 0 then
  return 0
end
return 1
"""

# Batched like RENEW: KEYS = hashes, ARGV = (reader field, lease ms) per key. Renews only
# that owner's own read holds (never another client's: Redisson #7098 renewed dead readers
# forever), and keeps the hash at least as long. Reply per key: 1 renewed, 0 lost (no field,
# or none of its timeout keys left: the others may already treat it as gone).
READ_RENEW = _LIB + """
local result = {}
for i = 1, #KEYS do
  local field, ms = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local c = tonumber(redis.call('hget', KEYS[i], field))
  local alive = 0
  if c then
    local p = tkeys(KEYS[i], field)
    for k = 1, c do alive = alive + redis.call('pexpire', p .. ':' .. k, ms) end
  end
  if alive > 0 then
    if redis.call('pttl', KEYS[i]) < ms then redis.call('pexpire', KEYS[i], ms) end
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""

# KEYS[1] hash, KEYS[2] index; ARGV[1] lease ms, ARGV[2] writer field <owner>:write, ARGV[3]
# holder info. Reply: nil = acquired, else the hash's PTTL. Reentry sets the lease like RLock's
# (Redisson adds it to the PTTL, which grows without bound), but never below the writer's own
# read holds.
WRITE_ACQUIRE = _LIB + """
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  """ + _STAMP + """
  redis.call('hset', KEYS[2], KEYS[1], stamp .. ' ' .. ARGV[3])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local ms = tonumber(ARGV[1])
  if redis.call('hlen', KEYS[1]) > 2 then ms = math.max(ms, redis.call('pttl', KEYS[1])) end
  redis.call('pexpire', KEYS[1], ms)
  return nil
end
return redis.call('pttl', KEYS[1])
"""

# KEYS[1] hash, KEYS[2] channel, KEYS[3] index; ARGV[1] writer field, ARGV[2] lease ms in
# force, ARGV[3] message, ARGV[4] (optional) "all" (the owner ended).
# Reply: nil = not the writer; 0 = still held; 1 = write lock released. If the writer still
# has read holds, the lock becomes a read lock (downgrade) and waiting readers are woken
# (Redisson publishes nothing then, so they would wait out the PTTL).
WRITE_RELEASE = _LIB + """
if redis.call('hget', KEYS[1], 'mode') ~= 'write' or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return nil
end
if ARGV[4] ~= 'all' and redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  local ms = tonumber(ARGV[2])
  if redis.call('hlen', KEYS[1]) > 2 then ms = math.max(ms, redis.call('pttl', KEYS[1])) end
  redis.call('pexpire', KEYS[1], ms)
  return 0
end
redis.call('hdel', KEYS[1], ARGV[1])
if redis.call('hlen', KEYS[1]) > 1 then
  redis.call('hset', KEYS[1], 'mode', 'read')
  if settle(KEYS[1], KEYS[2], KEYS[3], ARGV[3]) then
    redis.call('publish', KEYS[2], ARGV[3])
  end
  return 1
end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
redis.call('publish', KEYS[2], ARGV[3])
return 1
"""

# KEYS[1] hash, KEYS[2] channel, KEYS[3] index; ARGV[1] message, ARGV[2] the mode this lock
# deletes (a read lock's force-unlock leaves a write lock alone, and the reverse).
# Reply: 1 deleted, 0 not in that mode.
FORCE = _LIB + """
if redis.call('hget', KEYS[1], 'mode') ~= ARGV[2] then
  return 0
end
dropreads(KEYS[1])
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
"""

READ_ACQUIRE_SCRIPT = Script(READ_ACQUIRE)
READ_RELEASE_SCRIPT = Script(READ_RELEASE)
READ_RENEW_SCRIPT = Script(READ_RENEW)
WRITE_ACQUIRE_SCRIPT = Script(WRITE_ACQUIRE)
WRITE_RELEASE_SCRIPT = Script(WRITE_RELEASE)
FORCE_SCRIPT = Script(FORCE)

_WRITE = ":write"




class _RWKind:
    """Hooks both kinds share: the channel, the wake policy, no hand-off, no parking first."""

    _HANDOFF = False
    _WAKES = staticmethod(wake_all)
    _FORCE = FORCE_SCRIPT
    #: What this kind publishes when it frees the lock, and the mode its force-unlock deletes.
    _MESSAGE: str
    _MODE: str
    # Provided by LockBase.
    key: str
    _index: str
    _channel: bytes
    _release_keys: tuple[Any, ...]

    def _rw_setup(self) -> None:
        self._channel = prefix_name(RWLOCK_CHANNEL_PREFIX, self.key).encode()
        self._release_keys = (self.key, self._channel, self._index)

    def _park_first_until(self, k: HoldKey, wait: float | None) -> float:
        # Non-fair, as Redisson: readers and writers share one channel but want different
        # things, so a reader never queues behind a local writer waiting for readers to leave.
        return 0.0

    def _release_args(self, field: str, lease_ms: int) -> tuple[Any, ...]:
        return (field, lease_ms, self._MESSAGE)

    def _force_args(self) -> tuple[Any, ...]:
        return (self._MESSAGE, self._MODE)

    def _forced(self, r: Any, before: list[Any]) -> bool:
        # A force-unlock that found the other mode deleted nothing: this process's holds stand.
        return super()._forced(r, before if r else [])  # type: ignore[misc, no-any-return]

    def _acquire_args(self, k: HoldKey, lease_ms: int | None, claim: bool = False) -> tuple[Any, ...]:
        # No hand-off here, so nothing to claim: a waiter's attempt is a plain acquire.
        ms, field, info = super()._acquire_args(k, lease_ms)[:3]  # type: ignore[misc]
        return (ms, field, identity.with_kind(info, "rw"))


class _ReadKind(_RWKind):
    _ACQUIRE = READ_ACQUIRE_SCRIPT
    _RELEASE = READ_RELEASE_SCRIPT
    _MESSAGE = UNLOCK_MESSAGE
    _MODE = "read"

    def _acquire_args(self, k: HoldKey, lease_ms: int | None, claim: bool = False) -> tuple[Any, ...]:
        return super()._acquire_args(k, lease_ms) + (k[2] + _WRITE,)

    @property
    def _hold_kind(self) -> HoldKind:  # type: ignore[override]
        # Read only where the owner registers its hold (``_acquired``, in the owner's thread or
        # task): the end-of-owner release names that owner.
        return HoldKind(READ_RENEW_SCRIPT, self.key, READ_RELEASE_SCRIPT,
                        (self._field(), 0, UNLOCK_MESSAGE, "all"))

    @staticmethod
    def _read_locked(mode: Any, fields: int) -> bool:
        # Redisson: read-locked in read mode, or in write mode when the writer reads too.
        return mode == b"read" or (mode == b"write" and fields > 2)


class _WriteKind(_RWKind):
    _ACQUIRE = WRITE_ACQUIRE_SCRIPT
    _RELEASE = WRITE_RELEASE_SCRIPT
    _MESSAGE = READ_UNLOCK_MESSAGE
    _MODE = "write"

    def _field(self) -> str:  # type: ignore[override]
        # A thread's write hold and its read holds are two holds (two fields).
        return self._owner() + _WRITE  # type: ignore[attr-defined, no-any-return]

    @property
    def _hold_kind(self) -> HoldKind:
        return HoldKind(RENEW_SCRIPT, self.key, WRITE_RELEASE_SCRIPT,
                        (self._field(), 0, READ_UNLOCK_MESSAGE, "all"))


# -- threads ---------------------------------------------------------------------------------
class ReadLock(_ReadKind, RLock):
    """The read side of a ``ReadWriteLock``: the ``RLock`` API, shared with other readers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rw_setup()

    def is_locked(self) -> bool:
        pipe = self._reader.pipeline(transaction=False)
        pipe.hget(self.key, "mode")
        pipe.hlen(self.key)
        mode, fields = pipe.execute()
        return self._read_locked(mode, int(fields))


class WriteLock(_WriteKind, RLock):
    """The write side of a ``ReadWriteLock``: the ``RLock`` API, exclusive."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rw_setup()

    def is_locked(self) -> bool:
        return self._reader.hget(self.key, "mode") == b"write"


class ReadWriteLock:
    """Redisson's ``RReadWriteLock``: ``read_lock()`` and ``write_lock()`` on one hash.

    Many readers or one writer, non-fair (readers keep entering while others read). The
    owner that holds the write lock may also take read holds (downgrade); a reader asking
    for the write lock waits for every reader to leave, itself included, so ``lock()``
    there never returns: use ``try_lock``.
    """

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[[str], Any] | None = None, label: str | None = None,
                 sync_replicas: int | str | None = "auto", sync_timeout: float = 1.0) -> None:
        kw: dict[str, Any] = {"on_lost": on_lost, "label": label,
                              "sync_replicas": sync_replicas, "sync_timeout": sync_timeout}
        self._read = ReadLock(client, name, prefix, watchdog_timeout, **kw)
        self._write = WriteLock(client, name, prefix, watchdog_timeout, **kw)
        self.name = name
        self.key = self._read.key

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} key={self.key!r}>"

    def read_lock(self) -> ReadLock:
        return self._read

    def write_lock(self) -> WriteLock:
        return self._write


# -- asyncio ---------------------------------------------------------------------------------
class AsyncReadLock(_ReadKind, AsyncRLock):
    """``ReadLock`` for asyncio, owned by the task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rw_setup()

    async def is_locked(self) -> bool:
        pipe = self._reader.pipeline(transaction=False)
        pipe.hget(self.key, "mode")
        pipe.hlen(self.key)
        mode, fields = await pipe.execute()
        return self._read_locked(mode, int(fields))


class AsyncWriteLock(_WriteKind, AsyncRLock):
    """``WriteLock`` for asyncio, owned by the task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rw_setup()

    async def is_locked(self) -> bool:
        return await self._reader.hget(self.key, "mode") == b"write"


class AsyncReadWriteLock:
    """``ReadWriteLock`` for asyncio (task-scoped owners). ``sync_client``: as ``AsyncRLock``."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[[str], Any] | None = None, sync_client: Any = None,
                 label: str | None = None, sync_replicas: int | str | None = "auto",
                 sync_timeout: float = 1.0) -> None:
        kw: dict[str, Any] = {"on_lost": on_lost, "label": label,
                              "sync_replicas": sync_replicas, "sync_timeout": sync_timeout}
        self._read = AsyncReadLock(client, name, prefix, watchdog_timeout,
                                   sync_client=sync_client, **kw)
        # One sync twin for both sides (renewal and waiting share its pool and subscription).
        twin = sync_client if sync_client is not None else self._read._sync_client
        self._write = AsyncWriteLock(client, name, prefix, watchdog_timeout, sync_client=twin,
                                     **kw)
        self.name = name
        self.key = self._read.key

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} key={self.key!r}>"

    def read_lock(self) -> AsyncReadLock:
        return self._read

    def write_lock(self) -> AsyncWriteLock:
        return self._write


__all__ = ["AsyncReadLock", "AsyncReadWriteLock", "AsyncWriteLock", "ReadLock", "ReadWriteLock",
           "WriteLock"]
