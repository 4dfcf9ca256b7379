"""RLock: Redisson's reentrant lock on a redis-py client.

One acquire attempt and one release are one EVALSHA each, sent once (see ``scripts``).
Waiting is pub/sub driven (``wait``), renewal is the process watchdog's (``watchdog``); what
the kinds share is ``base.LockBase``.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from asyncio import _get_running_loop as running_loop  # (asyncio.__all__: its fast check)
from collections.abc import Callable
from types import TracebackType
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import identity, leases, records, replicas, waiters, wakeline
from .base import (
    GRANT_CHECK_MARGIN,
    REGISTRATION_SLACK_MS,
    YIELD_WINDOW,
    HoldKey,
    LockBase,
    check_name,
    check_seconds,
    log_masked_release,
    ttl_seconds,
)
from .clients import refresh
from .naming import UNLOCK_MESSAGE
from .scripts import REDIRECT_BACKOFF, RELEASE_SCRIPT, RENEW_SCRIPT, call_once
from .wait import loop as waiting
from .watchdog import server_id, watchdog

#: The ``RuntimeWarning`` of a sync lock taken in a thread running an event loop. One text for
#: every lock, so Python's warning filter says it once per call site, not once per name.
IN_EVENT_LOOP = (
    "a sync lock (RLock or another sync kind) taken in a thread running an event loop: it is "
    "owned by the thread, so every task of this loop is the same owner (two requests would "
    "both hold it) and waiting blocks the loop. In async code use its asyncio twin "
    "(AsyncRLock, ...; in Django `async with get_lock(name, aio=True):`)")


def warn_in_event_loop() -> None:
    """Warn at the caller's line (the first frame outside django_rlock) when this thread runs
    an event loop. ``sync_to_async`` code runs in a thread of its own: no loop runs there."""
    if running_loop() is None:
        return
    frame, level = sys._getframe(1), 2  # (level 2: the frame that called this function)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("django_rlock"):
        frame, level = frame.f_back, level + 1
    warnings.warn(IN_EVENT_LOOP, RuntimeWarning, stacklevel=level)


class RLock(LockBase):
    """A reentrant, Redisson-compatible distributed lock.

    The owner is ``<process uuid>:<thread id>``: reentrant per thread, exclusive across
    threads, processes (forked children included) and hosts. ``lease_time=None`` means
    watchdog mode: a ``watchdog_timeout`` lease kept alive by this process while held.

    ``on_lost(name)`` is called (on the watchdog thread) if a renewal finds the lock gone
    while it is held (``on_lost(name, reason=...)`` if it takes a ``reason``); ``is_lost()``
    tells the holder the same. ``max_hold``: seconds after which a hold is never renewed
    again (it expires then, and is lost); ``warn_held_after``: seconds after which a hold
    is logged once as held long (``windows``).
    """

    _CLUSTER = True

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[..., Any] | None = None, label: str | None = None,
                 sync_replicas: int | str | None = "auto", sync_timeout: float = 1.0,
                 max_hold: float | None = None, warn_held_after: float | None = None) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, on_lost, label, sync_replicas,
                         sync_timeout, max_hold, warn_held_after)
        self._server = server_id(self._client)

    def _target(self) -> tuple[int, tuple[int, int] | None]:
        if self.sync_replicas is None:
            return 0, None
        try:
            n = replicas.connected(self._client, self._server) or 0
        except (RedisConnectionError, RedisTimeoutError) as exc:
            if self._cluster is None:
                raise
            n = self._connected_after(exc)
        return n, self._sync_target(n)

    def _recounted(self, acked: Any) -> bool:
        return replicas.recounted(self._client, self._server, acked, self._sync_target)

    def _connected_after(self, exc: Exception) -> int:
        """The replica probe found no master (a read, so safe to repeat): on a cluster, its
        slot may have a new one; look again while a failover may still be under way."""
        for pause in REDIRECT_BACKOFF:
            time.sleep(pause)
            refresh(self._cluster, exc)
            try:
                return replicas.connected(self._client, self._server) or 0
            except (RedisConnectionError, RedisTimeoutError) as again:
                exc = again
        raise exc

    def _owner(self) -> str:
        return identity.thread_owner()

    _info = staticmethod(identity.thread_info)

    def _acquired(self, k: HoldKey, lease_ms: int | None, t0: float,
                  thread: threading.Thread | None = None, grant_ms: int | None = None,
                  since: float | None = None) -> Any:
        return super()._acquired(k, lease_ms, t0, thread or threading.current_thread(), grant_ms,
                                 since)

    def _grant_callback(self, k: HoldKey, lease_ms: int | None,
                        t0: float) -> Callable[..., Any]:
        # A grant runs on the releasing or the listener thread: the hold belongs to the
        # waiting one (this one). It was made after the wait began, at the earliest.
        waiter = threading.current_thread()
        return lambda grant_ms=None, since=None: self._acquired(
            k, lease_ms, t0, waiter, grant_ms, t0 if since is None else since)

    # -- acquiring ------------------------------------------------------------------------
    def lock(self, lease_time: float | None = None) -> None:
        """Block until acquired. ``lease_time`` in seconds; ``None``: watchdog mode."""
        warn_in_event_loop()
        self._acquire(None, self._lease_ms(lease_time))

    def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        """Try for up to ``wait_time`` seconds (0: exactly one attempt)."""
        wait = self._wait_budget(wait_time)
        warn_in_event_loop()
        return self._acquire(wait, self._lease_ms(lease_time))

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """``threading.RLock.acquire`` semantics (watchdog mode)."""
        warn_in_event_loop()
        if not blocking:
            if timeout != -1:
                raise ValueError(f"can't specify a timeout for a non-blocking call (lock {self.name!r})")
            return self._acquire(0.0, None)
        if timeout == -1:
            return self._acquire(None, None)
        return self._acquire(check_seconds(timeout, "timeout", self.name, zero_ok=True), None)

    def _attempt(self, k: HoldKey, lease_ms: int | None, t0: float, claim: bool = False,
                 reg: tuple[str, float | None] | waiters.Note | None = None) -> int | None:
        """One acquire round trip: None when acquired, else the holder's PTTL in ms (or
        ``CLAIMED``: a grant reached this waiter, booked by the wait).

        ``reg=(token, deadline)``: a waiter's attempt, which registers it in the hand-off
        queue if it fails; a ``waiters.Note``: a retry of a kind without a hand-off, which
        carries the waiter's record (``waiters``). With replicas, WAIT rides in the same round trip; too few
        acknowledgements undo the acquire (one more round trip) and raise
        ``LockNotSyncedError``.
        """
        args = self._acquire_args(k, lease_ms, claim)
        keys = self._acquire_keys
        script = self._ACQUIRE
        if isinstance(reg, waiters.Note):  # a kind without a hand-off: its waiter record
            script, keys, args = waiters.noted(reg, self._ACQUIRE, keys, args, *self._WAITING)
        elif reg is not None:
            args = args[:4] + self._register_args(reg[0], reg[1], self._grant_ms(lease_ms))
            keys = self._wait_keys
        if records.due(k[0], args[0]):  # once per process and server (invariant 43)
            records.write(self._client, k[0], args[0])
        connected, target = self._target()
        sent = time.monotonic()
        if target is None:
            ttl = self._ttl_of(call_once(self._client, script, keys, args))
        else:
            try:
                reply, acked = call_once(self._client, script, keys, args,
                                         self._wait_args(target))
            except (RedisConnectionError, RedisTimeoutError):
                # A failover (seen, or behind a fixed address: WAIT then times out): count the
                # new master's replicas next time.
                replicas.forget(self._server)
                raise
            ttl = self._ttl_of(reply)
            err = self._shortfall(acked, target, connected, "an acquire") if ttl is None else None
            if err is not None and not self._recounted(acked):
                call_once(self._client, self._RELEASE, self._release_keys,
                          self._release_args(k[2], args[0]))
                raise err
        if ttl is None:
            hold = self._acquired(k, lease_ms, t0, since=sent)
            if time.monotonic() - sent > hold.lease_ms / 2000.0 and not self._verified(k, True):
                return 0  # its reply came after half its lease: not ours any more, try again
            return None
        return int(ttl)

    def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        t0 = time.monotonic()
        k = (self._server, self.key, self._field())
        park_until = self._park_first_until(k, wait)
        deadline = None if wait is None else t0 + wait
        token = line = None
        if self._registers(k, wait, park_until):
            line = wakeline.line_for(self._sync_client, k[2])
            token = self._new_token(k[2], line is not None)
        registered = False
        if not park_until:
            heard = token is not None and self._grants_heard()
            try:
                ttl = (self._attempt(k, lease_ms, t0) if token is None
                       else self._attempt(k, lease_ms, t0, reg=(token, deadline)))
            except (RedisConnectionError, RedisTimeoutError):
                if token is not None:  # it may have registered before the reply was lost
                    self._withdraw_failed(token, deadline)
                raise
            if ttl is None:
                return True
            if wait == 0:
                waiting.refused(self._sync_client, self.name, self.key, self.label,
                                type(self).__name__, k[2], t0)
                return False
            registered = token is not None
            if token is None and self._HANDOFF:
                # Held, and unregistered: get in line with the wait's first attempt (and with
                # every first attempt on this lock from now on).
                self._found_held(k)
                line = wakeline.line_for(self._sync_client, k[2])
                token = self._new_token(k[2], line is not None)
            if heard:
                # In line now, and a grant to us will be heard: sleep until it comes (or the
                # holder's lease ends) instead of asking again.
                park_until = time.monotonic() + (waiting.park_timeout(ttl, deadline) or 3600.0)
        return self._wait(k, lease_ms, wait, park_until, t0, token, registered, deadline, line)

    def _verified(self, k: HoldKey, late: bool = False) -> bool:
        """True unless the hold just booked for ``k`` is found gone by one renewal, sent only
        when it is in doubt (``_in_doubt``); then it is unbooked (invariant 31)."""
        hold = self._in_doubt(k, late)
        if hold is None:
            return True
        keys, args, ms = self._check_args(hold)
        sent = time.monotonic()
        return self._checked(k, hold, sent, ms,
                             call_once(self._client, hold.renew_script, keys, args))

    def _wait(self, k: HoldKey, lease_ms: int | None, wait: float | None,
              park_until: float, t0: float, token: str | None = None, registered: bool = False,
              deadline: float | None = None, line: Any = None) -> bool:
        if token is None:
            note = self._note(k, deadline)
            try:
                return waiting.wait(self._waiting(k, lease_ms, t0),
                                    lambda claim: self._attempt(k, lease_ms, t0, claim, note),
                                    wait, self.unlock, park_until,
                                    verify=lambda: self._verified(k),
                                    parked=self._parked(k, deadline, park_until, self._sync_client))
            except BaseException:
                waiters.forget(self._client, note)
                raise

        def withdraw() -> None:
            try:
                r = call_once(self._client, RELEASE_SCRIPT, self._release_keys,
                              self._withdraw_args(k[2], token))
            except Exception:
                self._withdraw_failed(token, deadline)
                raise
            self._withdrawn(r)

        if line is None:
            # This wait's grant comes through the shared subscription; the thread's next
            # ones come straight to it.
            wakeline.open_line(self._sync_client, k[2])
        got = waiting.wait(self._waiting(k, lease_ms, t0, token, registered, line, deadline),
                           lambda claim: self._attempt(k, lease_ms, t0, claim, (token, deadline)),
                           wait, self.unlock, park_until, withdraw, lambda: self._verified(k),
                           self._parked(k, deadline, park_until, self._sync_client))
        top_up = self._top_up(k) if got else None
        if top_up is not None:
            call_once(self._client, RENEW_SCRIPT, (self.key,), top_up)
        return got

    # -- releasing ------------------------------------------------------------------------
    def unlock(self) -> None:
        """Release one hold of the calling owner; the last one deletes the key and publishes
        (or hands the lock to a thread of this process that waits for it).

        Raises LockNotOwnedError if the caller holds nothing (never acquired, expired, lost,
        force-unlocked). A Redis error propagates unchanged and is not retried; renewal of
        the hold stops once its local count reaches zero, so an in-doubt lock expires by itself.
        """
        plan = self._release_plan((self._server, self.key, self._field()))
        connected, target = self._target()
        plan.sent = time.monotonic()
        try:
            if target is None:
                # A final release drops its hold while the server runs the script (every
                # outcome drops it): less to do once the reply, or the heir, is waiting.
                r = call_once(self._client, self._RELEASE, self._release_keys, plan.args, None,
                              plan.drop if plan.final else None)
            else:
                r, acked = call_once(self._client, self._RELEASE, self._release_keys, plan.args,
                                     self._wait_args(target))
                err = self._shortfall(acked, target, connected, "a release")
                if err is not None and r is not None and not self._recounted(acked):
                    self._release_unsynced(err)
        except BaseException as exc:
            if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
                replicas.forget(self._server)  # maybe a failover: count the replicas again
            self._release_failed(plan)
            raise
        orphan = self._release_done(plan, r)
        if orphan is not None:
            call_once(self._client, RELEASE_SCRIPT, self._release_keys,
                      (orphan.owner, orphan.lease_ms, UNLOCK_MESSAGE))
        self._handed_over(plan)

    release = unlock

    def release_as_lease(self, seconds: float) -> bool:
        """End this hold but leave the lock held ``seconds`` more, as a plain lease on the
        server that nobody renews, releases or re-enters (``leases``): a run that ends early
        still keeps others out for its window. True if the lock is now such a lease; False
        if this was a reentrant hold (one level released, as ``unlock()``), or ``seconds``
        is 0 (released as ``unlock()``). ``LockNotOwnedError`` if not held."""
        ms = leases.lease_ms(seconds, self.name)
        k = (self._server, self.key, self._field())
        hold = watchdog().get(k)
        if not ms or (hold is not None and hold.count > 1):
            self.unlock()
            return False
        r = call_once(self._client, leases.LEASE_OUT_SCRIPT,
                      (self.key, self._channel, self._release_keys[2]),
                      (k[2], leases.lease_field(k[2], self._owner()), ms,
                       leases.message_of(self)))
        return leases.booked(watchdog(), k, hold, r, self.name, self.key, self.label)

    def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters. True if a lock was deleted."""
        before = self._holds_now()
        return self._forced(call_once(self._client, self._FORCE, self._release_keys,
                                      self._force_args()), before)

    # -- inspecting -----------------------------------------------------------------------
    def is_locked(self) -> bool:
        return bool(self._reader.exists(self.key))

    def is_held_by_current_thread(self) -> bool:
        return bool(self._reader.hexists(self.key, self._field()))

    def hold_count(self) -> int:
        return int(self._reader.hget(self.key, self._field()) or 0)

    def remaining_ttl(self) -> float | None:
        """Seconds left on the lease; None when not locked, ``inf`` for a key without expiry."""
        return ttl_seconds(self._reader.pttl(self.key))

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> RLock:
        self.lock()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.unlock()
            return
        try:
            self.unlock()
        except Exception as err:
            log_masked_release(self.name, exc_type, err)


__all__ = ["GRANT_CHECK_MARGIN", "IN_EVENT_LOOP", "REGISTRATION_SLACK_MS", "YIELD_WINDOW",
           "HoldKey", "LockBase", "RLock", "check_name", "check_seconds", "log_masked_release",
           "ttl_seconds", "warn_in_event_loop"]
