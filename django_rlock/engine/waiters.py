"""Who waits for a lock, semaphore, latch, leadership or limiter, and since when (invariant 41).

Each waiter has a record in a hash beside the key, in its slot: ``token -> "<deadline ms>
<grant ms> <holder info>"``. The kinds that hand off keep it in their hand-off waiters hash
(``naming.handoff_waiters``, written by ``acquire.lua``'s registration); every other kind in
``naming.waiting_key``, written by the *same* attempt its wait loop sends anyway: the kind's
acquire script run inside a wrapper (``noting``) that writes the record while the reply says
"still waiting" and removes it once it says anything else. The first attempt of an acquire
is never wrapped: an uncontended acquire costs what it did, and a waiter shows from its first
retry on, which the loop sends at once.

The holder info is an index entry (``identity.thread_info`` / ``task_info``) stamped with the
server's TIME of the wait's first record (a re-write keeps it): "waiting since" needs no host
clock. A record's deadline is the waiter's budget, or the bound of its park (the holder's PTTL,
the kind's recheck) plus a slack, whichever ends first: a waiter that gave up on its budget
is not listed past it, one that died not past its bound, and the hash expires with its
longest record. Listing reads these hashes in the pipeline it sends anyway (``read``).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import identity
from .lockinfo import parse_entry, text
from .lua import Script, source
from .naming import handoff_waiters, waiting_key
from .scripts import call_once

#: A record outlives the bound of its waiter's park by this much (ms): the waiter writes it
#: again on its next attempt, well before.
SLACK_MS = 5000
#: The longest a waiter whose attempt gives no bound is listed without writing again (ms).
UNBOUNDED_MS = 60_000
#: Waiters listed per lock at most.
MAX_LISTED = 1000
#: A wait that parks before its first attempt (behind a waiter of its own process, which
#: hands the lock on in order) is recorded once it has parked this long (seconds): one round
#: trip where no attempt is sent, and one more to take it out when the wait ends. A hand-off
#: inside a process is over long before: it never pays them.
PARKED_AFTER = 1.0

_serials = itertools.count(1)
#: Where ``noting.lua`` takes the kind's script.
_BODY = "-- the kind's script\n"
_wrapped: dict[tuple[str, str, str], Script] = {}


def noting(script: Script, waiting: str, ttl: str = "nil") -> Script:
    """``script`` run as a waiter's attempt: its KEYS and ARGV, then the waiting hash as one
    more KEY and the record's five ARGV (``Note.args``). ``waiting`` is a Lua test of the
    kind's ``reply`` (true: the caller still waits), ``ttl`` a Lua expression of how long
    (ms) the reply says the wait may last before the next attempt."""
    k = (script.sha, waiting, ttl)
    found = _wrapped.get(k)
    if found is None:
        head, _, tail = source("noting", WAITING=waiting, TTL=ttl).partition(_BODY)
        found = _wrapped[k] = Script(head + script.source + tail)
    return found


@dataclass(frozen=True, slots=True)
class Note:
    """One wait's record: its token, its budget's end (monotonic; None: none), what it says
    about the waiter, and how long a park of its may last without an attempt (ms)."""

    key: str
    token: str
    deadline: float | None
    info: str
    bound_ms: int = UNBOUNDED_MS

    def args(self) -> tuple[Any, ...]:
        budget = (-1 if self.deadline is None
                  else max(0, math.ceil((self.deadline - time.monotonic()) * 1000)))
        return (self.token, budget, self.bound_ms, SLACK_MS, self.info)

    def wrap(self, script: Script, keys: Sequence[Any], args: Sequence[Any], waiting: str,
             ttl: str = "nil") -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
        """The attempt ``script(keys, args)`` carrying this record."""
        return (noting(script, waiting, ttl), (*keys, waiting_key(self.key)),
                (*args, *self.args()))


def note(key: str, deadline: float | None, *, owner: str | None = None, aio: bool = False,
         info: str | None = None, bound: float | None = None) -> Note:
    """A record for the calling thread (``aio``: task) waiting for ``key``. ``owner``: its
    hash field if the kind has one (else the thread's or task's owner id); ``bound``: the
    longest park of the wait without an attempt (seconds; None: ``UNBOUNDED_MS``)."""
    if owner is None:
        owner = identity.task_owner() if aio else identity.thread_owner()
    if info is None:
        # Format 2: the kinds that call this without ``info`` write no process record.
        info = identity.task_info_inline(owner) if aio else identity.thread_info_inline(owner)
    bound_ms = UNBOUNDED_MS if bound is None else max(1, math.ceil(bound * 1000))
    return Note(key, f"{owner}#n{next(_serials)}", deadline, info, bound_ms)


def noted(n: Note | None, script: Script, keys: Sequence[Any], args: Sequence[Any],
          waiting: str, ttl: str = "nil") -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
    """``(script, keys, args)`` as sent: wrapped when ``n`` (a retry), as is otherwise."""
    if n is None:
        return script, tuple(keys), tuple(args)
    return n.wrap(script, keys, args, waiting, ttl)


class Parked:
    """The record of a wait parked before its first attempt (``wait.loop``): written by this
    process's one waiters thread once the park has lasted ``PARKED_AFTER`` (valid until the
    park's end plus the slack, or the budget's end), taken out by it after the wait ends. The
    waiter never waits on either: its park is the one it always was, and a hand-off to it is
    taken at once however slow the server answers (``client``: a sync client of the lock's
    server, also for an asyncio waiter). The record itself (``Note``) is made only if it is
    written: most such parks end long before (a hand-off inside the process)."""

    __slots__ = ("client", "_what", "_note", "_state", "_lock")

    def __init__(self, client: Any, n: Note | None = None,
                 what: tuple[str, float | None, str, str] | None = None) -> None:
        """``n``, or ``what``: (key, deadline, owner, info) to make it from when written."""
        self.client, self._note, self._what = client, n, what
        self._state = "new"  # "written", "done"
        self._lock = threading.Lock()

    @property
    def note(self) -> Note:
        if self._note is None:
            assert self._what is not None
            key, deadline, owner, info = self._what
            self._note = note(key, deadline, owner=owner, info=info)
        return self._note

    def start(self, end: float) -> None:
        """The wait parks until ``end`` (monotonic) before its first attempt."""
        now = time.monotonic()
        if end - now > PARKED_AFTER:
            _later(now + PARKED_AFTER, lambda: self._write(end))

    def _write(self, end: float) -> None:
        with self._lock:
            if self._state != "new" or time.monotonic() >= end:
                return  # over, or past its first park: its attempts carry its record
            self._state = "written"
        n = dataclasses.replace(self.note, bound_ms=max(1, math.ceil(
            (end - time.monotonic()) * 1000)))
        call_once(self.client, *n.wrap(_PARKED, (), (), "reply == 1"))

    def forget(self) -> None:
        """The wait ended: its record out, if it was written (after it, on the same thread)."""
        with self._lock:
            written, self._state = self._state == "written", "done"
        if written:
            _later(time.monotonic(), lambda: forget(self.client, self.note))


_jobs: list[tuple[float, int, Callable[[], Any]]] = []
_job_serials = itertools.count()
_jobs_cv = threading.Condition()
_sender: tuple[int, threading.Thread] | None = None


def _later(due: float, job: Callable[[], Any]) -> None:
    """Run ``job`` at ``due`` (monotonic) on this process's waiters thread (started on first
    use, and again in a forked child), one job at a time, in order of due time."""
    global _sender, _jobs
    with _jobs_cv:
        if _sender is None or _sender[0] != os.getpid() or not _sender[1].is_alive():
            if _sender is not None and _sender[0] != os.getpid():
                _jobs = []  # a forked child: the parent's jobs are not its own
            t = threading.Thread(target=_send, name="django-rlock waiters", daemon=True)
            t.start()
            _sender = (os.getpid(), t)
        heapq.heappush(_jobs, (due, next(_job_serials), job))
        if _jobs[0][2] is job:  # (a later one needs no wake: the thread sleeps until the first)
            _jobs_cv.notify()


#: The waiters thread runs a job up to this long (seconds) before its due time, with the jobs
#: due before it: one wake-up for a burst (every contended wait schedules one), not one each.
BATCH = 0.05


def _send() -> None:
    while True:
        with _jobs_cv:
            while not _jobs or _jobs[0][0] > time.monotonic() + BATCH:
                _jobs_cv.wait(None if not _jobs else _jobs[0][0] - time.monotonic())
            job = heapq.heappop(_jobs)[2]
        try:
            job()
        except Exception:
            pass  # the record ends at its deadline


_PARKED = Script(source("wait_parked"))


def forget(client: Any, n: Note | None) -> None:
    """Take the record of a wait that ended by an exception (stopped, interrupted, a lost
    connection) out at once: a round trip where no attempt is sent any more (a wait that timed
    out needs none: its record's deadline is its budget's end). Never raises."""
    if n is not None:
        try:
            client.hdel(waiting_key(n.key), n.token)
        except Exception:
            pass  # it ends at its deadline


async def aforget(client: Any, n: Note | None) -> None:
    """``forget`` on an asyncio client."""
    if n is not None:
        try:
            await client.hdel(waiting_key(n.key), n.token)
        except Exception:
            pass


class Noting:
    """What a lock kind (``base.LockBase``, which provides ``key``, ``_HANDOFF``, ``_info`` and
    ``_RECHECK``) adds for its waiters' records."""

    key: str
    _HANDOFF: bool
    _RECHECK: float | None
    _info: Callable[[str], str]
    #: Lua tests of the acquire's ``reply`` (``noting``): still waiting; ms to the next try.
    _WAITING: tuple[str, str] = ("type(reply) == 'number'", "reply")

    def _note(self, k: tuple[Any, str, str], deadline: float | None) -> Note | None:
        """The record the retries of a wait carry, for a kind without a hand-off (a hand-off
        kind's registration is its record: ``acquire.lua``)."""
        if self._HANDOFF:
            return None
        return note(self.key, deadline, owner=k[2], info=self._info(k[2]), bound=self._RECHECK)

    def _parked(self, k: tuple[Any, str, str], deadline: float | None, park_until: float,
                client: Any, info: str | None = None) -> Parked | None:
        """The record of a wait that parks before its first attempt (``park_until``).
        ``info``: the waiter's holder info, if the caller has it already."""
        if not park_until:
            return None
        return Parked(client, what=(self.key, deadline, k[2],
                                    self._info(k[2]) if info is None else info))


# -- reading (listing) -------------------------------------------------------------------------
@dataclass(frozen=True)
class Waiter:
    """One owner waiting for a lock: who (as ``lockinfo.Holder``), since when (seconds since
    the epoch, server time) and for how long so far."""

    client_id: str
    thread_id: int | None
    host: str | None
    pid: int | None
    process: str | None
    thread: str | None
    since: float
    waiting_for: float

    @property
    def owner(self) -> str:
        return self.client_id if self.thread_id is None else f"{self.client_id}:{self.thread_id}"

    def as_dict(self) -> dict[str, Any]:
        """The keys of ``Holder.as_dict`` (no holds yet: ``hold_count`` 0, ``held_for``
        null), with ``since`` and ``waiting_for``."""
        return {"client_id": self.client_id, "thread_id": self.thread_id, "hold_count": 0,
                "host": self.host, "pid": self.pid, "process": self.process,
                "thread": self.thread, "held_for": None, "since": round(self.since, 3),
                "waiting_for": round(self.waiting_for, 3)}

    def describe(self) -> str:
        """One line: ``<owner> (worker pid 12 on web-1, thread T, waiting 2.5 s)``."""
        where = ("process unknown" if self.pid is None  # its process record is gone
                 else f"{self.process} pid {self.pid} on {self.host}")
        return f"{self.owner} ({where}, thread {self.thread}, waiting {self.waiting_for:.1f} s)"


def _owner_of(token: str, info: dict[str, Any]) -> tuple[str, int | None]:
    field = token.partition("#")[0] or str(info.get("owner_short") or info.get("owner") or "?")
    head, sep, serial = field.rpartition(":")
    if sep and serial.isdigit():
        return head, int(serial)
    return field, None


def parse(raw: Any, now_ms: float) -> list[Waiter]:
    """The live waiters in a waiters hash (an HGETALL reply), longest waiting first. Records
    past their deadline (a waiter that gave up or died) and the hash's own bookkeeping fields
    (``=owner``, ``!turn``) are skipped."""
    if not isinstance(raw, dict):
        return []
    out = []
    for f, v in raw.items():
        token, value = text(f), text(v)
        if not token or value is None or token[0] in "=!":
            continue
        deadline, _, rest = value.partition(" ")
        _, _, info_raw = rest.partition(" ")
        if not deadline.isdigit() or int(deadline) <= now_ms:
            continue
        parsed = parse_entry(info_raw)
        if parsed is None:
            continue
        since, info = parsed
        client_id, thread_id = _owner_of(token, info)
        pid = info.get("pid")
        out.append(Waiter(client_id, thread_id, _str(info.get("host")),
                          pid if isinstance(pid, int) else None, _str(info.get("process")),
                          _str(info.get("thread")), since, max(0.0, now_ms / 1000.0 - since)))
    out.sort(key=lambda w: w.since)
    return out[:MAX_LISTED]


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def read_commands(key: str, hand_off: bool) -> list[Callable[[Any], Any]]:
    """What listing adds to its pipeline for ``key``: an HGETALL per waiters hash."""
    names = [waiting_key(key)] + ([handoff_waiters(key)] if hand_off else [])
    return [lambda pipe, n=n: pipe.hgetall(n) for n in names]


def from_replies(replies: Sequence[Any], now_ms: float) -> tuple[Waiter, ...]:
    """The waiters of one lock from its ``read_commands`` replies."""
    found = [w for r in replies for w in parse(r, now_ms)]
    found.sort(key=lambda w: w.since)
    # One owner waits once: a wait parked first may be in both hashes for a moment.
    once = {(w.client_id, w.thread_id): w for w in reversed(found)}
    return tuple(sorted(once.values(), key=lambda w: w.since)[:MAX_LISTED])


__all__ = ["PARKED_AFTER", "SLACK_MS", "UNBOUNDED_MS", "Note", "Noting", "Parked", "Waiter",
           "aforget", "forget", "from_replies", "note", "noted", "noting", "parse",
           "read_commands"]
