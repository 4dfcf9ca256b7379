"""PermitExpirableSemaphore: Redisson's ``RPermitExpirableSemaphore``.

The string ``<key>`` holds the permits available, the zset ``{<key>}:timeout`` the permits
taken (member: the permit id's 16 raw bytes, shown to callers as 32 hex chars; score: expiry
in ms, server time), on the semaphore's channel. Every script that changes it first reclaims
expired ids (drops them, counts them back, publishes). A permit taken without a lease is
renewed by the process's watchdog until released, so a crashed holder's permit comes back
within ``watchdog_timeout`` (unlike Redisson's plain semaphore).

A renewed permit is a hold like a lock's, and tells the lock events so (``engine.events``):
``acquired`` when it is taken and ``released`` when it is given back, with the permit id as
the owner and the semaphore's ``label`` (``@limited``'s template), so metrics count its
acquisitions and hold times as a lock's, and a permit found gone (``lost``, from the watchdog)
carries the label too. With no listener each costs one truth test. (A permit with a lease is
not the watchdog's: it sends none, as nothing would say when it ends.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import time
from typing import Any

from . import events, waiters, windows
from .errors import LockNotOwnedError
from .kinds import Kind, declare
from .lock import check_seconds
from .lockinfo import lease_text
from .lua import Script, source
from .named import DELETE_SCRIPT, Named, uncancellable
from .naming import suffix_name
from .scripts import acall_once, call, call_once
from .watchdog import HoldKind, watchdog

logger = logging.getLogger("django_rlock")

# -- Lua: ``lua/pes_*.lua`` (KEYS, ARGV and the reply in each file's header) ------------------
PES_ACQUIRE = source("pes_acquire")
PES_RELEASE = source("pes_release")
PES_UPDATE = source("pes_update")
PES_TRY_SET = source("pes_try_set")
PES_ADD = source("pes_add")
PES_AVAILABLE = source("pes_available")
PES_RENEW = source("pes_renew")

PES_ACQUIRE_SCRIPT = Script(PES_ACQUIRE)
PES_RELEASE_SCRIPT = Script(PES_RELEASE)
PES_UPDATE_SCRIPT = Script(PES_UPDATE)
PES_TRY_SET_SCRIPT = Script(PES_TRY_SET)
PES_ADD_SCRIPT = Script(PES_ADD)
PES_AVAILABLE_SCRIPT = Script(PES_AVAILABLE)
PES_RENEW_SCRIPT = Script(PES_RENEW)


# -- PermitExpirableSemaphore ------------------------------------------------------------------
def new_permit_id() -> str:
    """A permit id: 16 random bytes as 32 hex chars (Redisson's form)."""
    return os.urandom(16).hex()


class _PermitsBase(Named):
    _WHAT = "semaphore"

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, aio: bool = False, sync_client: Any = None, max_hold: float | None = None,
                 warn_held_after: float | None = None, idle_expiry: float | None = None,
                 label: str | None = None) -> None:
        super().__init__(client, name, prefix, aio=aio, sync_client=sync_client)
        if label is not None and not isinstance(label, str):
            raise TypeError(f"label must be a str or None, not {type(label).__name__} "
                            f"(semaphore {name!r})")
        #: What the lock events say as ``label`` (a bounded set, fit for metric labels).
        self.label = label
        wt = check_seconds(watchdog_timeout, "watchdog_timeout", name, zero_ok=False)
        #: ``idle_expiry`` seconds: the semaphore expires that long after a release leaves no
        #: permit taken, and a permit taken makes it persistent again (``@limited``'s per-user
        #: names do not pile up). None: it lives until deleted, as Redisson's does.
        if idle_expiry is None:
            self._acquire_extra: tuple[Any, ...] = ()
            self._release_extra: tuple[Any, ...] = ()
        else:
            idle = check_seconds(idle_expiry, "idle_expiry", name, zero_ok=False)
            self._acquire_extra = ("1",)
            self._release_extra = (max(1, math.ceil(idle * 1000)),)
        self.watchdog_timeout = wt
        #: Time windows of each permit taken (``windows``): a renewed permit is never renewed
        #: past ``max_hold`` (it expires then); a lease may not be longer.
        self.max_hold = windows.check_window(max_hold, "max_hold", name)
        self.warn_held_after = windows.check_window(warn_held_after, "warn_held_after", name)
        self._watchdog_ms = max(1, math.ceil(min(wt, self.max_hold or wt) * 1000))
        #: Redisson's ``{<key>}:timeout``: the permits taken and when each expires.
        self.timeout_key = suffix_name(self.key, "timeout")
        self._keys = (self.key, self.timeout_key, self._channel, self._index)


    def _acquiring(self, note: waiters.Note | None, permit_id: str,
                   ms: int) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
        """The acquire of one permit as sent (a retry carries the waiter's record: while no
        permit is free the reply is the ms to the nearest expiry, or -1)."""
        return waiters.noted(note, PES_ACQUIRE_SCRIPT, self._keys,
                             (permit_id, ms, *self._acquire_extra), "type(reply) == 'number'",
                             "reply")

    def _lease_ms(self, lease_time: Any) -> int | None:
        if lease_time is None:
            return None
        lease = check_seconds(lease_time, "lease_time", self.name, zero_ok=False)
        windows.check_lease(lease, self.max_hold, self.name)
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
            self.watchdog_timeout, None, label=self.label, scripts_keys=self._keys,
            kind=HoldKind(PES_RENEW_SCRIPT, self.timeout_key, PES_RELEASE_SCRIPT,
                          (permit_id, *self._release_extra)),
            since=sent, max_hold=self.max_hold, warn_after=self.warn_held_after,
            prefix=self.prefix)
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

    def _wait(self, since: float | None = None) -> Any:
        """The shared wait, with the label (its ``wait_started`` / ``wait_ended``: the
        ``waiting`` gauge by template)."""
        w = super()._wait(since)
        return w if self.label is None else dataclasses.replace(w, label=self.label)

    def _taken(self, permit_id: str | None, t0: float, renewed: bool) -> str | None:
        """A permit was taken (or not: None): the ``acquired`` event of a renewed one."""
        if permit_id is not None and renewed and events.listeners:
            events.emit("acquired", name=self.name, key=self.key, label=self.label,
                        owner=permit_id, kind=type(self).__name__,
                        wait=time.monotonic() - t0, lease=None)
        return permit_id

    def _releasing(self, permit_id: str) -> float | None:
        """Before a release: since when the permit has been the watchdog's (None: it is not,
        or nobody listens), for the ``released`` event; and no longer renewed."""
        k = self._hold_key(permit_id)
        hold = watchdog().get(k) if events.listeners else None
        watchdog().forget(k)
        return None if hold is None or not hold.renew else hold.since

    def _released(self, permit_id: str, since: float | None, done: bool) -> bool:
        if done and since is not None and events.listeners:
            events.emit("released", name=self.name, key=self.key, label=self.label,
                        owner=permit_id, held=time.monotonic() - since, reason="unlock")
        return done

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
                 watchdog_timeout: float = 30.0, *, max_hold: float | None = None,
                 warn_held_after: float | None = None, idle_expiry: float | None = None,
                 label: str | None = None) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, max_hold=max_hold,
                         warn_held_after=warn_held_after, idle_expiry=idle_expiry, label=label)

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
        t0 = time.monotonic()

        def attempt(note: waiters.Note | None = None) -> int | None:
            sent = time.monotonic()
            ttl = self._ttl_of(call_once(self._client, *self._acquiring(note, permit_id, ms)))
            if ttl is None and lease_ms is None and not self._renewed(permit_id, sent):
                again = time.monotonic()
                return self._late_checked(permit_id, again, call_once(
                    self._client, PES_RENEW_SCRIPT, (self.timeout_key,), (permit_id, ms)))
            return ttl

        return self._taken(permit_id if self._waits(attempt, budget) else None, t0,
                           lease_ms is None)

    def release(self, permit_id: str) -> None:
        """Give the permit back. Raises ``LockNotOwnedError`` (a ``LockError``) if it was
        released already, has expired, or never existed."""
        if not self.try_release(permit_id):
            raise self._not_released(permit_id)

    def try_release(self, permit_id: str) -> bool:
        """Give the permit back; False if it was released already, expired or never existed."""
        pid = self._permit(permit_id)
        since = self._releasing(pid)  # in doubt (an error), it expires within the watchdog timeout
        return self._released(pid, since, bool(call_once(
            self._client, PES_RELEASE_SCRIPT, self._keys, (pid, *self._release_extra))))

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

    def force_unlock(self) -> bool:
        """Delete the semaphore (its count and the permits taken) and wake its waiters: what
        ``manage.py locks clear`` and the admin do. True if there was one."""
        before = self._forcing()
        script, keys, args = self._force_call()
        return self._forced(call_once(self._client, script, keys, args), before)

    def delete(self) -> bool:
        """Delete the semaphore (count and taken permits); True if there was one."""
        return bool(call(self._client, DELETE_SCRIPT, (self.key, self.timeout_key, self._index),
                         ()))


class AsyncPermitExpirableSemaphore(_PermitsBase):
    """``PermitExpirableSemaphore`` for asyncio. Renewal is the process watchdog's (through a
    sync twin of the client); a permit is not tied to the task that took it. A cancelled
    ``acquire`` never keeps a permit."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, sync_client: Any = None, max_hold: float | None = None,
                 warn_held_after: float | None = None, idle_expiry: float | None = None,
                 label: str | None = None) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, aio=True,
                         sync_client=sync_client, max_hold=max_hold,
                         warn_held_after=warn_held_after, idle_expiry=idle_expiry, label=label)

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
        t0 = time.monotonic()

        async def send(note: waiters.Note | None = None) -> int | None:
            return self._ttl_of(await acall_once(self._client,
                                                 *self._acquiring(note, permit_id, ms)))

        async def undo() -> None:
            await acall_once(self._client, PES_RELEASE_SCRIPT, self._keys,
                             (permit_id, *self._release_extra))

        async def attempt(note: waiters.Note | None = None) -> int | None:
            sent = time.monotonic()
            ttl = await uncancellable(lambda: send(note), undo)
            if ttl is None and lease_ms is None and not self._renewed(permit_id, sent):
                again = time.monotonic()
                return self._late_checked(permit_id, again, await acall_once(
                    self._client, PES_RENEW_SCRIPT, (self.timeout_key,), (permit_id, ms)))
            return ttl

        return self._taken(permit_id if await self._awaits(attempt, budget) else None, t0,
                           lease_ms is None)

    async def release(self, permit_id: str) -> None:
        if not await self.try_release(permit_id):
            raise self._not_released(permit_id)

    async def try_release(self, permit_id: str) -> bool:
        pid = self._permit(permit_id)
        since = self._releasing(pid)
        return self._released(pid, since, bool(await asyncio.shield(acall_once(
            self._client, PES_RELEASE_SCRIPT, self._keys, (pid, *self._release_extra)))))

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

    async def force_unlock(self) -> bool:
        """``Semaphore.force_unlock`` for asyncio."""
        before = self._forcing()
        script, keys, args = self._force_call()
        return self._forced(await acall_once(self._client, script, keys, args), before)

    async def delete(self) -> bool:
        return bool(await acall_once(self._client, DELETE_SCRIPT,
                                     (self.key, self.timeout_key, self._index), ()))


def _permits_details(probe: dict[str, Any], detail: bool) -> dict[str, Any]:
    # Expired permits are free (``available_permits`` counts them back first), not taken.
    out: dict[str, Any] = {"permits": probe["number"] + probe["expired"],
                           "taken": probe["taken"]}
    if detail:
        out["leases"] = probe["leases"]
    return out


def _permits_lines(d: dict[str, Any]) -> list[str]:
    return [f"permits available: {d['permits']}", f"permits taken: {d['taken']}"] + [
        f"  {p['id']} (lease {lease_text(p['ttl'])})" for p in d.get("leases", ())]


PERMITS = declare(Kind(
    "permits", "string",
    note="Its permits and the permits taken are deleted (none are available until they are set "
         "again); whoever took permits keeps running, uncounted. Waiters are woken.",
    open=PermitExpirableSemaphore, detect=lambda probe: bool(probe["taken"] or probe["expired"]),
    details=_permits_details,
    summary=lambda d: f"{d['permits']} available, {d['taken']} taken",
    lines=_permits_lines))

__all__ = ["AsyncPermitExpirableSemaphore", "PermitExpirableSemaphore", "new_permit_id"]
