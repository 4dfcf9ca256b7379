"""Celery tasks that never run twice at once, survive worker crashes, and can refuse duplicates.

Decorate with the task decorator outermost::

    @shared_task(bind=True)
    @locked("sync:{account_id}", on_busy="retry")
    def sync_account(self, account_id): ...

Inside a task, ``@locked`` holds its lock (watchdog mode: renewed for the whole run) and
releases it on success, failure, retry and ``revoke(terminate=True)``. A worker child killed
with SIGKILL stops renewing, so the lock expires within the watchdog timeout. Prefork children
are distinct owners (each gets its own process id after fork).

Enqueue-time de-duplication (``@locked(..., dedupe=True)`` with ``base=LockedTask``): while an
identical call (same task, same canonically bound arguments) is queued or running, ``delay()``
/ ``apply_async()`` enqueue nothing and return the existing task's ``AsyncResult``.

A redelivered message (``acks_late``) that finds its lock busy is dropped only if its own
first delivery holds the lock and is alive; it runs once a dead first delivery's lock expires,
and is answered ``on_busy`` when another call holds it (``django_rlock.redelivery``).

A task body inside ``transaction.atomic()`` keeps its lock (and de-dup mark) until that
transaction ends, as any ``@locked`` call does (``until_commit``).

This module depends on ``django_rlock.decorators``, never the reverse: importing it registers
the Celery hooks there (the app config imports it when Celery is installed).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from celery import Task
from celery._state import get_current_task
from celery.exceptions import Ignore, Retry
from celery.signals import task_postrun, task_revoked
from celery.utils import uuid

from . import answers, redelivery, transaction
from .answers import unreachable
from .decorators import (
    TaskHooks,
    bound_arguments,
    busy_ttl,
    call_args,
    hold_for_call,
    register_task_hooks,
    run_windowed,
    turned_away,
)
from .engine import LockBusy, taskmark
from .engine.clients import for_key, index_for
from .engine.lock import RLock
from .engine.rwlock import ReadLock, WriteLock
from .engine.scripts import MARK_CLAIM_SCRIPT, MARK_RELEASE_SCRIPT, call, call_once
from .engine.watchdog import server_id, watchdog
from .lockspec import FencedCall

logger = logging.getLogger("django_rlock")

__all__ = ["LockedTask", "dedupe_name", "retry", "retry_unavailable", "task_of"]


def task_of(args: tuple[Any, ...], wrapper: Callable[..., Any] | None = None) -> Any:
    """The Celery task this call runs as, or None.

    A bound task passes itself first; an unbound one is recognised as the worker's current
    task whose ``run`` is our wrapper.
    """
    if args and isinstance(args[0], Task):
        return args[0]
    if wrapper is not None:
        current = get_current_task()
        run = getattr(current, "run", None)
        if current is not None and getattr(run, "__func__", run) is wrapper:
            return current
    return None


def retry(busy: LockBusy, task: Any, countdown: float | None = None) -> Any:
    """``raise task.retry(...)`` after ``countdown`` (``@locked`` passes its busy answer's
    Retry-After: the estimate from recent hold times, at most the holder's remaining lease),
    else after the holder's remaining lease.

    ``max_retries`` is honoured by Celery: past it, the task fails with the ``LockBusy``.
    """
    if task is None:
        raise TypeError(f"on_busy='retry' needs a bound task (@shared_task(bind=True)) to retry "
                        f"(lock {busy.name!r})")
    if countdown is None:
        ttl = busy.ttl
        countdown = 1 if ttl is None or math.isinf(ttl) else max(1, math.ceil(ttl))
    raise task.retry(countdown=countdown, exc=busy)


def retry_unavailable(task: Any, spec: Any, name: str | None, exc: BaseException) -> Any:
    """The lock backend did not answer: ``raise task.retry(exc=...)`` with the task's own
    policy (``default_retry_delay``, or ``retry_backoff`` / ``retry_backoff_max`` /
    ``retry_jitter`` as Celery's ``autoretry_for`` counts them; ``max_retries`` honoured:
    past it the task fails with the connection error). The outage is logged once."""
    answers.backend_down(spec, name, exc)
    countdown = None
    if getattr(task, "retry_backoff", False):
        from celery.utils.time import get_exponential_backoff_interval

        countdown = get_exponential_backoff_interval(
            factor=int(task.retry_backoff), retries=task.request.retries,
            maximum=task.retry_backoff_max, full_jitter=task.retry_jitter)
    raise task.retry(exc=exc, countdown=countdown)


# -- enqueue de-duplication -----------------------------------------------------------------------
def _spec_of(task: Any) -> Any:
    return getattr(getattr(task, "run", None), "__rlock_spec__", None)


def _call_signature(task: Any) -> inspect.Signature:
    """The signature callers use: a bound task's ``self`` is not an argument of the call."""
    sig = inspect.signature(task.run.__func__ if inspect.ismethod(task.run) else task.run)
    params = list(sig.parameters.values())
    if inspect.ismethod(task.run) and params:
        params = params[1:]
    return sig.replace(parameters=params)


def dedupe_name(task: Any, args: Any = None, kwargs: Any = None) -> str:
    """``dedupe:<task name>:<digest>`` of the canonically bound call.

    ``f(1, b=2)`` and ``f(a=1, b=2)`` bind alike, defaults are filled in, so both name one mark.
    """
    values = bound_arguments(_call_signature(task), tuple(args or ()), dict(kwargs or {}))
    try:
        canonical = _canonical(values)
    except TypeError as exc:  # a dict whose keys cannot be sorted ({1: "a", "b": 2})
        bad = next((k for k, v in values.items() if not _canonicalises(v)), None)
        raise TypeError(f"de-duplicated task {task.name!r}: argument {bad!r} cannot be put in "
                        f"canonical form to name its de-dup mark ({exc}); dict keys of mixed "
                        f"types cannot be sorted: use keys of one type") from None
    return f"dedupe:{task.name}:{hashlib.sha1(canonical.encode()).hexdigest()[:24]}"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def _canonicalises(value: Any) -> bool:
    try:
        _canonical(value)
    except TypeError:
        return False
    return True


#: Options that make a call more than its task: a turned-away call would lose them.
CALLBACK_OPTIONS = ("link", "link_error", "chain", "chord")


def _seconds_until(when: Any, app: Any) -> float | None:
    """Seconds from now until ``when`` (seconds from now, a datetime or an ISO 8601 str)."""
    if when is None:
        return None
    if isinstance(when, (int, float)):
        return float(when)
    from datetime import datetime

    from celery.utils.time import maybe_make_aware

    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    if not isinstance(when, datetime):
        return None
    return (maybe_make_aware(when, app.timezone) - app.now()).total_seconds()


def mark_ttl(task: Any, options: dict[str, Any]) -> float:
    """How long a queued call's mark lives: ``dedupe_ttl`` past the time it may start (its
    ``countdown``/``eta``), and never past its ``expires`` (an expired message never runs, so
    its mark must not refuse a new call)."""
    start = _seconds_until(options.get("countdown"), task.app)
    if start is None:
        start = _seconds_until(options.get("eta"), task.app)
    ttl = max(0.0, start or 0.0) + float(task.dedupe_ttl)
    expires = _seconds_until(options.get("expires", getattr(task, "expires", None)), task.app)
    return ttl if expires is None else min(ttl, expires)


def _field(task_id: str) -> str:
    return f"{task_id}:0"


class LockedTask(Task):
    """Task base class for ``@locked(..., dedupe=True)``: refuses to enqueue a duplicate.

    ``dedupe_ttl`` (seconds) bounds how long a mark lives while its task waits in the queue
    (a message lost with a dead worker frees it then), counted from its ``countdown``/``eta``
    and never past its ``expires``; while the task runs, the worker's watchdog keeps it
    alive, and it is released when the task finishes in any state or is revoked. The task's
    own retries reuse its mark. A call carrying callbacks (``link``, ``link_error``, a chain,
    a chord), a chain's last step, a group's member or a call given its ``task_id`` is never
    turned away: it would lose them, or leave an id that never gets a result.
    """

    abstract = True
    dedupe_ttl: float = 600.0

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    *rest: Any, **options: Any) -> Any:
        spec = _spec_of(self)
        if spec is None or not spec.dedupe or self.app.conf.task_always_eager:
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        name = dedupe_name(self, args, kwargs)  # wrong arguments fail here, before any command
        client, prefix, _ = spec.where()
        key = prefix + name
        ttl_ms = max(1, math.ceil(mark_ttl(self, options) * 1000))
        carried = [o for o in CALLBACK_OPTIONS if options.get(o)]  # (rest: producer, link, ...)
        carried += [o for o, v in zip(("link", "link_error"), rest[1:3], strict=False) if v]
        # Calls whose id is kept elsewhere before they are sent: a chain's last step (sent
        # with an empty ``chain``), a group's member (its group result holds the id), a caller
        # that chose the id. Turned away, that id would never get a result (``.get()`` hangs).
        current = get_current_task()
        retry_of_current = (task_id is not None and current is not None
                            and getattr(current.request, "id", None) == task_id)
        if "chain" in options and "chain" not in carried:
            carried.append("chain")
        if options.get("group_id"):
            carried.append("group_id")
        if task_id is not None and not retry_of_current:
            carried.append("task_id")
        task_id = task_id or uuid()
        field = _field(task_id)
        keys = (key, index_for(client, prefix, key))
        try:
            holder = call(client, MARK_CLAIM_SCRIPT, keys,
                          (field, ttl_ms, taskmark.entry(field, taskmark.QUEUED, self.name)))
        except Exception as exc:
            if not unreachable(exc):
                raise
            # No mark without Redis: enqueue anyway. The run still takes its lock (and retries
            # while Redis is down), so a duplicate may run after this one, never beside it.
            answers.backend_down(spec, name, exc)
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        if holder is not None and carried:
            # A turned-away call would lose its callbacks (a chain's next step, a chord's
            # count): it is enqueued; its run still takes the task's lock.
            existing = (holder.decode() if isinstance(holder, bytes) else holder).rsplit(":", 1)[0]
            logger.info("django-rlock: enqueueing %s beside the identical task %s: it carries "
                        "%s, which a turned-away call would lose", self.name, existing,
                        "/".join(carried))
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        if holder is not None:
            existing = (holder.decode() if isinstance(holder, bytes) else holder).rsplit(":", 1)[0]
            logger.info("django-rlock: not enqueueing %s: the identical task %s is queued or running",
                        self.name, existing)
            return self.AsyncResult(existing)
        if retry_of_current:
            _requeued[field] = ttl_ms  # a retry: its run puts this TTL back once it stops renewing
        try:
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        except BaseException:
            call(client, MARK_RELEASE_SCRIPT, keys, (field,))
            raise

    def revoke_call(self, args: Any = None, kwargs: Any = None, **revoke_options: Any) -> str | None:
        """Revoke the queued (or running) identical call of ``args``/``kwargs`` and free its
        de-dup mark now, so the same call can be enqueued again at once.

        A plain ``revoke()`` frees the mark only when a worker meets the revoked message, and
        until then ``delay()`` returns the revoked task's id. ``revoke_options`` go to
        ``app.control.revoke`` (``terminate=True`` stops a running one; without it a running
        task goes on, and a new identical call meets its lock: ``on_busy``, skipped by
        default). Returns the revoked task's id, or None if no identical call holds a mark.
        """
        spec = _spec_of(self)
        if spec is None or not spec.dedupe:
            raise TypeError(f"revoke_call: task {self.name!r} is not @locked(..., dedupe=True)")
        name = dedupe_name(self, args, kwargs)  # wrong arguments fail here, before any command
        client, prefix, _ = spec.where()
        key = prefix + name
        fields = client.hkeys(key)
        if not fields:
            return None
        field = fields[0].decode() if isinstance(fields[0], bytes) else str(fields[0])
        task_id = field.rsplit(":", 1)[0]
        self.app.control.revoke(task_id, **revoke_options)
        call(client, MARK_RELEASE_SCRIPT, (key, index_for(client, prefix, key)), (field,))
        return task_id


#: Mark field -> TTL (ms) its task's retry set when re-enqueued; the running task's watchdog may
#: renew the mark to its own timeout after that, so the run sets it again when it stops.
_requeued: dict[str, int] = {}


class _Mark:
    """A running task's claim on its de-dup mark, renewed by this process's watchdog."""

    def __init__(self, spec: Any, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        client, self.prefix, self.watchdog_timeout = spec.where()
        prefix = self.prefix
        call_args = args[1:] if args and args[0] is task else args
        self.key = prefix + dedupe_name(task, call_args, kwargs)
        #: Idempotent scripts go through ``client`` (a cluster client follows a moved slot);
        #: the claim, sent once, and its renewals through the key's own server.
        self.caller, self.client = client, for_key(client, self.key)
        self.keys = (self.key, index_for(client, prefix, self.key))
        self.field = _field(task.request.id)
        self.k = (server_id(self.client), self.key, self.field)
        self.name = task.name
        self.held = False

    def adopt(self) -> None:
        ms = max(1, math.ceil(self.watchdog_timeout * 1000))
        if call_once(self.client, MARK_CLAIM_SCRIPT, self.keys,
                     (self.field, ms, taskmark.entry(self.field, taskmark.RUNNING, self.name))) is None:
            watchdog().acquired(self.k, self.client, self.key, ms, True, self.watchdog_timeout, None,
                                prefix=self.prefix)
            self.held = True
        # else: an identical task holds it (ours expired in the queue); leave it alone

    def finish(self, release: bool, until_commit: bool) -> None:
        """Stop renewing; with ``release``, delete the mark (with ``until_commit``: once the
        transactions around the task end, like its lock)."""
        ttl_ms = _requeued.pop(self.field, None)
        if not self.held:
            return
        if not release:
            watchdog().forget(self.k)  # a retry keeps the mark on the TTL its re-enqueue set
            if ttl_ms is not None:
                call(self.caller, MARK_CLAIM_SCRIPT, self.keys,
                     (self.field, ttl_ms, taskmark.entry(self.field, taskmark.QUEUED, self.name)))
        elif until_commit:
            transaction.TransactionRelease(self._release, self.key).done()
        else:
            self._release()

    def _release(self) -> None:
        watchdog().forget(self.k)
        call(self.caller, MARK_RELEASE_SCRIPT, self.keys, (self.field,))


@task_revoked.connect
def _release_revoked_mark(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A revoked task never finishes: free its mark now (in the worker's main process)."""
    spec = _spec_of(sender)
    if spec is None or not spec.dedupe or request is None:
        return
    try:
        client, prefix, _ = spec.where()
        key = prefix + dedupe_name(sender, request.args, request.kwargs)
        call(client, MARK_RELEASE_SCRIPT, (key, index_for(client, prefix, key)),
             (_field(request.id),))
    except Exception:
        logger.exception("django-rlock: could not release the de-dup mark of revoked task %s",
                         getattr(request, "id", "?"))


# -- running a locked task ----------------------------------------------------------------------
def run_task(spec: Any, wrapper: Callable[..., Any], func: Callable[..., Any], name: str,
             task: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             on_busy: Callable[..., Any]) -> Any:
    """The body of ``@locked`` when it runs as a Celery task.

    ``revoke(terminate=True)`` needs nothing special: billiard's pool children turn SIGTERM
    into ``SystemExit``, which unwinds through the ``finally`` clauses below.
    """
    mark = None
    try:
        if spec.dedupe:
            if not isinstance(task, LockedTask):
                logger.warning("django-rlock: %s uses @locked(dedupe=True) but is not a "
                               "LockedTask: duplicates are not refused at enqueue time; use "
                               "@shared_task(base=LockedTask, ...)", task.name)
            mark = _Mark(spec, task, args, kwargs)
            mark.adopt()
        lock = spec.sync_lock(name)
        got = lock.try_lock(spec.wait, spec.lease)
        verdict = None
        if not got and spec.drop_redelivered and _redelivered(task):
            verdict = _judge(spec, lock, name, task)
            if verdict.action == redelivery.RUN:  # the dead holder's lock has expired
                got = lock.try_lock(spec.wait, spec.lease)
        ttl = None if got else busy_ttl(lock)
    except Exception as exc:
        if not unreachable(exc):
            raise
        if mark is not None:
            mark.finish(release=False, until_commit=False)
        return retry_unavailable(task, spec, name, exc)
    answers.backend_up(spec)
    retrying = False
    booking = None
    times = spec.hold_times if spec.hold_at_least is None else None
    try:
        if not got:
            busy = turned_away(spec, lock, ttl)
            if verdict is not None and verdict.action == redelivery.DROP:
                logger.info("django-rlock: %s[%s] redelivered, lock %r busy: dropped this copy: "
                            "%s", task.name, task.request.id, name, verdict.why)
                raise Ignore()
            if verdict is not None:
                logger.info("django-rlock: %s[%s] redelivered, lock %r busy: answered as a "
                            "busy call (on_busy): %s", task.name, task.request.id, name,
                            verdict.why)
            return on_busy(busy)
        if verdict is not None:
            logger.info("django-rlock: %s[%s] redelivered, lock %r was busy: running it now: "
                        "%s", task.name, task.request.id, name, verdict.why)
        if spec.drop_redelivered and getattr(task, "acks_late", False) and watchable(spec, lock):
            booking = _book(spec, name, task)
        if spec.hold_at_least is not None:
            # The lock outlives a quick run as a lease for the rest of the window; the
            # de-dup mark does not (an identical task may be queued: it is turned away).
            return run_windowed(spec, lock, func, args, kwargs, hold_for_call)
        hold = hold_for_call(spec, lock, func)
        t0 = time.monotonic()
        try:
            return func(*args, **call_args(lock, func, kwargs))
        finally:
            if times is not None:
                times.add(time.monotonic() - t0)
            if booking is not None:  # done before the release: a copy that sees the lock
                booking.end(verdict.dead_owner if verdict is not None else None)  # gone
                booking = None  # finds the run done, never taken for a dead one
            hold.done()
    except Retry:
        retrying = True
        raise
    finally:
        if booking is not None:
            booking.end(verdict.dead_owner if verdict is not None else None)
        if mark is not None:
            mark.finish(release=not retrying, until_commit=spec.until_commit)


def _redelivered(task: Any) -> bool:
    return bool((getattr(task, "request", None) and task.request.delivery_info or {})
                .get("redelivered"))


def _book(spec: Any, name: str, task: Any) -> redelivery.Run | None:
    """Book this run's hold, so a redelivered copy of its message can tell it is ours."""
    client, prefix, _ = spec.where()
    booking = redelivery.Run(client, prefix, name, task.request.id)
    try:
        booking.begin()
    except Exception as exc:  # the lock is ours already: run; a copy will answer on_busy
        logger.warning("django-rlock: could not book the run of %s[%s] under lock %r: %s",
                       task.name, task.request.id, name, exc)
        return None
    return booking


def watchable(spec: Any, lock: Any) -> bool:
    """A lock with one hash key whose fields are owners (``RLock`` and its fair, fenced and
    non-reentrant kinds, not the read-write ones, whose fields say ``:read``/``:write``),
    renewed by the watchdog (a fixed lease runs out beside a live holder): what
    ``redelivery`` can watch."""
    return (isinstance(lock, (RLock, FencedCall)) and not isinstance(lock, (ReadLock, WriteLock))
            and spec.lease is None)


def _judge(spec: Any, lock: Any, name: str, task: Any) -> redelivery.Verdict:
    """Whether the busy lock is held by this message's own first delivery, alive or dead."""
    client, prefix, watchdog_timeout = spec.where()
    lock_key = lock.key if watchable(spec, lock) else None
    return redelivery.decide(client, prefix, name, lock_key, task.request.id, watchdog_timeout)


@task_postrun.connect(weak=False, dispatch_uid="django_rlock.release_ended")
def _release_ended(**_: Any) -> None:
    """Safety net on the task's own thread: a release still waiting for a transaction that has
    ended (its commit callback was skipped) happens now, not at this thread's next lock."""
    transaction.release_ended()


register_task_hooks(TaskHooks(task_of=task_of, run=run_task, retry=retry))
