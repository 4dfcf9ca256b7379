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
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import AskError, MovedError, NoScriptError

from . import events, process, replicas
from .clients import cluster_of, is_cluster_node, node_client, refresh
from .renewal import Lateness, Scheduler, renew_calls
from .scripts import FORCE_UNLOCK_OWNER_SCRIPT, RENEW_SCRIPT, Script

logger = logging.getLogger("django_rlock")

#: Lost holds remembered for ``is_lost()`` until the owner acquires or releases again.
_MAX_LOST = 10_000

LostCallback = Callable[[str], Any]

_server_ids: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def server_id(client: Any) -> tuple[Any, ...]:
    """Identify the Redis database behind a client, so clients sharing one agree on holds.

    Django's built-in RedisCache hands out a new client (and per-thread pools) per call; a
    lock taken through one must be released and renewed through another.
    """
    pool = client.connection_pool
    try:
        return _server_ids[pool]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        return ("pool", id(pool))
    kw = getattr(pool, "connection_kwargs", {})
    ident: tuple[Any, ...] = (
        type(pool).__name__,
        getattr(pool, "service_name", None),
        kw.get("host"),
        kw.get("port"),
        kw.get("path"),
        kw.get("db", 0),
        kw.get("username"),
    )
    _server_ids[pool] = ident
    return ident


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


class Hold:
    """One key held by one owner of this process."""

    __slots__ = ("client", "server", "key", "name", "owner", "count", "lease_ms", "renew",
                 "period", "due", "lost", "on_lost", "expires_at", "thread", "since", "label",
                 "scripts_keys", "valid_until", "renew_script", "renew_key", "end_script",
                 "end_args", "top_up_ms", "slack", "queued", "ending", "late_at")

    def __init__(self, client: Any, server: tuple[Any, ...], key: str, name: str, owner: str) -> None:
        self.client = client
        self.server = server
        self.key = key
        self.name = name
        self.owner = owner
        self.count = 0
        self.lease_ms = 0
        self.renew = False          # watchdog mode: renewed until released
        self.period = 0.0
        self.due = 0.0              # monotonic time of the next renewal (or of forgetting a lease hold)
        self.lost = False
        self.on_lost: LostCallback | None = None
        self.expires_at = 0.0       # lease mode: when the lease we set runs out
        self.thread: threading.Thread | None = None  # the owner thread (None: a task, a mark)
        self.since = time.monotonic()
        self.label: str | None = None
        self.scripts_keys: tuple[Any, ...] = ()  # (key, channel, index) for a release on its behalf
        self.valid_until = 0.0      # monotonic end of the last lease confirmed (acquire, renewal)
        # How a kind renews and ends its holds: the script run per hold (KEYS[i] renew_key,
        # ARGV owner and lease ms), and the one that releases a hold whose owner ended
        # (KEYS scripts_keys, ARGV end_args). The lock's own by default.
        self.renew_script: Script = RENEW_SCRIPT
        self.renew_key = key
        self.end_script: Script = FORCE_UNLOCK_OWNER_SCRIPT
        self.end_args: tuple[Any, ...] = (owner, "0")
        #: A lease hold granted with a shorter lease than its own: the lease (ms) its one
        #: early renewal sets, once due (0: none pending, or sent).
        self.top_up_ms = 0
        #: How early (s) a sweep may renew it, to batch it with others: half a period,
        #: except for a first renewal brought forward by a short grant lease.
        self.slack = 0.0
        self.queued = False         # in its server's renewal queue
        self.ending = False         # its owner thread ended: queued to be released
        #: Sent after this (monotonic), a renewal is late: less than a sixth of the lease in
        #: force is left (set when the sweep takes it).
        self.late_at = float("inf")


HoldKey = tuple[tuple[Any, ...], str, str]


class HoldKind:
    """How holds of one lock kind are renewed and, when their owner ends, released.

    ``renew_script`` runs batched like RENEW: KEYS are the holds' ``renew_key``, ARGV one
    (owner, lease ms) pair per key, reply one 1/0 per key. ``end_script`` runs with the
    hold's ``scripts_keys`` and ``end_args`` and replies 1 if it released something.
    """

    __slots__ = ("renew_script", "renew_key", "end_script", "end_args")

    def __init__(self, renew_script: Script, renew_key: str, end_script: Script,
                 end_args: tuple[Any, ...]) -> None:
        self.renew_script = renew_script
        self.renew_key = renew_key
        self.end_script = end_script
        self.end_args = end_args


class Watchdog:
    """The per-process registry of holds and its renewal thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._holds: dict[HoldKey, Hold] = {}
        self._lost: dict[HoldKey, Hold] = {}
        #: The sweep thread, the holds' due times and each server's queue and drain.
        self._sched = Scheduler(self._wakeup, self._holds, self._send, server_id)
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
                 grant_ms: int | None = None, since: float | None = None) -> Hold:
        """Record a successful acquire, before the result is handed back to the caller.

        ``thread``: the owner thread, watched so its hold is released if it ends holding.
        ``kind``: how a lock kind other than RLock renews and ends its holds.
        ``grant_ms``: a release of another owner granted it with this (short) lease: the first
        renewal comes early (halfway through it), before a crashed heir could cost more.
        ``since``: the earliest moment the lease Redis set can have started (the send time of
        the round trip that set it; for a grant, the start of the wait it ends). Leases are
        counted from there, never from when the reply was read: a process frozen between the
        two must not believe in time it does not have (invariant 31).
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
                self._holds[k] = hold
                self._lost.pop(k, None)
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
                hold.expires_at = (now if grant_ms is not None else base) + lease_ms / 1000.0
                due = hold.expires_at + 1.0
            if grant_ms is not None and grant_ms < hold.lease_ms and hold.count == 1:
                # Renewed between a third and a half of the way through the grant lease: never
                # at once (a short hold is released long before, and costs nothing more).
                if not hold.renew:
                    hold.top_up_ms = 1  # the rest of its own lease, worked out when due
                due = base + grant_ms / 2000.0
                slack = hold.slack = grant_ms / 6000.0
                hold.valid_until = base + grant_ms / 1000.0
            else:
                hold.valid_until = max(hold.valid_until, base + hold.lease_ms / 1000.0)
            if due is not None:
                self._sched.schedule(hold, due, slack)
            self._sched.start()
            return hold

    def confirmed(self, k: HoldKey, hold: Hold, sent: float, lease_ms: int) -> None:
        """A round trip sent at ``sent`` found ``hold`` still ours and set ``lease_ms`` on it
        (a grant checked before its wait returned): its lease counts from there."""
        with self._lock:
            if self._holds.get(k) is not hold:
                return
            hold.top_up_ms = 0
            hold.valid_until = max(hold.valid_until, sent + lease_ms / 1000.0)
            if hold.renew:
                hold.slack = hold.period / 2
                if sent + hold.period > hold.due:
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
                    self._remember_lost(k, hold)
                    dropped.append(hold)
        for hold in dropped:
            self._tell_lost(hold, "force-unlocked")

    def _remember_lost(self, k: HoldKey, hold: Hold) -> None:
        hold.lost = True
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
        if ended:
            self._release_dead(ended)

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
                    if retry < h.due and self._holds.get((h.server, h.key, h.owner)) is h:
                        self._sched.schedule(h, retry, 0.0)
            for h in gone:
                self._mark_lost(h, "could not be renewed before its lease ran out")
            return
        for h, ok in zip(group, results, strict=False):
            if not ok:
                self._mark_lost(h)
            elif synced:  # on a replica too: a failover now keeps at least this lease
                h.valid_until = max(h.valid_until, sent + h.lease_ms / 1000.0)

    def _renew_on(self, client: Any, group: list[Hold]) -> tuple[list[int], bool]:
        """Renew every hold of one server in one pipeline (with WAIT behind, on a master with
        replicas): a batched script per kind. Returns the per-hold results, in ``group``
        order, and whether the renewals reached a replica."""
        calls, order = renew_calls(group, is_cluster_node(client), time.monotonic())
        replicas_now = _replicas(client, group[0].server)
        # Never wait on replicas longer than a third of the shortest period: the pipeline's
        # RENEW already ran, and the next sweep must not find this server still busy.
        wait_ms = max(1, min(1000, int(min(h.period for h in group) * 1000 / 3)))
        wait = (replicas_now, wait_ms) if replicas_now else None
        out: list[int] = []
        replies = self._pipeline(client, calls, wait)
        acked = replies.pop() if wait is not None else None
        for reply in replies:
            out.extend(int(x) for x in reply)
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

    def _mark_lost(self, h: Hold, how: str = "expired or was force-unlocked") -> None:
        k = (h.server, h.key, h.owner)
        with self._lock:
            if self._holds.get(k) is not h:
                return  # released (or released and taken again) while the renewal ran
            del self._holds[k]
            self._remember_lost(k, h)
        self._tell_lost(h, how)

    def _tell_lost(self, h: Hold, how: str) -> None:
        logger.warning("django-rlock: lock %r (key %r) was lost: it %s while held by %s; it is "
                       "no longer renewed", h.name, h.key, how, h.owner)
        if events.listeners:
            events.emit("lost", name=h.name, key=h.key, label=h.label, owner=h.owner,
                        held=time.monotonic() - h.since, how=how)
        if h.on_lost is not None:
            try:
                h.on_lost(h.name)
            except Exception:
                logger.exception("django-rlock: on_lost callback for lock %r failed", h.name)


def _replicas(client: Any, server: Any) -> int:
    """Replicas a renewal should reach (0: none, or replica sync unavailable)."""
    try:
        return replicas.connected(client, server) or 0
    except Exception:  # the renewal itself reports a dead server
        return 0


#: The registry of this process (a new one in a forked child: the parent's renewal thread does
#: not exist there, and its holds are not the child's).
watchdog: Callable[[], Watchdog] = process.local(Watchdog)
