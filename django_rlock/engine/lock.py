"""RLock: Redisson's reentrant lock on a redis-py client.

One acquire attempt and one release are one EVALSHA each, sent once (see ``scripts``).
Waiting is pub/sub driven (``pubsub``), renewal is the process watchdog's (``watchdog``).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import events, identity, replicas, withdrawals
from .clients import SlotBound, check_client, is_cluster_node, refresh
from .errors import LockNotOwnedError, LockNotSyncedError
from .kinds import Kind, declare
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
    REDIRECT_BACKOFF,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
    Script,
    call_once,
)
from .wait import lines as wakeline
from .wait import loop as waiting
from .wait import manager as pubsub
from .wait import settings as wait_settings
from .watchdog import HoldKind, server_id, watchdog

logger = logging.getLogger("django_rlock")

SUBSCRIBE_TIMEOUT = wait_settings.SUBSCRIBE_TIMEOUT
#: After a release that woke waiters in *other* processes, this process lets them have the
#: first go for this long (seconds) instead of re-grabbing at once: a loop of
#: lock/unlock in one process would otherwise starve every other process.
YIELD_WINDOW = 0.005

_yield_until: dict[tuple[Any, str], float] = {}

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


class LockBase(SlotBound):
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
                 on_lost: Callable[[str], Any] | None, label: str | None = None,
                 sync_replicas: int | str | None = "auto", sync_timeout: float = 1.0) -> None:
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
        self.key = prefix + name
        client = self._bind(client)  # on a cluster: its slot's master
        self.name = name
        self.prefix = prefix
        self.watchdog_timeout = wt
        self._watchdog_ms = max(1, math.ceil(wt * 1000))
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
        ms = hold.lease_ms if hold.renew else max(1, int((hold.expires_at - now) * 1000))
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
                            held=0.0, how="it ran out before its owner could run")
        return False

    def _discarded(self) -> None:
        """A kind's own bookkeeping of an acquire that turned out not to hold (invariant 31)."""

    def _force_args(self) -> tuple[Any, ...]:
        return (UNLOCK_MESSAGE,)

    def _ttl_of(self, reply: Any) -> int | None:
        """The acquire reply as None (acquired) or a wait bound in ms."""
        return None if reply is None else int(reply)

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
                                   kind=self._hold_kind, grant_ms=grant_ms, since=since)
        if events.listeners and hold.count == 1:
            events.emit("acquired", name=self.name, key=self.key, label=self.label, owner=k[2],
                        wait=time.monotonic() - t0,
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
        polite = _yield_until.get((self._server, self.key))
        if polite is not None:
            if polite > time.monotonic():
                until = max(until, polite)
            else:
                _yield_until.pop((self._server, self.key), None)
        return until

    def _waiting(self, k: HoldKey, lease_ms: int | None, t0: float, token: str | None = None,
                 registered: bool = False, line: Any = None) -> waiting.Wait:
        """This lock's wait: its channel, and what a hand-off to the waiter needs."""
        self._fresh()  # on a cluster, an attempt redirected: subscribe where the slot is now
        if not self._HANDOFF:
            return waiting.Wait(self._sync_client, self._wait_channel(k[2]), self.key,
                                wakes=self._WAKES, recheck=self._RECHECK,
                                moved=self._moved_check())
        handoff = waiting.HandOff(k[2], self._watchdog_ms if lease_ms is None else lease_ms,
                                  self._grant_callback(k, lease_ms, t0), self._info(k[2]),
                                  grant=self._grant_channel,
                                  token=None if token is None else token.encode(),
                                  registered=registered, grant_ms=self._grant_ms(lease_ms),
                                  line=line)
        return waiting.Wait(self._sync_client, self._channel, self.key,
                            moved=self._moved_check(), handoff=handoff)

    # -- release bookkeeping --------------------------------------------------------------
    def _release_plan(self, k: HoldKey) -> _Release:
        wd = watchdog()
        hold = wd.get(k)
        plan = _Release(k, hold, hold.lease_ms if hold is not None else self._watchdog_ms)
        if self._HANDOFF and (hold is None or hold.count <= 1):
            # The final release: maybe hand off, maybe publish.
            plan.mgr = pubsub.existing_manager(self._sync_client)
            if plan.mgr is not None:
                plan.heir = plan.mgr.reserve(self._channel, self.key)
                plan.echo = plan.mgr.expect_echo(self._channel)
        args: tuple[Any, ...] = self._release_args(k[2], plan.lease_ms)
        if plan.heir is not None:
            args += (plan.heir.owner, plan.heir.lease_ms, 1, plan.heir.info)
        if self._HANDOFF:
            if plan.heir is None:
                args += ("", 0, 0, "")
            args += ("", identity.process_id())
        plan.args = args
        return plan

    def _release_failed(self, plan: _Release) -> None:
        watchdog().released(plan.k, plan.hold, fully=False)
        self._settle(plan, None)
        if self._HANDOFF and (plan.hold is None or plan.hold.count <= 0):
            # The outcome is unknown: it may have granted the lock to a waiter of ours, without
            # a message (the reply was to say so). One of them asks (a claim finds out).
            mgr = pubsub.existing_manager(self._sync_client)
            if mgr is not None:
                mgr.wake(self._channel)

    def _release_done(self, plan: _Release, r: Any) -> pubsub.Waiter | None:
        """Book a release reply; returns a waiter to release on behalf of, if any."""
        wd = watchdog()
        if r is None:
            wd.forget(plan.k)
            wd.forget_lost(plan.k)
            self._settle(plan, None)
            raise LockNotOwnedError(
                f"cannot unlock {self.name!r}: it is not held by this owner ({plan.k[2]}); it was "
                f"never acquired, its lease expired, or it was lost or force-unlocked", self.name)
        if isinstance(r, (bytes, str)):  # granted to a registered waiter
            wd.released(plan.k, plan.hold, fully=True)
            if events.listeners:
                since = plan.hold.since if plan.hold is not None else time.monotonic()
                events.emit("released", name=self.name, key=self.key, label=self.label,
                            owner=plan.k[2], held=time.monotonic() - since, reason="unlock")
            return self._settle(plan, r)
        r = int(r)
        wd.released(plan.k, plan.hold, fully=r != 0)
        if r != 0 and events.listeners:
            since = plan.hold.since if plan.hold is not None else time.monotonic()
            events.emit("released", name=self.name, key=self.key, label=self.label,
                        owner=plan.k[2], held=time.monotonic() - since, reason="unlock")
        return self._settle(plan, r)

    def _settle(self, plan: _Release, r: int | bytes | str | None) -> pubsub.Waiter | None:
        """Tell the pub/sub side what the release did: hand-off, grant, publish, or nothing."""
        token = r if isinstance(r, (bytes, str)) else None
        published = token is None and r is not None and r > 0 and self._HANDOFF  # type: ignore[operator]
        mgr, heir = plan.mgr, plan.heir
        orphan = None
        if mgr is not None:
            try:
                if plan.echo and not published:
                    mgr.cancel_echo(self._channel)
                if token is not None:
                    # Granted to a registered waiter: if it is one of ours, it owns the lock
                    # now (its grant message, when it comes, finds it served).
                    mgr.granted(self._channel, token, plan.sent)
            finally:
                # Always settled, or the heir would wait for the outcome forever. An unknown
                # outcome (r None) is "not granted": the heir's own claim finds out. Not
                # granted because a registered waiter came first: the heir retries, and so
                # takes its place in line.
                if heir is not None and not mgr.resolve(self._channel, heir, r == -1,
                                                        plan.sent):
                    orphan = heir  # it left before the hand-off settled: release for it
        if published:
            receivers = r - 1
            if mgr is None:
                mgr = pubsub.existing_manager(self._sync_client)
            if mgr is not None:
                if mgr.subscribed(self._channel):
                    receivers -= 1  # our own subscription got the message too
                mgr.wake(self._channel)
            if receivers > 0:
                _be_polite(self._server, self.key)
        return orphan

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

    def is_lost(self) -> bool:
        """True if the watchdog found this owner's hold gone (expired or force-unlocked)."""
        return watchdog().is_lost((self._server, self.key, self._field()))

    def _owner(self) -> str:
        raise NotImplementedError


class _Release:
    __slots__ = ("k", "hold", "lease_ms", "mgr", "heir", "echo", "args", "sent")

    def __init__(self, k: HoldKey, hold: Any, lease_ms: int) -> None:
        self.k = k
        self.hold = hold
        self.lease_ms = lease_ms
        self.mgr: pubsub.PubSubManager | None = None
        self.heir: pubsub.Waiter | None = None
        self.echo = False
        self.args: tuple[Any, ...] = ()
        self.sent: float | None = None  # when the release went out (a heir's lease starts later)


def _be_polite(server: Any, key: str) -> None:
    if len(_yield_until) > 1024:
        now = time.monotonic()
        for stale, t in list(_yield_until.items()):  # other threads insert and pop meanwhile
            if t <= now:
                _yield_until.pop(stale, None)
    _yield_until[(server, key)] = time.monotonic() + YIELD_WINDOW


class RLock(LockBase):
    """A reentrant, Redisson-compatible distributed lock.

    The owner is ``<process uuid>:<thread id>``: reentrant per thread, exclusive across
    threads, processes (forked children included) and hosts. ``lease_time=None`` means
    watchdog mode: a ``watchdog_timeout`` lease kept alive by this process while held.

    ``on_lost(name)`` is called (on the watchdog thread) if a renewal finds the lock gone
    while it is held; ``is_lost()`` tells the holder the same.
    """

    _CLUSTER = True

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[[str], Any] | None = None, label: str | None = None,
                 sync_replicas: int | str | None = "auto", sync_timeout: float = 1.0) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, on_lost, label, sync_replicas,
                         sync_timeout)
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
        self._acquire(None, self._lease_ms(lease_time))

    def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        """Try for up to ``wait_time`` seconds (0: exactly one attempt)."""
        wait = self._wait_budget(wait_time)
        return self._acquire(wait, self._lease_ms(lease_time))

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """``threading.RLock.acquire`` semantics (watchdog mode)."""
        if not blocking:
            if timeout != -1:
                raise ValueError(f"can't specify a timeout for a non-blocking call (lock {self.name!r})")
            return self._acquire(0.0, None)
        if timeout == -1:
            return self._acquire(None, None)
        return self._acquire(check_seconds(timeout, "timeout", self.name, zero_ok=True), None)

    def _attempt(self, k: HoldKey, lease_ms: int | None, t0: float, claim: bool = False,
                 reg: tuple[str, float | None] | None = None) -> int | None:
        """One acquire round trip: None when acquired, else the holder's PTTL in ms (or
        ``CLAIMED``: a grant reached this waiter, booked by the wait).

        ``reg=(token, deadline)``: a waiter's attempt, which registers it in the hand-off
        queue if it fails. With replicas, WAIT rides in the same round trip; too few
        acknowledgements undo the acquire (one more round trip) and raise
        ``LockNotSyncedError``.
        """
        args = self._acquire_args(k, lease_ms, claim)
        keys = self._acquire_keys
        if reg is not None:
            args = args[:4] + self._register_args(reg[0], reg[1], self._grant_ms(lease_ms))
            keys = self._wait_keys
        connected, target = self._target()
        sent = time.monotonic()
        if target is None:
            ttl = self._ttl_of(call_once(self._client, self._ACQUIRE, keys, args))
        else:
            try:
                reply, acked = call_once(self._client, self._ACQUIRE, keys, args,
                                         self._wait_args(target))
            except (RedisConnectionError, RedisTimeoutError):
                # A failover (seen, or behind a fixed address: WAIT then times out): count the
                # new master's replicas next time.
                replicas.forget(self._server)
                raise
            ttl = self._ttl_of(reply)
            err = self._shortfall(acked, target, connected, "an acquire") if ttl is None else None
            if err is not None:
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
            return waiting.wait(self._waiting(k, lease_ms, t0),
                                lambda claim: self._attempt(k, lease_ms, t0, claim),
                                wait, self.unlock, park_until, verify=lambda: self._verified(k))

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
        got = waiting.wait(self._waiting(k, lease_ms, t0, token, registered, line),
                           lambda claim: self._attempt(k, lease_ms, t0, claim, (token, deadline)),
                           wait, self.unlock, park_until, withdraw, lambda: self._verified(k))
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
                r = call_once(self._client, self._RELEASE, self._release_keys, plan.args)
            else:
                r, acked = call_once(self._client, self._RELEASE, self._release_keys, plan.args,
                                     self._wait_args(target))
                err = self._shortfall(acked, target, connected, "a release")
                if err is not None and r is not None:
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

    release = unlock

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


def _async_rlock(client: Any, name: str, prefix: str = "", **options: Any) -> Any:
    from .aio import AsyncRLock  # aio imports this module

    return AsyncRLock(client, name, prefix, **options)


KIND = declare(Kind(
    "lock", "hash",
    note="Its waiters are woken and one of them takes the lock; waiters in its hand-off line "
         "keep their places.",
    open=RLock, locks={None: RLock}, async_locks={None: _async_rlock}))
