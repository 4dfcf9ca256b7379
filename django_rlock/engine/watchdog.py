"""What this process holds, and the one thread that keeps watchdog-mode holds alive.

Every hold (a key held by one owner of this process) has a record here: its local hold
count, the lease in force, and, in watchdog mode, when it is next due for renewal. One
daemon thread per process (the sweep) takes the due holds off a timeline
(``renewal.Timeline``) and queues them per Redis server; one drain per server, on a pool
thread, sends them in pipelines of batched RENEW scripts, at most ``PIPELINE_HOLDS`` holds
each, until its queue is empty.

Scheduling: the sweep sleeps until the earliest due time, then takes every hold at most its
slack (``period / 2``) from due, so holds acquired at scattered times fall into the same
batch and a period costs two wake-ups at most; neither a sweep nor an acquire looks at the
holds that are not due. The TTL stays above ``watchdog_timeout - period`` (two thirds of
it) while the process lives and keeps up; when it dies nothing renews and the lock expires
within ``watchdog_timeout``. A renewal sent with less than a sixth of its lease left is
counted and reported (a rate-limited WARNING): the process holds more than it can renew.

A hold whose thread has ended is not renewed but released at its next due time (a WARNING
names the lock and the thread): nobody can ever unlock it, since owner ids are never reused.

When nothing is due, the same thread starts the index sweep's rounds (``sweep``) on the pool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import AskError, MovedError, NoScriptError

from . import events, process, records, replicas, windows
from .clients import cluster_of, is_cluster_node, node_client, refresh
from .holds import INF, Hold, HoldKey, HoldKind, LostCallback, server_id
from .renewal import Lateness, Scheduler, renew_calls, results
from .scripts import Script
from .sweep import Sweeper

logger = logging.getLogger("django_rlock")

#: How long (s) a renewal that found its keys gone waits before it calls them lost, for a
#: release of their owners' that ran first on the server to be booked (this drain waits too).
RELEASE_GRACE = 0.2

#: Lost holds remembered for ``is_lost()`` until the owner acquires or releases again.
_MAX_LOST = 10_000


def _follow(group: list[Hold], exc: Exception) -> bool:
    """After a failed renewal on a cluster node: refresh the slot map and send each hold's next
    renewal to its slot's master now (a migration or failover moved it; ASK waits for MOVED).
    True if every hold was re-resolved."""
    cluster = cluster_of(group[0].client)
    if cluster is None or isinstance(exc, AskError) and not isinstance(exc, MovedError):
        return False
    refresh(cluster, exc)
    for h in group:
        try:
            h.client = node_client(cluster, h.key)
        except Exception:  # no map yet: the next failure tries again
            return False
    return True


class Watchdog:
    """The per-process registry of holds and its renewal thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._holds: dict[HoldKey, Hold] = {}
        self._lost: dict[HoldKey, Hold] = {}
        #: The sweep thread, the holds' due times and each server's queue and drain.
        self._sched = Scheduler(self._wakeup, self._holds, self._send, server_id, self.alarm,
                                self.notify)
        #: The index sweep of the servers and prefixes this process acquired on (``sweep``).
        self.sweeper = Sweeper(self._wakeup)
        self._sched.idle = self.sweeper.tick
        #: Round trips and renewed keys since start (read by tests and the benchmark).
        self.round_trips = 0
        self.renewed = 0
        #: Renewals sent with less than a sixth of their lease left (``late.total``).
        self.late = Lateness()

    # -- called by lock owners --------------------------------------------------------
    def get(self, k: HoldKey) -> Hold | None:
        return self._holds.get(k)

    def acquired(self, k: HoldKey, client: Any, name: str, lease_ms: int, renew: bool,
                 watchdog_timeout: float, on_lost: LostCallback | None, *,
                 thread: threading.Thread | None = None, label: str | None = None,
                 scripts_keys: tuple[Any, ...] = (), kind: HoldKind | None = None,
                 grant_ms: int | None = None, since: float | None = None,
                 max_hold: float | None = None, warn_after: float | None = None,
                 prefix: str | None = None) -> Hold:
        """Record a successful acquire, before the result is handed back to the caller.

        ``thread``: the owner thread, watched so its hold is released if it ends holding.
        ``kind``: how a lock kind other than RLock renews and ends its holds.
        ``grant_ms``: a release of another owner granted it with this (short) lease: the first
        renewal comes early (halfway through it), before a crashed heir could cost more.
        ``since``: the earliest moment the lease Redis set can have started (the send time of
        the round trip that set it; for a grant, the start of the wait it ends). Leases are
        counted from there, never from when the reply was read: a process frozen between the
        two must not believe in time it does not have (invariant 31).
        ``max_hold`` / ``warn_after``: the hold's time windows (``windows``), counted from its
        first acquire; a reentry may narrow ``max_hold``, never widen it.
        ``prefix``: the lock's, whose index on this server the sweep keeps clean (``sweep``).
        """
        now = time.monotonic()
        base = now if since is None else min(since, now)
        with self._lock:
            hold = self._holds.get(k)
            if hold is None or hold.lost or (not hold.renew and now >= hold.expires_at):
                hold = Hold(client, k[0], k[1], name, k[2])
                hold.thread = thread
                hold.label = label
                hold.scripts_keys = scripts_keys
                if kind is not None:
                    hold.renew_script = kind.renew_script
                    hold.renew_key = kind.renew_key
                    hold.end_script = kind.end_script
                    hold.end_args = kind.end_args
                # Windows count from the acquire's send, the earliest the hold can have begun
                # (never longer than asked); a grant's ``since`` is when its wait began, long
                # before it held: from when it is booked.
                start = now if grant_ms is not None else base
                hold.since = start  # what "held for" counts from: the windows' own start
                if max_hold:
                    hold.max_hold = max_hold
                    hold.deadline = start + max_hold
                if warn_after:
                    hold.warn_after = warn_after
                    hold.warn_at = start + warn_after
                self._holds[k] = hold
                self._lost.pop(k, None)
            elif max_hold and hold.since + max_hold < hold.deadline:
                hold.max_hold = max_hold
                hold.deadline = hold.since + max_hold
                if hold.due > 0:  # its alarm may come sooner now
                    self._sched.schedule(hold, hold.next_due, hold.next_slack)
            hold.count += 1
            hold.on_lost = on_lost
            due: float | None = None
            slack = 0.0  # a lease hold is forgotten once its lease is over, never before
            if renew and not hold.renew:
                hold.renew = True
                hold.period = watchdog_timeout / 3.0
                due = base + hold.period
                slack = hold.slack = hold.period / 2
            # The lease a partial release re-applies: a renewed hold stays in watchdog mode.
            hold.lease_ms = int(hold.period * 3000) if hold.renew else lease_ms
            if not hold.renew:
                # A grant's own lease starts when it is read (its top-up sets the rest); its
                # validity is still counted from ``base`` below.
                hold.expires_at = min(hold.deadline,
                                      (now if grant_ms is not None else base) + lease_ms / 1000.0)
                due = hold.expires_at + 1.0
            if grant_ms is not None and grant_ms < hold.lease_ms and hold.count == 1:
                # Renewed between a third and a half of the way through the grant lease: never
                # at once (a short hold is released long before, and costs nothing more).
                if not hold.renew:
                    hold.top_up_ms = 1  # the rest of its own lease, worked out when due
                due = base + grant_ms / 2000.0
                slack = hold.slack = grant_ms / 6000.0
                hold.valid_until = min(hold.deadline, base + grant_ms / 1000.0)
            else:
                hold.valid_until = min(hold.deadline,
                                       max(hold.valid_until, base + hold.lease_ms / 1000.0))
            if due is not None:
                self._sched.schedule(hold, due, slack)
            if prefix is not None:
                self.sweeper.note(client, k[0], prefix)
            self._sched.start()
            return hold

    def confirmed(self, k: HoldKey, hold: Hold, sent: float, lease_ms: int) -> None:
        """A round trip sent at ``sent`` found ``hold`` still ours and set ``lease_ms`` on it
        (a grant checked before its wait returned): its lease counts from there."""
        with self._lock:
            if self._holds.get(k) is not hold:
                return
            hold.top_up_ms = 0
            hold.valid_until = min(hold.deadline,
                                   max(hold.valid_until, sent + lease_ms / 1000.0))
            if hold.renew:
                hold.slack = hold.period / 2
                if sent + hold.period > hold.next_due:
                    self._sched.schedule(hold, sent + hold.period, hold.slack)

    def discard(self, k: HoldKey, hold: Hold) -> bool:
        """Drop a hold booked for a grant that Redis no longer has (it ran out while its heir
        could not run): never held as far as its owner is told. False if it was gone."""
        with self._lock:
            if self._holds.get(k) is not hold:
                return False
            del self._holds[k]
            return True

    def released(self, k: HoldKey, hold: Hold | None, fully: bool) -> None:
        """Record a release; ``fully`` drops the hold (and its renewal) whatever the count."""
        with self._lock:
            if hold is None or self._holds.get(k) is not hold:
                return
            hold.count -= 1
            if fully or hold.count <= 0:
                del self._holds[k]
                self._sched.released()

    def forget(self, k: HoldKey) -> None:
        with self._lock:
            self._holds.pop(k, None)

    def holds_of(self, server: tuple[Any, ...], key: str) -> list[tuple[HoldKey, Hold]]:
        with self._lock:
            return [(k, h) for k, h in self._holds.items() if k[0] == server and k[1] == key]

    def drop_holds(self, holds: list[tuple[HoldKey, Hold]]) -> None:
        """A force-unlock deleted these holds' key: they are lost (their owners are told)."""
        dropped = []
        with self._lock:
            for k, hold in holds:
                if self._holds.get(k) is hold:  # not one acquired after the delete
                    del self._holds[k]
                    self._remember_lost(k, hold, "force_unlocked")
                    dropped.append(hold)
        for hold in dropped:
            self._tell_lost(hold, "force-unlocked", "force_unlocked")

    def _remember_lost(self, k: HoldKey, hold: Hold, reason: str) -> None:
        hold.lost = True
        hold.reason = reason
        if len(self._lost) >= _MAX_LOST:
            self._lost.pop(next(iter(self._lost)))
        self._lost[k] = hold

    def is_lost(self, k: HoldKey) -> bool:
        """Lost, or (watchdog mode) its lease may have run out unrenewed: no renewal has been
        confirmed in time (Redis unreachable, a failover under way). Work that must not
        overlap another holder's stops here; a later confirmed renewal clears it."""
        hold = self._holds.get(k)
        if hold is not None:
            return hold.lost or (hold.renew and time.monotonic() > hold.valid_until)
        return k in self._lost

    def lost_reason(self, k: HoldKey) -> str | None:
        """Why the hold of ``k`` was lost (``windows.REASONS``), while ``is_lost`` remembers
        it; ``"unconfirmed"`` for a hold in doubt; None if it is not lost."""
        hold = self._holds.get(k)
        if hold is not None:
            if hold.lost:
                return hold.reason
            if hold.renew and time.monotonic() > hold.valid_until:
                return "max_hold" if hold.valid_until >= hold.deadline else "unconfirmed"
            return None
        lost = self._lost.get(k)
        return None if lost is None else lost.reason

    def oldest(self) -> dict[str | None, float]:
        """Per label, how long the oldest hold of this process has been held (seconds)."""
        now = time.monotonic()
        out: dict[str | None, float] = {}
        with self._lock:
            for h in self._holds.values():
                age = now - h.since
                if age > out.get(h.label, -1.0):
                    out[h.label] = age
        return out

    def alarm(self, h: Hold, now: float, notes: list[tuple[str, Hold]]) -> bool:
        """(Under the lock, from the sweep.) A window of ``h`` is due: its one warning, or its
        ``max_hold``, which ends it here (never renewed again, told lost). True if ended."""
        if h.warn_at <= now:
            h.warn_at = INF
            notes.append(("held_long", h))
        if h.renew and h.deadline <= now:
            k = (h.server, h.key, h.owner)
            del self._holds[k]
            self._remember_lost(k, h, "max_hold")
            notes.append(("max_hold", h))
            return True
        return False

    def notify(self, notes: list[tuple[str, Hold]]) -> None:
        """(On a pool thread.) What the alarms decided, said outside the lock."""
        windows.notify(notes, self._tell_lost)

    def forget_lost(self, k: HoldKey) -> None:
        self._lost.pop(k, None)

    def holds(self) -> list[Hold]:
        """The holds registered now (a copy; health reads them without the lock held)."""
        with self._lock:
            return list(self._holds.values())

    def lost_count(self) -> int:
        """Lost holds still remembered for ``is_lost()`` (their owners not yet told by a
        release or a new acquire)."""
        return len(self._lost)

    def thread_alive(self) -> bool | None:
        """The renewal thread: None before the first hold started it, else whether it runs."""
        return self._sched.alive()

    def renewing(self) -> int:
        """How many holds are renewed by this process now."""
        return sum(1 for h in list(self._holds.values()) if h.renew)

    # -- the thread -------------------------------------------------------------------
    def _send(self, group: list[Hold], ended: list[Hold], behind: int) -> None:
        """(On a pool thread.) One batch of a server's queue: renew ``group``, release
        ``ended`` (the holds of threads that ended); ``behind`` more wait in the queue."""
        if group:
            self._renew_group(group, behind=behind)
            self._refresh_record(group[0])
        if ended:
            self._release_dead(ended)

    @staticmethod
    def _refresh_record(hold: Hold) -> None:
        """This process's record on the server it renews on, kept while it holds there
        (``records.refresh``: a write every ``REFRESH`` at most; invariant 43)."""
        records.refresh(hold.client, hold.server)

    def _renew_group(self, group: list[Hold], moved: bool = False, behind: int = 0) -> None:
        sent = time.monotonic()
        late = [h for h in group if sent > h.late_at]
        if late:
            self.late.note(len(late), sum(1 for h in late if sent > h.valid_until),
                           min(h.valid_until - sent for h in late), len(self._holds), behind,
                           group[0].server)
        try:
            results, synced = self._renew_on(group[0].client, group)
        except Exception as exc:  # never let the thread die; retry soon, not a period later
            replicas.forget(group[0].server)  # maybe a failover: count the new master's replicas
            if _follow(group, exc) and isinstance(exc, MovedError) and not moved:
                # A slot moved (a resharding): nothing ran; renew where it is now, at once.
                by_node: dict[tuple[Any, ...], list[Hold]] = {}
                for h in group:
                    by_node.setdefault(server_id(h.client), []).append(h)
                for part in by_node.values():
                    self._renew_group(part, moved=True)
                return
            now = time.monotonic()
            # Past its last confirmed lease the key is gone wherever it was (a promoted replica
            # holds no later TTL): lost for good, not worth retrying.
            gone = [h for h in group if now > h.valid_until]
            logger.warning("django-rlock: could not renew %d lock(s) (%s: %s); %s",
                           len(group), type(exc).__name__, exc,
                           "retrying" if len(gone) < len(group) else "their leases are over")
            with self._lock:
                for h in group:  # soon, and well inside every lease (the sweep wakes for it)
                    retry = now + min(1.0, h.period / 4)
                    if retry < h.next_due and self._holds.get((h.server, h.key, h.owner)) is h:
                        self._sched.schedule(h, retry, 0.0)
            for h in gone:
                self._mark_lost(h, "could not be renewed before its lease ran out",
                                "unconfirmed")
            return
        gone = []
        for h, ok in zip(group, results, strict=False):
            if not ok:
                gone.append(h)
            elif synced:  # on a replica too: a failover now keeps at least this lease
                h.valid_until = min(h.deadline, max(h.valid_until, sent + h.lease_ms / 1000.0))
        if gone:
            # The owner's own release may have deleted a key after this renewal was sent, and
            # its thread not have booked the reply yet: lost only if still held after a moment
            # (else every such race is a spurious ``lost``, ``on_lost`` called on an unlock).
            # Waited on a timer, not here: this drain's next pipeline must not wait for it.
            timer = threading.Timer(RELEASE_GRACE, self._mark_gone, (gone,))
            timer.daemon = True
            timer.start()

    def _mark_gone(self, gone: list[Hold]) -> None:
        for h in gone:
            try:
                self._mark_lost(h)
            except Exception:  # an on_lost callback's error is its own; tell the others
                logger.exception("django-rlock: telling lock %r lost failed", h.name)

    def _renew_on(self, client: Any, group: list[Hold]) -> tuple[list[int], bool]:
        """Renew every hold of one server in one pipeline (with WAIT behind, on a master with
        replicas): a batched script per kind. Returns the per-hold results, in ``group``
        order, and whether the renewals reached a replica."""
        calls, order, shapes = renew_calls(group, is_cluster_node(client), time.monotonic())
        replicas_now = _replicas(client, group[0].server)
        # Never wait on replicas longer than a third of the shortest period: the pipeline's
        # RENEW already ran, and the next sweep must not find this server still busy.
        wait_ms = max(1, min(1000, int(min(h.period for h in group) * 1000 / 3)))
        wait = (replicas_now, wait_ms) if replicas_now else None
        replies = self._pipeline(client, calls, wait)
        acked = replies.pop() if wait is not None else None
        out = results(replies, shapes)
        self.renewed += len(out)
        by_hold = {id(h): r for h, r in zip(order, out, strict=False)}
        return [by_hold.get(id(h), 0) for h in group], wait is None or (
            isinstance(acked, int) and acked >= 1)

    def _release_dead(self, holds: list[Hold]) -> None:
        """Release the holds of threads that ended holding them (one pipeline per server)."""
        by_server: dict[tuple[Any, ...], list[Hold]] = {}
        for h in holds:
            by_server.setdefault(server_id(h.client), []).append(h)
        for group in by_server.values():
            try:
                results = self._pipeline(group[0].client, [
                    (h.end_script, h.scripts_keys, h.end_args) for h in group])
            except Exception as exc:  # they expire by their lease: they are no longer renewed
                logger.warning("django-rlock: could not release %d lock(s) of ended threads "
                               "(%s: %s); they expire within their lease", len(group),
                               type(exc).__name__, exc)
                continue
            for h, r in zip(group, results, strict=False):
                thread = h.thread.name if h.thread is not None else "?"
                if not r:
                    continue  # gone meanwhile (expired, force-unlocked)
                logger.warning("django-rlock: lock %r (key %r) was held by thread %r (%s), which "
                               "ended without unlocking it; released", h.name, h.key, thread,
                               h.owner)
                if events.listeners:
                    events.emit("released", name=h.name, key=h.key, label=h.label, owner=h.owner,
                                held=time.monotonic() - h.since, reason="owner ended")

    def _pipeline(self, client: Any,
                  calls: list[tuple[Script, tuple[Any, ...], tuple[Any, ...]]],
                  wait: tuple[int, int] | None = None) -> list[Any]:
        """Run each (script, keys, args) in one pipeline, then ``WAIT`` if given (its reply
        last); loads the scripts after a SCRIPT FLUSH."""
        calls = [(script.on(client), keys, args) for script, keys, args in calls]
        for attempt in (0, 1):
            pipe = client.pipeline(transaction=False)
            for script, keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            if wait is not None:
                pipe.execute_command("WAIT", *wait)
            try:
                return list(pipe.execute())
            except NoScriptError:
                if attempt:
                    raise
                for script in {c[0].sha: c[0] for c in calls}.values():
                    client.script_load(script.source)
            finally:
                self.round_trips += 1
        return []

    def _mark_lost(self, h: Hold, how: str = "expired or was force-unlocked",
                   reason: str = "expired") -> None:
        k = (h.server, h.key, h.owner)
        with self._lock:
            if self._holds.get(k) is not h:
                return  # released (or released and taken again) while the renewal ran
            del self._holds[k]
            self._remember_lost(k, h, reason)
        self._tell_lost(h, how, reason)

    def _tell_lost(self, h: Hold, how: str, reason: str) -> None:
        if reason != "max_hold":  # that one has its own WARNING (``windows.notify``)
            # ``how`` is the event's words ("force-unlocked", "expired or was force-unlocked"):
            # in parentheses, every one of them reads right.
            logger.warning("django-rlock: lock %r (key %r) was lost (%s) while held by %s; it "
                           "is no longer renewed", h.name, h.key, how, h.owner)
        if events.listeners:
            events.emit("lost", name=h.name, key=h.key, label=h.label, owner=h.owner,
                        held=time.monotonic() - h.since, how=how, reason=reason)
        if h.on_lost is not None:
            windows.call_on_lost(h.on_lost, h.name, reason)


def _replicas(client: Any, server: Any) -> int:
    """Replicas a renewal should reach (0: none, or replica sync unavailable)."""
    try:
        return replicas.connected(client, server) or 0
    except Exception:  # the renewal itself reports a dead server
        return 0


#: The registry of this process (a new one in a forked child: the parent's renewal thread does
#: not exist there, and its holds are not the child's).
watchdog: Callable[[], Watchdog] = process.local(Watchdog)

__all__ = ["Hold", "HoldKey", "HoldKind", "LostCallback", "Watchdog", "server_id", "watchdog"]
