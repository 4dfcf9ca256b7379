"""The index sweep: the entries of locks that ended without a release leave the index within
a bounded time, whether anybody lists locks or not (invariant 11).

A lock whose lease ran out, or whose holder was SIGKILLed, keeps its index entry (~100 bytes)
until a listing reads it as gone and prunes it; a process that only locks never lists, so the
entries would pile up without bound. Each process therefore sweeps, from the watchdog's one
thread (``renewal.Scheduler.idle``; never a thread of its own), the indexes of the servers and
prefixes it has acquired on (``note``, from every acquire the watchdog books), and only those:
a process that never locked sweeps nothing; one that only takes leases (nothing renewed) still
sweeps, since its expired leases are exactly the entries left behind.

A round, per (server, prefix), at most once a ``PERIOD`` (``HURRY`` after a round that
pruned something, while a backlog lasts), on a pool thread, one round at a time:

- one server: one ``HSCAN`` page of the prefix's index (``COUNT``) from the cursor kept since
  the last round; ``EXISTS`` of the page's lock keys, pipelined; ``PRUNE_INDEX_SCRIPT`` for
  those gone, which checks ``EXISTS`` again inside the script, so a lock taken again since the
  page was read keeps its entry;
- a cluster node (an index per lock, in its slot: ``naming.index_key``): one ``SCAN`` page of
  that node's index hashes under the prefix, their fields (``HKEYS``), ``EXISTS``, and a
  prune per lock gone, each step one pipeline.

So a round costs about ``COUNT + 2`` commands and three or four round trips whatever the size
of the index, and an index of N entries is walked in N / ``COUNT`` rounds. Errors (a server
down, a read-only replica after a failover, a redirection) end the round, are logged as a
WARNING at most once per ``LOG_EVERY`` and never touch a renewal: the round runs on a pool
thread, outside the watchdog's lock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import NoScriptError

from .clients import is_cluster_node
from .naming import INDEX_PREFIX, glob_escape, index_key
from .scripts import PRUNE_INDEX_SCRIPT

logger = logging.getLogger("django_rlock")

#: Seconds between two rounds on one (server, prefix): the renewal period of the default
#: ``watchdog_timeout`` (30 s / 3), so a process with watchdog holds wakes about as often as it
#: does already, and an idle one costs one small round per 10 s per server.
PERIOD = 10.0
#: Seconds to the next round after one that pruned entries: a backlog (a crash of a process
#: holding thousands of locks) drains at ``COUNT`` entries a second, not per ``PERIOD``.
HURRY = 1.0
#: COUNT of the HSCAN / SCAN page: index entries (cluster: keys) visited per round. A small
#: hash (listpack encoded, at most ``hash-max-listpack-entries``, 128 by default) comes whole.
COUNT = 100
#: (server, prefix) pairs swept per process at most; more prefixes than that are not swept.
MAX_TARGETS = 256
#: Seconds between two WARNINGs about failed rounds (the others go to DEBUG).
LOG_EVERY = 600.0

#: One server's (or cluster node's) index, as a round reads it: a (server, prefix) pair.
Target = tuple[Any, str]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def page(client: Any, prefix: str, cursor: int) -> tuple[int, list[tuple[str, Any]]]:
    """One page of ``prefix``'s index on ``client``'s server from ``cursor``: the next cursor
    (0: the walk is over and starts again) and the (index, lock key) pairs whose key was read
    as gone. Read-only: nothing is pruned yet (``prune`` re-checks)."""
    if is_cluster_node(client):
        head = f"{INDEX_PREFIX}:{prefix}"
        cursor, found = client.scan(cursor, match=glob_escape(head) + "*", count=COUNT,
                                    _type="hash")
        if not found:
            return int(cursor), []
        pipe = client.pipeline(transaction=False)
        for idx in found:
            pipe.hkeys(idx)
        pairs = [(_text(idx), f) for idx, fields in zip(found, pipe.execute(), strict=True)
                 for f in fields if index_key(prefix, _text(f)) == _text(idx)]
    else:
        idx = index_key(prefix)
        cursor, entries = client.hscan(idx, cursor, count=COUNT)
        pairs = [(idx, f) for f in entries]
    if not pairs:
        return int(cursor), []
    pipe = client.pipeline(transaction=False)
    for _, key in pairs:
        pipe.exists(key)
    return int(cursor), [p for p, n in zip(pairs, pipe.execute(), strict=True) if not n]


def prune(client: Any, gone: list[tuple[str, Any]]) -> int:
    """Drop the entries of ``gone`` (from ``page``) whose key still does not exist: one script
    per index (one for a server's index; one per lock on a cluster node), in one pipeline.
    Returns how many were dropped."""
    by_index: dict[str, list[Any]] = {}
    for idx, key in gone:
        by_index.setdefault(idx, []).append(key)
    if not by_index:
        return 0
    script = PRUNE_INDEX_SCRIPT.on(client)
    for attempt in (0, 1):
        pipe = client.pipeline(transaction=False)
        for idx, keys in by_index.items():
            pipe.evalsha(script.sha, 1 + len(keys), idx, *keys)
        try:
            return sum(int(n) for n in pipe.execute())
        except NoScriptError:
            if attempt:
                raise
            client.script_load(script.source)
    return 0


class _Target:
    __slots__ = ("client", "prefix", "cursor", "due")

    def __init__(self, client: Any, prefix: str, due: float) -> None:
        self.client = client
        self.prefix = prefix
        self.cursor = 0
        self.due = due


class Sweeper:
    """The (server, prefix) pairs this process acquired on, and when each is next swept.

    ``cond`` is the watchdog's lock: ``note`` and ``tick`` run under it; a round runs outside
    it, on a pool thread, and books its result under it again."""

    def __init__(self, cond: Any) -> None:
        self._cond = cond
        self._targets: dict[Target, _Target] = {}
        self._next = math.inf  # the earliest due time (inf: nothing to sweep)
        self._busy = False  # a round is under way (one at a time, whatever the servers)
        self._logged = -math.inf
        #: Rounds run and entries pruned since start (read by tests and the benchmark).
        self.rounds = 0
        self.pruned = 0

    def note(self, client: Any, server: Any, prefix: str) -> None:
        """(Under the lock; every acquire the watchdog books: one dict lookup.) Sweep this
        server's index of ``prefix`` from now on, a ``PERIOD`` from now first."""
        t = (server, prefix)
        if t in self._targets or len(self._targets) >= MAX_TARGETS:
            return
        due = time.monotonic() + PERIOD
        self._targets[t] = _Target(client, prefix, due)
        if due < self._next:
            self._next = due
            self._cond.notify()  # the sleeping thread wakes for it

    def targets(self) -> list[Target]:
        with self._cond:
            return list(self._targets)

    def forget(self) -> None:
        """Sweep nothing until the next acquire (a test suite's emptied server: its command
        counts must not catch a round left over from an earlier test)."""
        with self._cond:
            self._targets.clear()
            self._next = math.inf

    def tick(self, now: float, submit: Callable[[Callable[[], None]], None]) -> float:
        """(Under the lock, from the watchdog's thread when nothing is due.) Start a round on
        the pairs due; returns when to be called again (inf: a round's end wakes the thread)."""
        if self._busy or now < self._next:
            return math.inf if self._busy else self._next
        due = [t for t in self._targets.values() if t.due <= now]
        if not due:
            self._next = min((t.due for t in self._targets.values()), default=math.inf)
            return self._next
        self._busy = True
        submit(lambda: self._run(due))
        return math.inf

    def _run(self, due: list[_Target]) -> None:
        """(On a pool thread.) One round on each pair due; never raises."""
        done: list[tuple[_Target, int, float]] = []
        try:
            for t in due:
                try:
                    cursor, gone = page(t.client, t.prefix, t.cursor)
                    n = prune(t.client, gone) if gone else 0
                except Exception as exc:
                    self._failed(t, exc)
                    done.append((t, t.cursor, PERIOD))
                else:
                    self.pruned += n
                    done.append((t, cursor, HURRY if n else PERIOD))
        finally:
            now = time.monotonic()
            with self._cond:
                self.rounds += 1
                for t, cursor, wait in done:
                    t.cursor = cursor
                    t.due = now + wait
                for t in due:  # an error raised past the loop: try again a period later
                    t.due = max(t.due, now + HURRY)
                self._next = min((t.due for t in self._targets.values()), default=math.inf)
                self._busy = False
                self._cond.notify()

    def _failed(self, t: _Target, exc: Exception) -> None:
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._logged >= LOG_EVERY:
            self._logged = now
            level = logging.WARNING
        logger.log(level, "django-rlock: the index sweep of prefix %r failed (%s: %s); it "
                   "tries again in %.0f s (at most one such warning per %.0f s)", t.prefix,
                   type(exc).__name__, exc, PERIOD, LOG_EVERY)


__all__ = ["COUNT", "HURRY", "LOG_EVERY", "MAX_TARGETS", "PERIOD", "Sweeper", "page", "prune"]
