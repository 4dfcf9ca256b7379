"""What the sync and asyncio leader elections share (``leader.Leader``, ``aioleader.AsyncLeader``):
the group's lock (FencedLock with the kind ``leader``), a term and when it stops being
confirmed, ``LeaderInfo``, validation and the public attributes (docs/engine.md, invariant 34).

Contract read by other modules (the beat schedulers' term check): ``key`` (the lock hash,
field = ``owner`` while held), ``token_key`` (the fencing counter, raised only by a winning
acquire), ``owner``, ``term``, ``client``. A term is current in Redis iff
``HEXISTS key owner`` and ``GET token_key == term``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import events, identity
from .errors import LockError
from .fenced import AsyncFencedLock, FencedLock
from .lockinfo import decoded, describes, number, parse_entry
from .naming import leader_name
from .wait import manager as pubsub
from .wait.channel import wake_all
from .wait.slot import Slot
from .watchdog import Hold, watchdog

logger = logging.getLogger("django_rlock")

#: A leader believes it leads until this fraction of the lease has passed since the send time
#: of the last renewal Redis confirmed (the watchdog renews every third of it). The rest of
#: the lease (a third) is the margin for clock-rate drift and for the old leader to act on
#: the news before its key can expire (docs/engine.md, invariant 34).
SAFE_FRACTION = 2.0 / 3.0

#: After a Redis error while campaigning: the first pause (s), doubled up to ``RETRY_MAX``.
RETRY_MIN = 0.1
RETRY_MAX = 2.0

#: The reasons ``on_revoked`` is given.
STOPPED, LOST, IN_DOUBT = "stopped", "lost", "in doubt"


class CampaignStopped(LockError):
    """Raised inside a standby's wait when its Leader is stopped (ends the wait)."""


def check_group(group: Any) -> str:
    """A group name: a non-empty str (raised before any Redis command)."""
    if not isinstance(group, str):
        raise TypeError(f"leader group must be a str, not {type(group).__name__} ({group!r})")
    if not group:
        raise ValueError("leader group must not be empty")
    return group


def check_callback(fn: Any, what: str, group: str) -> None:
    if fn is not None and not callable(fn):
        raise TypeError(f"{what} must be callable or None, not {type(fn).__name__} "
                        f"(leader group {group!r})")


def check_lease(watchdog_timeout: Any, group: str) -> float:
    """A leadership's lease (``watchdog_timeout``): a finite number of seconds > 0, refused
    before any Redis command naming the group (the user's word; the lock under it is ours)."""
    if isinstance(watchdog_timeout, bool) or not isinstance(watchdog_timeout, (int, float)):
        raise TypeError(f"watchdog_timeout must be a number of seconds, not "
                        f"{type(watchdog_timeout).__name__} (leader group {group!r})")
    if not (math.isfinite(watchdog_timeout) and watchdog_timeout > 0):
        raise ValueError(f"watchdog_timeout must be a finite number > 0 seconds, got "
                         f"{watchdog_timeout!r} (leader group {group!r})")
    return float(watchdog_timeout)


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads a group, as Redis has it (readable from any process).

    ``since``: when the term began, in the Redis server's clock (Unix seconds). ``host``,
    ``pid``, ``process`` (``identity.process_label``) are None for a holder that left no index
    entry (a Java Redisson client on the same key).
    """

    group: str
    owner: str
    term: int | None
    host: str | None
    pid: int | None
    process: str | None
    since: float | None


def info_of(group: str, fields: Any, entry: Any, token: Any) -> LeaderInfo | None:
    """A ``LeaderInfo`` from HGETALL key, HGET index key and GET token_key (None: no leader)."""
    held = decoded(fields)
    if not held:
        return None
    owner = next(iter(held))
    host = pid = process = since = None
    parsed = parse_entry(entry)
    if parsed is not None and describes(parsed[1], owner):
        since, about = parsed
        host = about.get("host") if isinstance(about.get("host"), str) else None
        pid = number(about.get("pid"))
        process = about.get("process") if isinstance(about.get("process"), str) else None
    return LeaderInfo(group, owner, number(token), host, pid, process, since)


def until(hold: Hold) -> float:
    """The monotonic time up to which ``hold``'s leadership is confirmed: ``SAFE_FRACTION`` of
    the lease after the send time of the last round trip that Redis confirmed."""
    lease = hold.lease_ms / 1000.0
    return hold.valid_until - lease * (1.0 - SAFE_FRACTION)


class _LeaderLockMixin:
    """What the sync and asyncio leader locks add to FencedLock: the kind in the index, every
    local waiter woken by a message, a wait that a stop ends, and the leader's watch."""

    # A message on the channel (a release, a force-unlock) wakes every waiter of this process:
    # the leader's watch and a standby of the same process both need it.
    _WAKES = staticmethod(wake_all)

    key: str
    _channel: bytes
    _sync_client: Any

    def _leader_init(self) -> None:
        #: Set by ``Leader.stop``: the standby's next attempt raises ``CampaignStopped``.
        self.stopping = False

    def _info(self, owner: str) -> str:
        return identity.with_kind(self._holder_info(owner), "leader")

    def _holder_info(self, owner: str) -> str:
        raise NotImplementedError

    def watch(self, loop: Any = None) -> Slot:
        """A place in this process's queue for the key's channel, so a force-unlock's message
        (or a ``nudge``) wakes the leader at once. Pair with ``Slot.leave``."""
        return pubsub.manager(self._sync_client).enter(self._channel, self.key, wakes=wake_all,
                                                       loop=loop)

    def confirmation(self, slot: Slot, loop: Any) -> Any:
        """For an asyncio watch: a future resolved once its subscription is confirmed (None:
        it is already)."""
        return pubsub.manager(self._sync_client).confirmation(slot, loop)

    def nudge(self) -> None:
        """Wake this process's waiters on the key (the leader's watch, a stopping standby)
        without a message through Redis."""
        mgr = pubsub.existing_manager(self._sync_client)
        if mgr is not None:
            mgr.wake(self._channel)


class LeaderLock(_LeaderLockMixin, FencedLock):
    """The group's FencedLock (kind ``leader`` in listings). Its ``force_unlock`` deposes."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 **kwargs: Any) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, **kwargs)
        self._leader_init()

    _holder_info = staticmethod(identity.thread_info_inline)

    def _attempt(self, k: Any, lease_ms: int | None, t0: float, claim: bool = False,
                 reg: Any = None) -> int | None:
        if self.stopping:
            raise CampaignStopped(f"leader campaign for {self.key!r} stopped")
        return super()._attempt(k, lease_ms, t0, claim, reg)

    def holds(self, owner: str) -> bool:
        """Whether Redis has ``owner``'s field in the key (one HEXISTS)."""
        return bool(self._reader.hexists(self.key, owner))

    def read(self, group: str) -> LeaderInfo | None:
        pipe = self._reader.pipeline(transaction=False)
        pipe.hgetall(self.key)
        pipe.hget(self._index, self.key)
        pipe.get(self.token_key)
        fields, entry, token = pipe.execute()
        return info_of(group, fields, entry, token)


class AsyncLeaderLock(_LeaderLockMixin, AsyncFencedLock):
    """``LeaderLock`` for asyncio."""

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 **kwargs: Any) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, **kwargs)
        self._leader_init()

    _holder_info = staticmethod(identity.task_info_inline)

    async def _attempt(self, k: Any, lease_ms: int | None, t0: float, claim: bool = False,
                       reg: Any = None) -> int | None:
        if self.stopping:
            raise CampaignStopped(f"leader campaign for {self.key!r} stopped")
        return await super()._attempt(k, lease_ms, t0, claim, reg)

    async def holds(self, owner: str) -> bool:
        return bool(await self._reader.hexists(self.key, owner))

    async def read(self, group: str) -> LeaderInfo | None:
        pipe = self._reader.pipeline(transaction=False)
        pipe.hgetall(self.key)
        pipe.hget(self._index, self.key)
        pipe.get(self.token_key)
        fields, entry, token = await pipe.execute()
        return info_of(group, fields, entry, token)


class Term:
    """One leadership of this process: its hold, token and owner, and why it ended."""

    __slots__ = ("hold", "token", "owner", "over", "reason")

    def __init__(self, hold: Hold, token: int, owner: str) -> None:
        self.hold = hold
        self.token = token
        self.owner = owner
        self.over = False          # latched: never confirmed again
        self.reason = IN_DOUBT

    def confirmed(self, now: float | None = None) -> bool:
        """Still confirmed (and, once not, never again: the term is over)."""
        if self.over:
            return False
        hold = self.hold
        if hold.lost or watchdog().get((hold.server, hold.key, hold.owner)) is not hold:
            self.over, self.reason = True, LOST
            return False
        if (time.monotonic() if now is None else now) >= until(hold):
            self.over = True
            return False
        return True


class LeaderBase:
    """What ``Leader`` and ``AsyncLeader`` share: validation, the public attributes, the term."""

    def __init__(self, client: Any, group: str, prefix: str, watchdog_timeout: float,
                 on_elected: Callable[[int], Any] | None,
                 on_revoked: Callable[[str], Any] | None, lock_class: Any) -> None:
        check_group(group)
        check_lease(watchdog_timeout, group)
        check_callback(on_elected, "on_elected", group)
        check_callback(on_revoked, "on_revoked", group)
        self.group = group
        self.on_elected = on_elected
        self.on_revoked = on_revoked
        self._lock = lock_class(client, leader_name(group), prefix, watchdog_timeout,
                                on_lost=self._on_lost, label=leader_name(group))
        #: The leadership's Redis hash (field = ``owner`` while held) and its fencing counter.
        self.key: str = self._lock.key
        self.token_key: str = self._lock.token_key
        self.prefix = prefix
        self.watchdog_timeout = float(watchdog_timeout)
        self._mu = threading.Lock()
        self._term: Term | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.group!r} key={self.key!r} term={self.term}>"

    @property
    def client(self) -> Any:
        """The client the leadership's commands are sent on."""
        return self._lock.client

    @property
    def lock(self) -> Any:
        """The group's lock (kind ``leader``); its ``force_unlock()`` deposes the leader."""
        return self._lock

    def _on_lost(self, _name: str) -> None:
        # On the watchdog thread: only wake the Leader's own thread (or task).
        self._lock.nudge()

    def is_leader(self) -> bool:
        """True only while this process's leadership is confirmed: the last renewal Redis
        confirmed was sent less than ``SAFE_FRACTION`` of the lease ago (monotonic clock).
        Once false for a term, never true again for it."""
        with self._mu:
            t = self._term
            return t is not None and t.confirmed()

    @property
    def term(self) -> int | None:
        """The fencing token of the current leadership (None when not leader)."""
        with self._mu:
            t = self._term
            return t.token if t is not None and t.confirmed() else None

    @property
    def owner(self) -> str | None:
        """The key's hash field of this process's leadership while it leads (None otherwise)."""
        with self._mu:
            t = self._term
            return t.owner if t is not None and t.confirmed() else None

    def abandon(self, term: int) -> bool:
        """Give ``term`` up now, if it is this process's current one: ``is_leader()`` is false
        from here on, and the Leader's thread (or task) then says so (``on_revoked("lost")``,
        a WARNING), releases the key and campaigns again, for a new term.

        For a caller whose fenced write Redis refused while the leadership is still renewed:
        renewal looks at the key's hash only, so a term whose token key was lost (evicted, or
        deleted by hand) would otherwise go on "leading" with every fenced write refused, and
        no standby elected. False (nothing done) if ``term`` is not the current term."""
        with self._mu:
            t = self._term
            if t is None or t.token != term or not t.confirmed():
                return False
            t.over, t.reason = True, LOST
        self._lock.nudge()  # wakes the Leader's watch, which finds the term over
        return True

    def _elect(self, token: int, owner: str) -> Term | None:
        hold = watchdog().get((self._lock.server, self.key, owner))
        if hold is None:
            return None
        term = Term(hold, token, owner)
        with self._mu:
            self._term = term
        return term

    def _end(self, term: Term, reason: str | None = None) -> str:
        """Latch ``term`` over (is_leader() false from here on); returns why it ended."""
        with self._mu:
            if reason is not None and not term.over:
                term.over, term.reason = True, reason
            elif not term.over:
                term.confirmed()
                term.over = True
            if self._term is term:
                self._term = None
            return term.reason

    def _emit(self, event: str, **data: Any) -> None:
        if events.listeners:
            lock = self._lock
            events.emit(event, name=lock.name, key=lock.key, label=lock.label, group=self.group,
                        **data)

    def _announce(self, token: int, reason: str | None = None) -> None:
        """One log line and one event per election and per revocation (a loss or doubt is a
        WARNING)."""
        if reason is None:
            self._emit("leader_elected", term=token)
        else:
            self._emit("leader_revoked", term=token, reason=reason)
        if reason is None:
            logger.info("django-rlock: %s is the leader of %r, term %d",
                        identity.process_label(), self.group, token)
        else:
            logger.log(logging.INFO if reason == STOPPED else logging.WARNING,
                       "django-rlock: %s is no longer the leader of %r (term %d): %s",
                       identity.process_label(), self.group, token, reason)


__all__ = ["IN_DOUBT", "LOST", "RETRY_MAX", "RETRY_MIN", "SAFE_FRACTION", "STOPPED",
           "AsyncLeaderLock", "CampaignStopped", "LeaderBase", "LeaderInfo", "LeaderLock",
           "Term", "check_callback", "check_group", "info_of", "until"]
