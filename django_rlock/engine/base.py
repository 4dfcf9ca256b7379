"""LockBase: what every lock kind shares, and the hooks a kind overrides (invariant 17).

Validation before any Redis command, names, and the bookkeeping around each round trip: the
hold registry (``watchdog``), the waiter queues and the hand-off (``wait``), grants checked
before they count (invariant 31). The sync ``RLock`` (``lock``) and ``AsyncRLock`` (``aio``)
do the I/O; the kinds change only what is under "what a kind changes".
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from . import events, identity, releasing, replicas, waiters, windows, withdrawals
from .clients import SlotBound, is_cluster_node
from .errors import LockNotSyncedError
from .flavours import check_client
from .naming import (
    DIRECT_TOKEN_MARK,
    UNLOCK_MESSAGE,
    grant_channel,
    handoff_queue,
    handoff_waiters,
    index_key,
    lock_channel,
)
from .scripts import (
    ACQUIRE_SCRIPT,
    FORCE_UNLOCK_SCRIPT,
    RELEASE_SCRIPT,
    Script,
)
from .wait import loop as waiting
from .wait import manager as pubsub
from .wait import settings as wait_settings
from .watchdog import HoldKind, watchdog

logger = logging.getLogger("django_rlock")

SUBSCRIBE_TIMEOUT = wait_settings.SUBSCRIBE_TIMEOUT
#: After a release that woke waiters in *other* processes, this process lets them have the
#: first go for this long (seconds) instead of re-grabbing at once: a loop of
#: lock/unlock in one process would otherwise starve every other process.
YIELD_WINDOW = releasing.YIELD_WINDOW

#: A registered waiter's entry outlives the holder's PTTL it saw by this much (ms): it
#: re-registers on its next attempt, at that PTTL, well before; a waiter that died is skipped
#: once it is past.
REGISTRATION_SLACK_MS = 5000

_wait_serials = itertools.count(1)

#: A grant is returned to its waiter as a hold only while its booked validity (counted from the
#: earliest moment it can have been made) has this much left (seconds; a quarter of the lease
#: when that is shorter); else one round trip checks it first (invariant 31).
GRANT_CHECK_MARGIN = 0.5

#: Locks (server, key) this process has found held by another owner (``LockBase._registers``).
#: Cleared when full: a hint.
_contended: dict[tuple[Any, str], None] = {}
_CONTENDED_MAX = 10_000

HoldKey = tuple[Any, str, str]


def check_seconds(value: Any, what: str, name: str, *, zero_ok: bool, inf_ok: bool = False) -> float:
    """Validate a time in seconds; raise before any Redis command is sent."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__} "
                        f"(lock {name!r})")
    v = float(value)
    if math.isnan(v) or v < 0 or (v == 0 and not zero_ok) or (math.isinf(v) and not inf_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{what} must be a finite number {bound} seconds, got {value!r} "
                         f"(lock {name!r})")
    return v


def check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__} ({name!r})")
    if not name:
        raise ValueError("lock name must not be empty")
    return name


class LockBase(releasing.Releasing, waiters.Noting, SlotBound):
    """What the sync and asyncio locks share: validation, names, and the bookkeeping around
    each round trip (the hold registry, the waiter queues, the hand-off). Subclasses do I/O.

    A lock kind (fair, read, write, fenced) changes only what is below "what a kind
    changes": its scripts, their keys and arguments, its hash field, how it renews, and how
    a message on its channel wakes waiters. Waiting, renewal and bookkeeping stay these.
    """

    # -- what a kind changes ---------------------------------------------------------------
    #: Acquire: KEYS ``_acquire_keys``, ARGV ``_acquire_args``; reply nil = acquired, else
    #: a wait bound in ms (``_ttl_of`` reads other reply shapes).
    _ACQUIRE: Script = ACQUIRE_SCRIPT
    #: Release: KEYS ``_release_keys``, ARGV ``_release_args``; reply nil = not the owner,
    #: 0 = still held, 1 and more = released (RLock: -1 = handed to a local waiter).
    _RELEASE: Script = RELEASE_SCRIPT
    #: Force unlock: KEYS ``_release_keys``, ARGV ``_force_args``; reply 1 = deleted.
    _FORCE: Script = FORCE_UNLOCK_SCRIPT
    #: A release may hand the lock straight to a waiting thread of this process, and grant it
    #: to a waiter registered in the hand-off queue by its failed attempt (any process's).
    _HANDOFF = True
    #: How many waiters one message on the wait channel wakes (None: one; see pubsub).
    _WAKES: Callable[[Any], int] | None = None
    #: Longest park when an attempt gives no bound (-1), if any.
    _RECHECK: float | None = None
    #: Renewal and end-of-owner release of this kind's holds (None: the lock's own).
    _hold_kind: HoldKind | None = None
    #: Runs on a ``RedisCluster`` (on the node of its key's slot); an asyncio one if ``_AIO``.
    _CLUSTER = False
    _AIO = False

    def __init__(self, client: Any, name: str, prefix: str, watchdog_timeout: float,
                 on_lost: Callable[..., Any] | None, label: str | None = None,
                 sync_replicas: int | str | None = "auto", sync_timeout: float = 1.0,
                 max_hold: float | None = None, warn_held_after: float | None = None) -> None:
        check_name(name)
        if not (sync_replicas is None or sync_replicas == "auto" or (
                isinstance(sync_replicas, int) and not isinstance(sync_replicas, bool)
                and sync_replicas >= 0)):
            raise ValueError(f"sync_replicas must be 'auto', an int >= 0 or None, not "
                             f"{sync_replicas!r} (lock {name!r})")
        sync_s = check_seconds(sync_timeout, "sync_timeout", name, zero_ok=False)
        if label is not None and not isinstance(label, str):
            raise TypeError(f"label must be a str or None, not {type(label).__name__} "
                            f"(lock {name!r})")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__} (lock {name!r})")
        check_client(client, f"lock {name!r}", cluster_ok=self._CLUSTER, aio=self._AIO)
        wt = check_seconds(watchdog_timeout, "watchdog_timeout", name, zero_ok=False)
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable (lock {name!r})")
        #: Time windows of every hold (``windows``): never renewed past ``max_hold``; one
        #: warning once held ``warn_held_after``. None: off.
        self.max_hold = windows.check_window(max_hold, "max_hold", name)
        self.warn_held_after = windows.check_window(warn_held_after, "warn_held_after", name)
        self.key = prefix + name
        client = self._bind(client)  # on a cluster: its slot's master
        self.name = name
        self.prefix = prefix
        self.watchdog_timeout = wt
        #: The lease a watchdog-mode hold starts with (and a grant, a hand-off): never longer
        #: than ``max_hold``.
        self._watchdog_ms = max(1, math.ceil(min(wt, self.max_hold or wt) * 1000))
        self._channel = lock_channel(self.key).encode()
        self._index = index_key(prefix, self.key if is_cluster_node(client) else None)
        #: KEYS of the acquire and release scripts (lock, index; lock, channel, index).
        self._acquire_keys: tuple[Any, ...] = (self.key, self._index)
        self._release_keys: tuple[Any, ...] = (self.key, self._channel, self._index)
        if self._HANDOFF:
            self._grant_channel = grant_channel(self.key).encode()
            queue, waiters = handoff_queue(self.key), handoff_waiters(self.key)
            #: A waiter's attempt (it may register); the release that may grant.
            self._wait_keys: tuple[Any, ...] = (self.key, self._index, queue, waiters)
            self._release_keys = (self.key, self._channel, self._index, queue, waiters,
                                  self._grant_channel)
        self._on_lost = on_lost
        #: What metrics and events call this lock: a bounded set (a template), unlike names.
        self.label = label
        self.sync_replicas = sync_replicas or None  # 0 and None: no replica check
        self.sync_timeout = sync_s
        self._sync_timeout_ms = max(1, math.ceil(sync_s * 1000))
        # The sync client that renewal and waiting (threads) use for this server.
        self._sync_client: Any = client
        self._server: Any = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} key={self.key!r}>"

    @property
    def client(self) -> Any:
        """The client this lock sends on: on a cluster, its slot's master's own client."""
        return self._client

    def _lease_ms(self, lease_time: float | None) -> int | None:
        if lease_time is None:
            return None
        lease = check_seconds(lease_time, "lease_time", self.name, zero_ok=False)
        windows.check_lease(lease, self.max_hold, self.name)
        return max(1, math.ceil(lease * 1000))

    def _wait_budget(self, wait_time: float) -> float | None:
        wait = check_seconds(wait_time, "wait_time", self.name, zero_ok=True, inf_ok=True)
        return None if math.isinf(wait) else wait

    def _acquire_args(self, k: HoldKey, lease_ms: int | None, claim: bool = False) -> tuple[Any, ...]:
        hold = watchdog().get(k)
        if lease_ms is None:
            ms = self._watchdog_ms
        else:
            # A lease taken inside a watchdog-mode hold must not cut the key's TTL short.
            ms = max(lease_ms, hold.lease_ms) if hold is not None and hold.renew else lease_ms
        if hold is not None:  # a reentry never sets a lease past the hold's max_hold
            ms = hold.cap(ms)
        # An owner that holds nothing here is never counted on top of a field of its in Redis:
        # that is a grant to a wait of its that ended without taking it (invariant 32).
        return (ms, k[2], self._info(k[2]), "claim" if claim else "" if hold else "fresh")

    def _release_args(self, field: str, lease_ms: int) -> tuple[Any, ...]:
        return (field, lease_ms, UNLOCK_MESSAGE)

    # -- the cross-process hand-off ---------------------------------------------------------
    def _grant_ms(self, lease_ms: int | None) -> int:
        """The lease a release grants this waiter with: short, so a heir that died costs little;
        its watchdog renews it early (``Watchdog.acquired``)."""
        full = self._watchdog_ms if lease_ms is None else lease_ms
        return min(full, max(1, int(wait_settings.GRANT_LEASE * 1000)))

    def _register_args(self, token: str, deadline: float | None,
                       grant_ms: int) -> tuple[Any, ...]:
        """ARGV[5:] of an attempt that registers the caller if it fails."""
        budget = -1 if deadline is None else max(0, math.ceil((deadline - time.monotonic()) * 1000))
        return (token, budget, REGISTRATION_SLACK_MS, grant_ms)

    def _new_token(self, field: str, direct: bool = False) -> str:
        """A wait's name in the hand-off queue; ``direct``: its thread hears grants on its own
        wake line (``wakeline``)."""
        return f"{field}#{next(_wait_serials)}{DIRECT_TOKEN_MARK if direct else ''}"

    def _withdraw_args(self, field: str, token: str) -> tuple[Any, ...]:
        """A waiter giving up: its release if a grant reached it in Redis, else its entry out."""
        return (field, self._watchdog_ms, UNLOCK_MESSAGE, "", 0, 0, "", token,
                identity.process_id())

    def _grants_heard(self) -> bool:
        """Whether a grant published now would reach this process's queue for the lock (then a
        waiter whose first attempt registered it may park at once)."""
        mgr = pubsub.existing_manager(self._sync_client)
        return mgr is not None and mgr.grants_heard(self._channel)

    def _top_up(self, k: HoldKey) -> tuple[Any, ...] | None:
        """RENEW args that give a lease-mode hold, granted with the short grant lease, the rest
        of its own lease before the caller hears it holds the lock (None: nothing to do)."""
        hold = watchdog().get(k)
        if hold is None or not hold.top_up_ms or hold.renew:
            return None
        hold.top_up_ms = 0
        return (k[2], max(1, int((hold.expires_at - time.monotonic()) * 1000)))

    def _withdrawn(self, r: Any) -> None:
        """A withdrawal's reply: if it gave a grant of ours back, it went on like a release."""
        if isinstance(r, (bytes, str)):
            mgr = pubsub.existing_manager(self._sync_client)
            if mgr is not None:
                mgr.granted(self._channel, r)

    def _withdraw_failed(self, token: str, deadline: float | None) -> None:
        """A withdrawal whose round trip failed is not forgotten: its entry would be granted
        the lock by the next release, for a wait that is over (``withdrawals``)."""
        withdrawals.later(self._sync_client, self._wait_keys[3], token, deadline)

    # -- holds that may have run out before their owner could run (invariant 31) ----------
    def _in_doubt(self, k: HoldKey, late: bool = False) -> Any:
        """The hold just booked for ``k``, if its validity (counted from the earliest moment its
        lease can have started) is nearly over, or ``late``: the process may have been frozen
        past it (SIGSTOP, a paused VM), and another owner may hold the lock now. None: the
        booking stands without a round trip."""
        hold = watchdog().get(k)
        if hold is None or hold.count != 1:
            return None
        if not late and hold.valid_until - time.monotonic() > min(
                GRANT_CHECK_MARGIN, hold.lease_ms / 4000.0):
            return None
        return hold

    def _check_args(self, hold: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
        """KEYS, ARGV and lease of the one renewal that checks ``hold`` (its kind's own)."""
        now = time.monotonic()
        ms = hold.cap(hold.lease_ms if hold.renew
                      else max(1, int((hold.expires_at - now) * 1000)), now)
        return (hold.renew_key,), (hold.owner, ms), ms

    def _checked(self, k: HoldKey, hold: Any, sent: float, ms: int, reply: Any) -> bool:
        """Book the check's reply: still ours (its lease set again from ``sent``), or gone, and
        then never held as far as the caller is told."""
        if reply and int(reply[0]):
            watchdog().confirmed(k, hold, sent, ms)
            return True
        if watchdog().discard(k, hold):
            self._discarded()
            logger.info("django-rlock: %r ran out for %s before it could run (the process was "
                        "stopped or paused); never held, waiting on", self.name, k[2])
            if events.listeners:
                events.emit("lost", name=self.name, key=self.key, label=self.label, owner=k[2],
                            held=0.0, how="it ran out before its owner could run",
                            reason="ran_out")
        return False

    def _discarded(self) -> None:
        """A kind's own bookkeeping of an acquire that turned out not to hold (invariant 31)."""

    def _force_args(self) -> tuple[Any, ...]:
        return (UNLOCK_MESSAGE,)

    #: The holder's remaining lease (ms) that this object's last failed attempt returned: a
    #: busy answer's Retry-After without a second round trip (PTTL read later says nothing
    #: if the holder released in between). None: no attempt failed yet.
    busy_ttl_ms: int | None = None

    def _ttl_of(self, reply: Any) -> int | None:
        """The acquire reply as None (acquired) or a wait bound in ms."""
        if reply is None:
            return None
        self.busy_ttl_ms = ttl = int(reply)
        return ttl

    def _wait_channel(self, field: str) -> bytes:
        """Where this owner's wake-up comes (a fair lock has one per waiter)."""
        return self._channel

    def _field(self) -> str:
        """The calling owner's hash field (the hold's identity in the watchdog too)."""
        return self._owner()

    # -- replica sync (docs: replicas.py) -------------------------------------------------
    def _sync_target(self, connected: int | None) -> tuple[int, int] | None:
        """(replicas to WAIT for, acknowledgements required), or None: nothing to wait for.

        ``"auto"`` (replicas online) needs one acknowledgement and WAITs for just that one:
        Sentinel promotes the most up-to-date replica, so one that has the lock is enough, and
        a stalled replica then costs nothing while another answers. An int needs that many.
        """
        if not connected or self.sync_replicas is None:
            return None
        if self.sync_replicas == "auto":
            return 1, 1
        return int(self.sync_replicas), int(self.sync_replicas)

    def _wait_args(self, target: tuple[int, int] | None) -> tuple[int, int] | None:
        return None if target is None else (target[0], self._sync_timeout_ms)

    def _shortfall(self, acked: Any, target: tuple[int, int], connected: int,
                   what: str) -> LockNotSyncedError | None:
        """The error for too few acknowledgements (None if enough, or WAIT is refused)."""
        if isinstance(acked, ResponseError):
            if "unknown command" in str(acked).lower():
                replicas._parse(self._server, None, acked)  # turns the check off, logged once
                return None
            raise acked
        if int(acked) >= target[1]:
            return None
        replicas.forget(self._server)  # maybe a replica left: probe again next time
        return LockNotSyncedError(
            f"{what} of lock {self.name!r} reached the master, but {int(acked)} of {connected} "
            f"replica(s) acknowledged it within {self.sync_timeout:g} s (needed {target[1]})",
            self.name, connected, int(acked), target[1])

    def _release_unsynced(self, err: LockNotSyncedError) -> None:
        # A release is done once the master has it; a failover now may bring the lock back
        # until its lease ends (nobody renews it). Worth knowing, not worth failing the caller.
        logger.warning("django-rlock: %s; after a failover it may reappear until its lease ends",
                       err)

    def _info(self, owner: str) -> str:
        """What the index says about ``owner`` (the caller) while it holds the lock."""
        raise NotImplementedError

    def _acquired(self, k: HoldKey, lease_ms: int | None, t0: float,
                  thread: threading.Thread | None = None, grant_ms: int | None = None,
                  since: float | None = None) -> Any:
        # Registered before the caller hears of it, so no unlock can run ahead of it.
        # ``since``: when the lease Redis set can have started at the earliest (invariant 31).
        renew = lease_ms is None
        self._fresh()  # renewed where the slot is now (a redirected acquire)
        hold = watchdog().acquired(k, self._sync_client, self.name,
                                   self._watchdog_ms if renew else lease_ms, renew,
                                   self.watchdog_timeout, self._on_lost, thread=thread,
                                   label=self.label, scripts_keys=self._release_keys,
                                   kind=self._hold_kind, grant_ms=grant_ms, since=since, prefix=self.prefix,
                                   max_hold=self.max_hold, warn_after=self.warn_held_after)
        if events.listeners and hold.count == 1:
            events.emit("acquired", name=self.name, key=self.key, label=self.label, owner=k[2],
                        kind=type(self).__name__, wait=time.monotonic() - t0,
                        lease=None if renew else lease_ms / 1000.0)  # type: ignore[operator]
        return hold

    def _grant_callback(self, k: HoldKey, lease_ms: int | None,
                        t0: float) -> Callable[..., Any]:
        # A grant to this wait was made after the wait began, at the earliest (invariant 31).
        return lambda grant_ms=None, since=None: self._acquired(
            k, lease_ms, t0, grant_ms=grant_ms, since=t0 if since is None else since)

    def _registers(self, k: HoldKey, wait: float | None, park_until: float) -> bool:
        """Whether a wait's first attempt carries the hand-off registration (a token, 3 more
        keys, 5 more args, a wake-line lookup: about 30 us of client CPU per pair). Only on a
        lock this process has found held; elsewhere it is the plain acquire, and a lock found
        held costs one more attempt, once per key (``_found_held``)."""
        return (self._HANDOFF and wait != 0
                and bool(park_until or (k[0], k[1]) in _contended))

    @staticmethod
    def _found_held(k: HoldKey) -> None:
        if len(_contended) >= _CONTENDED_MAX:
            _contended.clear()
        _contended[(k[0], k[1])] = None

    def _park_first_until(self, k: HoldKey, wait: float | None) -> float:
        """0.0 to attempt at once; else the time to park until before the first attempt.

        Not for a reentry, and not for one-shot tries. Otherwise a thread does not barge
        ahead of this process's queued waiters, nor straight back in after a release that
        woke other processes.
        """
        if wait == 0 or watchdog().get(k) is not None:
            return 0.0
        until = 0.0
        mgr = pubsub.existing_manager(self._sync_client)
        if mgr is not None and mgr.busy(self._channel):
            until = max(mgr.expires_hint(self._channel), time.monotonic() + 1e-3)
        polite = releasing.yield_until.get((self._server, self.key))
        if polite is not None:
            if polite > time.monotonic():
                until = max(until, polite)
            else:
                releasing.yield_until.pop((self._server, self.key), None)
        return until

    def _waiting(self, k: HoldKey, lease_ms: int | None, t0: float, token: str | None = None,
                 registered: bool = False, line: Any = None,
                 deadline: float | None = None) -> waiting.Wait:
        """This lock's wait: its channel, and what a hand-off to the waiter needs."""
        self._fresh()  # on a cluster, an attempt redirected: subscribe where the slot is now
        told: dict[str, Any] = {"name": self.name, "label": self.label, "kind": type(self).__name__,
                "owner": k[2], "since": t0}  # what the wait's events report
        if not self._HANDOFF:
            return waiting.Wait(self._sync_client, self._wait_channel(k[2]), self.key,
                                wakes=self._WAKES, recheck=self._RECHECK,
                                moved=self._moved_check(), **told)
        handoff = waiting.HandOff(k[2], self._watchdog_ms if lease_ms is None else lease_ms,
                                  self._grant_callback(k, lease_ms, t0), self._info(k[2]),
                                  grant=self._grant_channel,
                                  token=None if token is None else token.encode(),
                                  registered=registered, grant_ms=self._grant_ms(lease_ms),
                                  line=line, deadline=deadline,
                                  slack_ms=REGISTRATION_SLACK_MS)
        return waiting.Wait(self._sync_client, self._channel, self.key,
                            moved=self._moved_check(), handoff=handoff, **told)

    def _holds_now(self) -> list[Any]:
        return watchdog().holds_of(self._server, self.key)

    def _forced(self, r: Any, before: list[Any]) -> bool:
        # Only the holds that existed before the delete: one taken since is valid.
        watchdog().drop_holds(before)
        if r:
            mgr = pubsub.existing_manager(self._sync_client)
            if mgr is not None:
                mgr.wake(self._channel)
        if events.listeners:
            events.emit("force_unlocked", name=self.name, key=self.key, label=self.label,
                        deleted=bool(r))
        return bool(r)

    @property
    def server(self) -> Any:
        """Which Redis database this lock is on (``watchdog.server_id``): holds are keyed by it."""
        return self._server

    def current_owner(self) -> str:
        """The calling thread's (or task's) owner id for this lock."""
        return self._owner()

    def is_lost(self) -> bool:
        """True if the watchdog found this owner's hold gone (expired, force-unlocked, past
        its ``max_hold``), or in doubt (no renewal confirmed within its lease)."""
        return watchdog().is_lost((self._server, self.key, self._field()))

    def lost_reason(self) -> str | None:
        """Why ``is_lost()`` is true (``"expired"``, ``"force_unlocked"``, ``"unconfirmed"``,
        ``"ran_out"``, ``"max_hold"``); None while it is false."""
        return watchdog().lost_reason((self._server, self.key, self._field()))

    def _owner(self) -> str:
        raise NotImplementedError


def ttl_seconds(pttl: Any) -> float | None:
    ms = int(pttl)
    if ms == -2:
        return None
    if ms == -1:
        return float("inf")
    return ms / 1000.0


def log_masked_release(name: str, exc_type: type[BaseException], err: Exception) -> None:
    # Never let a failed release mask the block's own exception (redis-py #623).
    logger.warning("django-rlock: releasing %r after %s failed: %s", name, exc_type.__name__, err)
