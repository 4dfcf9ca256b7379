"""ReadWriteLock: Redisson's read-write lock (many readers or one writer, non-fair).

Redisson's layout, so Java and Node clients contend for the same lock: the hash ``<key>``
holds ``mode`` (``read`` | ``write``), one field per reader ``<owner>`` -> hold count and the
writer's ``<owner>:write`` -> hold count. Each read hold also has a string of its own,
``{key}:<owner>:rwlock_timeout:<k>`` (k = 1..count) with its own expiry, because read
expiry is per hold: a reader that dies leaves a field behind, and only its timeout keys
tell the others it is gone. Both locks wait on ``redisson_rwlock:{key}``; a read unlock
that frees the lock publishes ``0``, a write unlock ``1``, and every message wakes every
local waiter (several readers may enter together).

A writer may take read holds (downgrade); a reader may not take the write lock (upgrade): a
write that would wait for the caller's own read hold raises ``LockUpgradeError`` before any
command (Redisson waits there, forever in watchdog mode). Each kind is a set of scripts on
``RLock`` / ``AsyncRLock``: waiting, renewal, replica sync and bookkeeping are the engine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import identity
from .aio import AsyncRLock
from .errors import LockUpgradeError
from .holds import Hold
from .kinds import Kind, declare
from .lock import HoldKey, RLock
from .lua import Script, source
from .naming import READ_UNLOCK_MESSAGE, RWLOCK_CHANNEL_PREFIX, UNLOCK_MESSAGE, prefix_name
from .scripts import RENEW_SCRIPT
from .wait.channel import wake_all
from .watchdog import HoldKind, watchdog

# -- Lua: ``lua/read_*.lua``, ``write_*.lua``, ``rw_force.lua`` (KEYS, ARGV and the reply in each
# file's header), all on the helpers of ``lua/_rw.lua``.
READ_ACQUIRE = source("read_acquire")
READ_RELEASE = source("read_release")
READ_RENEW = source("read_renew")
WRITE_ACQUIRE = source("write_acquire")
WRITE_RELEASE = source("write_release")
FORCE = source("rw_force")

READ_ACQUIRE_SCRIPT = Script(READ_ACQUIRE)
READ_RELEASE_SCRIPT = Script(READ_RELEASE)
READ_RENEW_SCRIPT = Script(READ_RENEW)
WRITE_ACQUIRE_SCRIPT = Script(WRITE_ACQUIRE)
WRITE_RELEASE_SCRIPT = Script(WRITE_RELEASE)
FORCE_SCRIPT = Script(FORCE)

_WRITE = ":write"


def _live(hold: Hold | None) -> bool:
    return hold is not None and not hold.lost and (hold.renew or time.monotonic() < hold.expires_at)


class _RWKind:
    """Hooks both kinds share: the channel, the wake policy, no hand-off, no parking first."""

    _HANDOFF = False
    _WAKES = staticmethod(wake_all)
    _FORCE = FORCE_SCRIPT
    #: What this kind publishes when it frees the lock.
    _MESSAGE: str
    # Provided by LockBase.
    name: str
    key: str
    _server: Any
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
        return (READ_UNLOCK_MESSAGE,)

    def _acquire_args(self, k: HoldKey, lease_ms: int | None, claim: bool = False) -> tuple[Any, ...]:
        # No hand-off here, so nothing to claim: a waiter's attempt is a plain acquire.
        ms, field, info = super()._acquire_args(k, lease_ms)[:3]  # type: ignore[misc]
        return (ms, field, identity.with_kind(info, "rw"))


class _ReadKind(_RWKind):
    _ACQUIRE = READ_ACQUIRE_SCRIPT
    _RELEASE = READ_RELEASE_SCRIPT
    _MESSAGE = UNLOCK_MESSAGE

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

    def _field(self) -> str:  # type: ignore[override]
        # A thread's write hold and its read holds are two holds (two fields).
        return self._owner() + _WRITE  # type: ignore[attr-defined, no-any-return]

    @property
    def _hold_kind(self) -> HoldKind:
        return HoldKind(RENEW_SCRIPT, self.key, WRITE_RELEASE_SCRIPT,
                        (self._field(), 0, READ_UNLOCK_MESSAGE, "all"))

    def _refuse_upgrade(self, wait: float | None) -> None:
        """``LockUpgradeError`` if this acquire would wait for the caller's own read hold.

        The write waits for every reader to leave, the caller included: ``lock()`` would never
        return (its read hold renewed by the watchdog all along), a timed try would only burn
        its budget. Decided from the process's registry of holds, so no command is sent. A
        one-shot try is left to the script, which refuses it (Redisson's
        testWriteReadReentrancy); a writer that also reads takes its write again (reentry).
        """
        if wait == 0:
            return
        owner = self._owner()  # type: ignore[attr-defined]
        registry = watchdog()
        if _live(registry.get((self._server, self.key, owner))) and not _live(
                registry.get((self._server, self.key, owner + _WRITE))):
            raise LockUpgradeError(
                f"lock {self.name!r}: {owner} holds its read lock and asked for its write "
                f"lock, which waits for every reader to leave, itself included: it would wait "
                f"for itself. Release the read lock first (no upgrade; a one-shot try_lock() "
                f"returns False)", self.name)


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
    """The write side of a ``ReadWriteLock``: the ``RLock`` API, exclusive. A reader asking to
    wait for it (``lock()``, ``try_lock(wait_time > 0)``) gets ``LockUpgradeError``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rw_setup()

    def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        self._refuse_upgrade(wait)
        return super()._acquire(wait, lease_ms)

    def is_locked(self) -> bool:
        return self._reader.hget(self.key, "mode") == b"write"


class ReadWriteLock:
    """Redisson's ``RReadWriteLock``: ``read_lock()`` and ``write_lock()`` on one hash.

    Many readers or one writer, non-fair (readers keep entering while others read). The
    owner that holds the write lock may also take read holds (downgrade); a reader asking
    for the write lock would wait for every reader to leave, itself included, so its
    ``lock()`` or ``try_lock(wait_time > 0)`` raises ``LockUpgradeError`` at once (a
    one-shot ``try_lock()`` returns False).
    """

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[..., Any] | None = None, label: str | None = None,
                 sync_replicas: int | str | None = "auto", sync_timeout: float = 1.0,
                 max_hold: float | None = None, warn_held_after: float | None = None) -> None:
        kw: dict[str, Any] = {"on_lost": on_lost, "label": label,
                              "sync_replicas": sync_replicas, "sync_timeout": sync_timeout,
                              "max_hold": max_hold, "warn_held_after": warn_held_after}
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

    def force_unlock(self) -> bool:
        """Delete the lock in either mode (every read hold with it) and wake every waiter;
        the same from the read or the write handle. True if a lock was deleted."""
        return self._write.force_unlock()


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

    async def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        self._refuse_upgrade(wait)
        return await super()._acquire(wait, lease_ms)

    async def is_locked(self) -> bool:
        return await self._reader.hget(self.key, "mode") == b"write"


class AsyncReadWriteLock:
    """``ReadWriteLock`` for asyncio (task-scoped owners). ``sync_client``: as ``AsyncRLock``."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[..., Any] | None = None, sync_client: Any = None,
                 label: str | None = None, sync_replicas: int | str | None = "auto",
                 sync_timeout: float = 1.0, max_hold: float | None = None,
                 warn_held_after: float | None = None) -> None:
        kw: dict[str, Any] = {"on_lost": on_lost, "label": label,
                              "sync_replicas": sync_replicas, "sync_timeout": sync_timeout,
                              "max_hold": max_hold, "warn_held_after": warn_held_after}
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

    async def force_unlock(self) -> bool:
        """``ReadWriteLock.force_unlock``."""
        return await self._write.force_unlock()


__all__ = ["AsyncReadLock", "AsyncReadWriteLock", "AsyncWriteLock", "ReadLock", "ReadWriteLock",
           "WriteLock"]


def _rw_details(probe: dict[str, Any], detail: bool) -> dict[str, Any]:
    holders = probe["holders"]
    writer = next((h for h in holders if h.write), None)
    return {"mode": probe["fields"]["mode"],
            "readers": [{"owner": h.owner, "hold_count": h.hold_count}
                        for h in holders if not h.write],
            "writer": None if writer is None else {"owner": writer.owner,
                                                   "hold_count": writer.hold_count}}


def _rw_summary(d: dict[str, Any]) -> str:
    readers, writer = d["readers"], d["writer"]
    text = f"mode {d['mode']}, {len(readers)} reader{'s' if len(readers) != 1 else ''}"
    return text + (f", writer {writer['owner']}" if writer else "")


def _rw_lines(d: dict[str, Any]) -> list[str]:
    writer = d["writer"]
    return [f"mode: {d['mode']}",
            f"writer: {'-' if writer is None else writer['owner']}"
            + ("" if writer is None else f" ({writer['hold_count']} hold(s))"),
            f"readers: {len(d['readers'])}"] + [
        f"  {r['owner']} ({r['hold_count']} hold(s))" for r in d["readers"]]


def _read(client: Any, name: str, prefix: str = "", **options: Any) -> ReadLock:
    return ReadWriteLock(client, name, prefix, **options).read_lock()


def _write(client: Any, name: str, prefix: str = "", **options: Any) -> WriteLock:
    return ReadWriteLock(client, name, prefix, **options).write_lock()


def _aread(client: Any, name: str, prefix: str = "", **options: Any) -> AsyncReadLock:
    return AsyncReadWriteLock(client, name, prefix, **options).read_lock()


def _awrite(client: Any, name: str, prefix: str = "", **options: Any) -> AsyncWriteLock:
    return AsyncReadWriteLock(client, name, prefix, **options).write_lock()


KIND = declare(Kind(
    "rw", "hash",
    note="It goes in either mode, with every read hold's timeout key; every waiting reader and "
         "writer is woken.",
    open=ReadWriteLock, locks={"read": _read, "write": _write},
    async_locks={"read": _aread, "write": _awrite}, modes=True,
    detect=lambda probe: "mode" in probe["fields"], details=_rw_details,
    summary=_rw_summary,
    lines=_rw_lines))
