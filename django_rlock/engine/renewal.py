"""The watchdog's schedule: holds by due time, each server's queue of holds to renew, the
scripts a batch sends; the warning that renewals run late is ``lateness``'s (``Lateness``,
named here for the watchdog), fed the sweep's own late wake-ups.

``Timeline``: holds in buckets of ``GRAIN`` s (a renewal at most that much early) under a
heap of bucket times; scheduling is a dict lookup and an append, a sweep pops whole buckets,
and neither looks at holds not due. Entries stay when a hold is released or rescheduled
(skipped then; rebuilt once stale ones outnumber the holds). ``Queues``: per server, the
holds taken off the timeline and not sent yet, in due order, sent in bounded pipelines.
This module imports nothing of the watchdog's: the watchdog decides what an entry means.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.crc import key_slot

from .lateness import Lateness, stalls
from .lua import Script, source
from .scripts import RENEW_SCRIPT

logger = logging.getLogger("django_rlock")

#: Keys per RENEW script. A script blocks Redis while it runs; 250 keys take well under 1 ms.
RENEW_BATCH = 250

#: The RLock holds' batched renewal (``renew_calls``); its own script, so that ``renew.lua``
#: keeps the one-hold-at-a-time layout the lock's own top-ups send.
RENEW_MANY_SCRIPT = Script(source("renew_many"))

#: Holds per renewal pipeline (a server's queue goes out in pipelines of at most this many,
#: one after the other): a due hold waits behind one such pipeline at most, never behind
#: the whole backlog of a server.
PIPELINE_HOLDS = 1000

#: Holds the sweep takes off the timeline per hold of the watchdog's lock (acquires run
#: between two takes).
TAKE_LIMIT = 1000

#: Due times are rounded down to this (seconds): holds due within one grain share a bucket.
GRAIN = 0.01


class _Bucket:
    __slots__ = ("items", "slack")

    def __init__(self, slack: float) -> None:
        self.items: list[Any] = []
        self.slack = slack  # the least slack of its items: how early it may be taken


class Timeline:
    """Items by due time. Not thread-safe: the watchdog calls it under its lock."""

    def __init__(self) -> None:
        self._buckets: dict[float, _Bucket] = {}
        self._times: list[float] = []  # a heap of the bucket times
        #: Entries held, stale ones included.
        self.entries = 0

    def add(self, item: Any, due: float, slack: float) -> float:
        """Schedule ``item`` at ``due`` (it may be taken up to ``slack`` s before); returns the
        bucket time it went to, the item's due time from now on."""
        t = math.floor(due / GRAIN) * GRAIN
        b = self._buckets.get(t)
        if b is None:
            b = self._buckets[t] = _Bucket(slack)
            heapq.heappush(self._times, t)
        elif slack < b.slack:
            b.slack = slack
        b.items.append(item)
        self.entries += 1
        return t

    def add_many(self, items: list[Any], due: float, slack: float) -> None:
        """``add`` for items due together (a sweep's renewals); sets each item's ``due``."""
        t = math.floor(due / GRAIN) * GRAIN
        b = self._buckets.get(t)
        if b is None:
            b = self._buckets[t] = _Bucket(slack)
            heapq.heappush(self._times, t)
        elif slack < b.slack:
            b.slack = slack
        b.items.extend(items)
        self.entries += len(items)
        for item in items:
            item.due = t

    def next_at(self) -> float:
        """The earliest bucket time (inf: nothing scheduled)."""
        return self._times[0] if self._times else math.inf

    def pop(self, now: float, limit: int) -> tuple[float, list[Any]] | None:
        """Up to ``limit`` entries of the earliest bucket, if it is due or within its slack
        of due at ``now``; None otherwise. A later bucket within its own slack waits for
        this one (at the latest for its own due time)."""
        if not self._times:
            return None
        t = self._times[0]
        b = self._buckets[t]
        if t - b.slack > now:
            return None
        if len(b.items) <= limit:
            heapq.heappop(self._times)
            del self._buckets[t]
            self.entries -= len(b.items)
            return t, b.items
        part = b.items[-limit:]
        del b.items[-limit:]
        self.entries -= len(part)
        return t, part

    def stale(self, live: int) -> bool:
        """Whether entries of released or rescheduled items outnumber the live ones enough
        to be worth a rebuild (linear in the live ones, so amortised over the stale)."""
        return self.entries > 2 * live + 10_000


class Queues:
    """Per server, the holds to send, in the order they fell due; and which servers have a
    drain under way. Not thread-safe: the watchdog calls it under its lock."""

    def __init__(self) -> None:
        self._queues: dict[Any, deque[Any]] = {}
        self._draining: set[Any] = set()

    def put(self, server: Any, item: Any) -> bool:
        """Queue ``item``; True if ``server`` has no drain under way (the caller starts one)."""
        q = self._queues.get(server)
        if q is None:
            q = self._queues[server] = deque()
        q.append(item)
        if server in self._draining:
            return False
        self._draining.add(server)
        return True

    def take(self, server: Any, limit: int) -> tuple[list[Any], int]:
        """The next (at most ``limit``) items of ``server`` and how many stay queued behind
        them; none: the drain is over (the next ``put`` starts another)."""
        q = self._queues.get(server)
        if not q:
            self._queues.pop(server, None)
            self._draining.discard(server)
            return [], 0
        return [q.popleft() for _ in range(min(len(q), limit))], len(q)

    def abandon(self, server: Any) -> None:
        """A drain ended abnormally: the next ``put`` starts another."""
        self._draining.discard(server)


def renew_calls(group: list[Any], per_slot: bool, now: float
                ) -> tuple[list[Any], list[Any], list[int]]:
    """The (script, keys, args) calls that renew ``group``: batches of ``RENEW_BATCH`` holds
    per renew script (per script and slot on a cluster node, ``per_slot``: a script's keys
    must share a slot), each key with its owner and lease (a watchdog-mode hold's full lease;
    a lease hold's top-up, the rest of its own lease from ``now``). An RLock's holds go to
    ``renew_many.lua``, ordered so that holds of one owner and lease are adjacent and both go
    once per run of them (a process's holds mostly share a few owners and one lease); other
    kinds' scripts take an owner and a lease per key. Returns the calls, the holds in reply
    order, and per call its keys (``renew_many``: the reply lists the lost) or 0 (1/0 per key)."""
    by_script: dict[Any, list[Any]] = {}
    for h in group:
        sha = h.renew_script.sha
        batch = (sha, key_slot(h.renew_key.encode() if isinstance(h.renew_key, str)
                               else h.renew_key)) if per_slot else sha
        by_script.setdefault(batch, []).append(h)
    calls = []
    order: list[Any] = []
    shapes: list[int] = []
    for holds in by_script.values():
        many = holds[0].renew_script is RENEW_SCRIPT
        leases = []
        for h in holds:
            # Never past the hold's max_hold, even for a renewal already in flight: the
            # lease is cut at the send (``Hold.cap``), so none outlives the window.
            leases.append(h.cap(int(h.period * 3000)
                                or max(1, int((h.expires_at - now) * 1000)), now))
            h.top_up_ms = 0
        if many:
            runs: dict[tuple[Any, int], list[Any]] = {}
            for h, ms in zip(holds, leases, strict=True):
                same = runs.get((h.owner, ms))
                if same is None:
                    runs[(h.owner, ms)] = [h]
                else:
                    same.append(h)
            holds, leases = [], []
            for (_, ms), same in runs.items():
                holds.extend(same)
                leases.extend([ms] * len(same))
        for i in range(0, len(holds), RENEW_BATCH):
            chunk = holds[i:i + RENEW_BATCH]
            args: list[Any] = []
            if many:
                j, end = i, i + len(chunk)
                while j < end:  # runs of one owner and lease: (owner, lease, count)
                    owner, ms, k = holds[j].owner, leases[j], j + 1
                    while k < end and leases[k] == ms and holds[k].owner == owner:
                        k += 1
                    args += (owner, ms, k - j)
                    j = k
                calls.append((RENEW_MANY_SCRIPT, tuple(h.renew_key for h in chunk),
                              tuple(args)))
                shapes.append(len(chunk))
            else:
                for h, ms in zip(chunk, leases[i:i + RENEW_BATCH], strict=True):
                    args += (h.owner, ms)
                calls.append((chunk[0].renew_script, tuple(h.renew_key for h in chunk),
                              tuple(args)))
                shapes.append(0)
            order.extend(chunk)
    return calls, order, shapes


def results(replies: list[Any], shapes: list[int]) -> list[int]:
    """Per hold in ``renew_calls``' order, 1 renewed or 0 lost, from the calls' replies."""
    out: list[int] = []
    for reply, n in zip(replies, shapes, strict=True):
        if n:
            got = [1] * n
            for pos in reply:
                got[int(pos) - 1] = 0
            out.extend(got)
        else:
            out.extend(int(x) for x in reply)
    return out


def run_on(pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> None:
    """``fn`` on ``pool``, or at interpreter shutdown (``concurrent.futures`` takes no more
    work, and non-daemon threads may still hold locks) on a thread of its own."""
    try:
        pool.submit(fn, *args)
    except RuntimeError:
        threading.Thread(target=fn, args=args, name="django-rlock-renew", daemon=True).start()


class Scheduler:
    """The sweep thread, the holds' due times, and each server's queue and drain.

    ``cond``, the watchdog's lock, guards ``holds`` (its registry) and everything here;
    ``send(group, ended, behind)`` renews ``group`` and releases ``ended`` on a pool thread,
    ``behind`` more queued; ``route(client)`` names a hold's server (one queue per server).
    Items are the watchdog's holds (keyed ``(server, key, owner)``; ``due``, ``slack``,
    ``period``, ``renew``, ``thread``, ``top_up_ms``, ``expires_at``, ``valid_until``,
    ``late_at``, ``queued``, ``ending``, ``client``; windows' ``warn_at``, ``deadline``,
    ``next_due``, ``next_slack``). ``alarm(hold, now, notes)`` (under the lock) acts on a
    due window, True if it ended the hold; ``notify(notes)`` tells, on a pool thread."""

    def __init__(self, cond: threading.Condition, holds: dict[Any, Any],
                 send: Callable[[list[Any], list[Any], int], None],
                 route: Callable[[Any], Any],
                 alarm: Callable[[Any, float, list[Any]], bool],
                 notify: Callable[[list[Any]], None]) -> None:
        self._cond = cond
        self._holds = holds
        self._send = send
        self._route = route
        self._alarm = alarm
        self._notify = notify
        self._timeline = Timeline()  # every hold's next due time (renewal, top-up, forgetting)
        self._queues = Queues()
        self._pool: ThreadPoolExecutor | None = None  # drains each server on its own thread
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf  # when the sleeping sweep wakes (0: it is not asleep)
        self.stopped = False
        #: Side work when nothing is due (the index sweep, ``sweep.Sweeper.tick``): called under
        #: the lock as ``idle(now, submit)``, it hands its work to ``submit`` (a pool thread) and
        #: returns when it wants to be called again (inf: never, unless woken).
        self.idle: Callable[[float, Callable[[Callable[[], None]], None]], float] | None = None

    def schedule(self, hold: Any, due: float, slack: float) -> None:
        """(Under the lock.) ``hold`` is next due at ``due``; the sweep wakes for it if it
        sleeps past that. A window of it due sooner (``alarm_at``) takes the entry's place."""
        hold.next_due = due
        hold.next_slack = slack
        alarm = hold.alarm_at() + GRAIN  # a bucket never taken before the alarm is due
        if alarm < due:
            hold.due = self._timeline.add(hold, alarm, 0.0)
        else:
            hold.due = self._timeline.add(hold, due, slack)
        if hold.due < self._wake_at:
            self._cond.notify()

    def start(self) -> None:
        """(Under the lock.) Start the sweep thread, once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="django-rlock-watchdog",
                                            daemon=True)
            self._thread.start()

    def alive(self) -> bool | None:
        """The sweep thread: None before the first hold started it, else whether it runs."""
        return None if self._thread is None else self._thread.is_alive()

    def released(self) -> None:
        """(Under the lock.) A hold was dropped: its entries are stale."""
        if self._wake_at and self._timeline.stale(len(self._holds)):
            self._cond.notify()  # the sleeping sweep drops them

    def _run(self) -> None:
        while True:
            with self._cond:
                if self.stopped:
                    return
                if self._timeline.stale(len(self._holds)):
                    self._rebuild()
                now = time.monotonic()
                notes: list[Any] = []
                start, more = self._take(now, notes)
                if notes or start and self._pool is None:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(max_workers=8,
                                                        thread_name_prefix="django-rlock-renew")
                    if notes:
                        run_on(self._pool, self._notify, notes)
                if not start and not more:
                    next_at = self._timeline.next_at()
                    if self.idle is not None:
                        next_at = min(next_at, self.idle(now, self._submit))
                    self._wake_at = next_at
                    self._cond.wait(None if next_at == float("inf") else max(0.0, next_at - now))
                    self._wake_at = 0.0
                    stalls.woke(max(next_at, now), time.monotonic())  # late: it did not run
                    continue
            for server in start:
                run_on(self._pool, self._drain, server)  # type: ignore[arg-type]
            if more:
                time.sleep(0)  # let the acquires waiting on the lock in before the next take

    def _submit(self, fn: Callable[[], None]) -> None:
        """(Under the lock.) ``fn`` on the pool, made on first use."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="django-rlock-renew")
        run_on(self._pool, fn)

    def _take(self, now: float, notes: list[Any]) -> tuple[list[tuple[Any, ...]], bool]:
        """(Under the lock.) Take up to ``TAKE_LIMIT`` due holds off the timeline: queue each
        for its server (a renewal, a top-up, the release of an ended thread's hold) and
        schedule its next due time; forget the lease holds whose lease is over; act on the
        windows due (``alarm``, what it decided into ``notes``). Returns the servers whose
        drain must start, and whether more may be due."""
        start: list[Any] = []
        holds = self._holds
        routes: dict[int, Any] = {}  # per client (a take's holds mostly share a few)
        alive: dict[int, bool] = {}  # per owner thread
        renewed: dict[float, list[Any]] = {}  # per period: due again at now + period
        taken = 0
        more = True
        while taken < TAKE_LIMIT:
            got = self._timeline.pop(now, TAKE_LIMIT - taken)
            if got is None:
                more = False
                break
            t, entries = got
            taken += len(entries)
            for h in entries:
                k = (h.server, h.key, h.owner)
                if h.due != t or holds.get(k) is not h:
                    continue  # released, or rescheduled since this entry was made
                h.due = -1.0  # taken: a second entry of it is stale from now on
                # A window (inf for most holds: one comparison) may be what is due, not the
                # hold itself: then it goes back on the timeline at its own due time.
                if h.warn_at <= now or h.renew and h.deadline <= now:
                    if self._alarm(h, now, notes):
                        continue
                    if h.next_due - h.next_slack > now:
                        self.schedule(h, h.next_due, h.next_slack)
                        continue
                if h.renew:
                    th = h.thread
                    if th is not None:
                        ok = alive.get(id(th))
                        if ok is None:
                            ok = alive[id(th)] = th.is_alive()
                        if not ok:
                            del holds[k]  # released in its server's next pipeline
                            h.ending = True
                            self._enqueue(h, start, routes)
                            continue
                    if h.valid_until >= h.deadline:
                        # Its lease already ends at its max_hold: nothing left to renew (a
                        # renewal now could only find it gone); its alarm ends it there.
                        self.schedule(h, h.deadline + h.period, 0.0)
                        continue
                    h.late_at = h.valid_until - h.slack
                    h.slack = h.period / 2
                    same = renewed.get(h.period)
                    if same is None:
                        renewed[h.period] = [h]
                    else:
                        same.append(h)
                    self._enqueue(h, start, routes)
                elif h.top_up_ms:
                    # Granted with a short lease: its own lease from then on, once (a little
                    # longer than asked, by the grant's delivery time).
                    h.late_at = h.valid_until - h.slack
                    self.schedule(h, h.expires_at + 1.0, 0.0)
                    self._enqueue(h, start, routes)
                elif now >= h.expires_at:
                    del holds[k]  # a lease hold that has expired: forget it
                else:
                    self.schedule(h, h.expires_at + 1.0, 0.0)
        for period, same in renewed.items():
            soon, slack = now + period, period / 2
            together = []
            for h in same:
                if h.warn_at < soon or h.deadline < soon:
                    self.schedule(h, soon, slack)  # a window first: an entry of its own
                else:
                    h.next_due, h.next_slack = soon, slack
                    together.append(h)
            self._timeline.add_many(together, soon, slack)
        return start, more

    def _enqueue(self, h: Any, start: list[Any], routes: dict[int, Any]) -> None:
        """(Under the lock.) Queue ``h`` for the server it goes to now (on a cluster: its
        slot's master), in due order; a hold still queued from its last due time keeps its
        place."""
        if h.queued:
            return
        h.queued = True
        server = routes.get(id(h.client))
        if server is None:
            server = routes[id(h.client)] = self._route(h.client)
        if self._queues.put(server, h):
            start.append(server)

    def _rebuild(self) -> None:
        """(Under the lock.) A timeline of the registered holds alone, at their due times."""
        self._timeline = Timeline()
        for h in self._holds.values():
            self.schedule(h, h.next_due, h.next_slack)

    def _drain(self, server: tuple[Any, ...]) -> None:
        """Send ``server``'s queue in pipelines of at most ``PIPELINE_HOLDS`` holds until it is
        empty (on a pool thread: a server that is down, its connect retries and timeouts
        seconds long, never delays the others). Holds that fall due meanwhile queue behind and
        go out in the next pipeline, in due order: a busy server never postpones them."""
        done = False
        try:
            while True:
                with self._cond:
                    batch, behind = self._queues.take(server, PIPELINE_HOLDS)
                    if not batch:
                        done = True
                        return
                    group: list[Any] = []
                    dead: list[Any] = []
                    for h in batch:
                        h.queued = False
                        if h.ending:
                            dead.append(h)
                        elif (h.renew or h.top_up_ms) and self._holds.get(
                                (h.server, h.key, h.owner)) is h:
                            group.append(h)
                try:
                    self._send(group, dead, behind)
                except Exception:  # never leave the server marked as draining
                    logger.exception("django-rlock: renewal of %d lock(s) failed", len(group))
        finally:
            if not done:
                with self._cond:
                    self._queues.abandon(server)


__all__ = ["GRAIN", "PIPELINE_HOLDS", "RENEW_BATCH", "RENEW_MANY_SCRIPT", "TAKE_LIMIT", "Lateness",
           "Queues", "Scheduler", "Timeline", "renew_calls", "results", "run_on"]
