"""What a redelivered task message does when it finds its lock busy: drop, run, or answer busy.

A broker hands a message out again in cases that look alike to the copy:

- its first delivery still runs (``acks_late`` with a visibility timeout shorter than the
  task): running the copy would run the task twice, so the copy is dropped;
- its first delivery's worker died (a SIGKILLed or OOM-killed prefork child with
  ``reject_on_worker_lost``, a whole worker killed and restarted): the dead holder's lock
  lives on until its lease ends (at most the watchdog timeout); the copy must run after it;
- its first delivery never started (prefetched by a worker that died): a busy lock is then
  another call's, and the copy is answered as any busy call (``on_busy``).

The lock cannot tell these apart, so a Celery run of an ``acks_late`` ``@locked`` task books
its hold in a run record: the hash ``rlock-taskrun:<prefix><lock name>``, field the lock's owner field
(``<client uuid>:<thread>``), value the task id; written after the lock is taken, and
marked done (``<task id> done``) *before* the lock is released, so a copy that sees the
lock gone or taken by another call reads the run as finished, never as dead. The field is
overwritten by that thread's next run, so the hash holds one field per worker thread that
ran under the lock name. A copy finds its own task id there not done only if its first
delivery took the lock and did not finish. It then watches the lock (PTTL and that
owner's field, one round trip a poll): a live holder's watchdog pushes the deadline out
every third of the watchdog timeout (drop); a dead holder's deadline only comes closer and
the key vanishes at it (run, unless the run reads done: drop); a key gone well before its
deadline was released by a holder that finished (drop); an owner field gone from a live key
means the dead holder's lock expired and another call took it (busy), or, the run done, that
it finished (drop). Locks it cannot watch (several servers, semaphores, read-write locks, a
fixed ``lease``) drop the copy, as before.

Early-acked tasks book nothing: their message is acked before the body runs, so a
redelivered copy's first delivery never held the lock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from .engine import identity
from .engine.clients import for_key
from .engine.naming import taskrun_key

logger = logging.getLogger("django_rlock")

__all__ = ["BUSY", "DONE", "DROP", "RUN", "Run", "Verdict", "decide", "record_key"]

#: How long a run record outlives its last write: a first delivery running longer than this
#: is not recognised by its redelivered copy (answered as any busy call).
RECORD_TTL_MS = 24 * 3600 * 1000
DROP, RUN, BUSY = "drop", "run", "busy"


def record_key(prefix: str, name: str) -> str:
    """The run record of lock ``name`` under ``prefix`` (``naming.taskrun_key``)."""
    return taskrun_key(prefix, name)


@dataclass(frozen=True)
class Verdict:
    """What the copy does (``DROP``, ``RUN`` once the lock is free, ``BUSY``: ``on_busy``), and
    why, for the log."""

    action: str
    why: str
    #: The dead first delivery's owner field, whose booking the copy clears (``RUN``).
    dead_owner: str | None = None


class Run:
    """A Celery run's booking of its hold in the run record (see the module docstring)."""

    def __init__(self, client: Any, prefix: str, name: str, task_id: str) -> None:
        self.client, self.key = client, record_key(prefix, name)
        self.owner, self.task_id = identity.thread_owner(), task_id

    def begin(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.key, self.owner, self.task_id)
        pipe.pexpire(self.key, RECORD_TTL_MS)
        pipe.execute()

    def end(self, dead_owner: str | None = None) -> None:
        """Mark this run done (and clear the dead first delivery's booking, which nobody else
        clears); called before the lock's release."""
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(self.key, self.owner, f"{self.task_id}{DONE}")
            if dead_owner:
                pipe.hdel(self.key, dead_owner)
            pipe.pexpire(self.key, RECORD_TTL_MS)
            pipe.execute()
        except Exception as exc:  # a copy would take a live run for a dead one: say so
            logger.warning("django-rlock: could not mark the run of task %s done in %s (%s): "
                           "a redelivered copy of it may take it for dead and run again",
                           self.task_id, self.key, exc)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: What ``Run.end`` appends to the task id: the run finished (or is releasing the lock now).
DONE = " done"


def _booking(client: Any, key: str, task_id: str) -> tuple[str | None, bool]:
    """The owner field the first delivery of ``task_id`` booked (None: none), and whether
    that run is done."""
    for field, value in client.hgetall(key).items():
        v = _text(value)
        if v == task_id or v == task_id + DONE:
            return _text(field), v != task_id
    return None, False


def decide(client: Any, prefix: str, name: str, lock_key: str | None, task_id: str,
           watchdog_timeout: float) -> Verdict:
    """The verdict on a redelivered copy of ``task_id`` that found lock ``name`` (its key
    ``lock_key``: None for a lock this cannot watch) busy; waits
    (polling) up to about one and a half watchdog timeouts for a dead holder's lock to end."""
    if lock_key is None:  # a lock over several servers, a semaphore, a read-write lock...
        return Verdict(DROP, "its lock (over several servers, or of a kind without one owner "
                             "field) cannot be watched: the first delivery is assumed to still "
                             "run")
    key = record_key(prefix, name)
    owner, done = _booking(client, key, task_id)
    if done:
        return Verdict(DROP, "its first delivery has finished")
    if owner is None:
        return Verdict(BUSY, "its first delivery never held the lock (it never started): "
                             "another call holds it")
    node = for_key(client, lock_key)
    step = max(0.02, min(0.25, watchdog_timeout / 20))
    give_up = time.monotonic() + 1.5 * watchdog_timeout + 1.0
    # The holder's deadline, bracketed: PTTL was read between t0 and t1, so the deadline lies
    # in [t0 + pttl, t1 + pttl]; a lease nobody renews keeps one deadline, so a lower bound
    # past an earlier upper bound means it was renewed.
    lower = upper = None
    while True:
        t0 = time.monotonic()
        pipe = node.pipeline(transaction=False)
        pipe.pttl(lock_key)
        pipe.hexists(lock_key, owner)
        pttl, has = pipe.execute()
        t1 = time.monotonic()
        if pttl == -2:  # gone
            if lower is not None and t1 < lower - 0.002:
                return Verdict(DROP, "its first delivery released the lock before its lease "
                                     "ended (it was alive)")
            if _booking(client, key, task_id)[1]:  # marked done before its release
                return Verdict(DROP, "its first delivery finished and released the lock")
            return Verdict(RUN, "its first delivery's worker died: its lock expired", owner)
        if not has:
            if _booking(client, key, task_id)[1]:
                return Verdict(DROP, "its first delivery finished; another call holds the "
                                     "lock now")
            return Verdict(BUSY, "its first delivery's worker died and its lock expired; "
                                 "another call holds the lock now")
        if pttl == -1:
            return Verdict(DROP, "its first delivery holds the lock with no expiry (alive)")
        lo, hi = t0 + pttl / 1000, t1 + pttl / 1000
        if upper is not None and lo > upper + 0.005:
            return Verdict(DROP, "its first delivery still runs (its lock is being renewed)")
        lower = lo if lower is None else max(lower, lo)
        upper = hi if upper is None else min(upper, hi)
        if t1 > give_up:
            return Verdict(DROP, f"could not tell within {1.5 * watchdog_timeout + 1:.0f}s "
                                 "whether its first delivery still runs (a fixed lease "
                                 "longer than that): assumed to")
        time.sleep(step)
