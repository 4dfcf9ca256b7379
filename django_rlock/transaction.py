"""Hold a lock until the database transaction around it ends, not just until the call returns.

Inside ``transaction.atomic()`` (or a view under ``ATOMIC_REQUESTS``) a release at return is
too early: the writes are not committed yet, so the next holder reads the old rows and
overwrites them (a lost update). Here a release waits for every outermost transaction that
was open on this thread when the lock was taken, on every database: its commit, its rollback,
or the rollback of a savepoint that contained the lock.

Django has no rollback hook. It runs ``on_commit`` callbacks after a commit and, on a rollback
(full, or of the savepoint the callback was registered in), drops them from
``connection.run_on_commit``. So the callback registered here is a function watched by a
``weakref.finalize``: called on commit, or freed the moment Django drops it (CPython frees it
on the spot, on the thread that rolled back), the release runs either way. Nothing waits on a
timer and nothing is renewed after the transaction is gone.

Only the thread that took a lock can release it (the owner is the thread). A callback that
outlives its transaction, because an ``on_commit`` callback before it raised and a traceback
still holds Django's list, or that is freed by the cyclic collector on another thread, is
released by ``release_ended()`` on the owner thread: at its next ``@locked`` call, when its
request finishes (``request_finished``) or when its Celery task ends (``task_postrun``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("django_rlock")

__all__ = ["TransactionRelease", "hold_until_commit", "in_transaction", "open_transactions",
           "release_ended"]

_local = threading.local()
_signals_connected = False


def _reset_after_fork() -> None:
    """A forked child is a new owner: it never releases, or waits to release, its parent's locks."""
    global _local
    _local = threading.local()


os.register_at_fork(after_in_child=_reset_after_fork)


def _thread_token() -> object:
    """This thread's identity for releases: an object, so a reused thread id cannot match."""
    try:
        return _local.token
    except AttributeError:
        token = _local.token = object()
        return token


def _pending() -> list[TransactionRelease]:
    try:
        return _local.pending  # type: ignore[no-any-return]
    except AttributeError:
        pending: list[TransactionRelease] = []
        _local.pending = pending
        return pending


#: Django's database connection handler, once ``django.db`` is loaded and settings configured
#: (neither can be undone); None before.
_connections: Any = None


def _db_connections() -> Any:
    global _connections
    if _connections is None:
        if "django.db" not in sys.modules:
            return None
        from django.conf import settings

        if not settings.configured:
            return None
        from django.db import connections

        _connections = connections
    return _connections


def _atomic_connections() -> list[Any]:
    """This thread's connections inside ``atomic()``; none if Django's ORM was never loaded."""
    connections = _db_connections()
    if connections is None:
        return []
    return [c for c in connections.all(initialized_only=True) if c.in_atomic_block]


def in_transaction() -> bool:
    """Is an atomic block open on this thread, on any database (after releasing what
    ``release_ended`` finds)? False: a lock taken now can be released as its call ends.

    This is ``@locked``'s check on every call, so it is ``_atomic_connections`` made cheap:
    one look per database alias at this thread's connections, none opened.
    """
    if getattr(_local, "pending", None):
        release_ended()
    connections = _db_connections()
    if connections is None:
        return False
    opened = getattr(connections, "_connections", None)  # asgiref Local, as all() reads it
    if opened is None:  # pragma: no cover - another Django: its public, slower way
        return any(c.in_atomic_block for c in connections.all(initialized_only=True))
    for alias in connections.settings:
        connection = getattr(opened, alias, None)
        if connection is not None and connection.in_atomic_block:
            return True
    return False


def open_transactions() -> list[str]:
    """Aliases of the databases with an atomic block open on this thread."""
    return [c.alias for c in _atomic_connections()]


def _connect_signals() -> None:
    """Sweep at the end of each request: a safety net, connected at the first deferral."""
    global _signals_connected
    if _signals_connected:
        return
    from django.core.signals import request_finished

    request_finished.connect(_on_request_finished, dispatch_uid="django_rlock.release_ended")
    _signals_connected = True


def _on_request_finished(**_: Any) -> None:
    release_ended()


class TransactionRelease:
    """One release that waits for the transactions open when it was made.

    Make it right after acquiring (so its commit callback runs before any the protected code
    registers, e.g. a task enqueued ``on_commit`` that wants the same lock), and call
    ``done()`` when the protected code is over: that releases at once if no transaction was
    open or all have ended, otherwise when the last one ends. ``release`` must not raise; it
    runs on this thread.
    """

    def __init__(self, release: Callable[[], object], name: str = "") -> None:
        self.name = name
        self._release = release
        self._owner = _thread_token()
        self._tickets: list[tuple[Any, weakref.finalize[Any, Any], weakref.ref[Any]]] = []
        self._armed = False
        self._released = False
        release_ended()
        for connection in _atomic_connections():
            self._watch(connection)

    def _watch(self, connection: Any) -> None:
        from django.db import transaction

        def release_lock_after_commit() -> None:
            ended()

        ended = weakref.finalize(release_lock_after_commit, self._ended)
        ended.atexit = False  # at exit the owner thread is gone: the lease runs out instead
        try:
            transaction.on_commit(release_lock_after_commit, using=connection.alias, robust=True)
        except Exception:
            ended.detach()
            raise
        self._tickets.append((connection, ended, weakref.ref(release_lock_after_commit)))

    @property
    def waiting_for(self) -> list[str]:
        """Aliases whose transaction this release still waits for."""
        return [c.alias for c, ended, ticket in self._tickets if self._ticket_waits(c, ended, ticket)]

    @staticmethod
    def _ticket_waits(connection: Any, ended: weakref.finalize[Any, Any], ticket: weakref.ref[Any]) -> bool:
        if not ended.alive:
            return False  # called on commit, or dropped by a rollback
        func = ticket()
        # Django forgets a callback when its transaction ends; one kept alive elsewhere (a
        # traceback) is no longer in the connection's list.
        return func is not None and any(f is func for _, f, _ in connection.run_on_commit)

    def done(self) -> bool:
        """The protected code is over. True if the release waits for a transaction."""
        self._armed = True
        waiting = self.waiting_for
        if not waiting:
            self._release_now()
            return False
        _pending().append(self)
        _connect_signals()
        logger.debug("django-rlock: lock %r is released when the transaction on %s ends",
                     self.name, ", ".join(map(repr, waiting)))
        return True

    def _ended(self) -> None:
        """A commit callback was called or dropped (on any thread, maybe by the collector)."""
        self.settle()

    def settle(self) -> bool:
        """Release if every awaited transaction has ended (owner thread only). True if released."""
        if self._armed and not self._released and _thread_token() is self._owner \
                and not self.waiting_for:
            self._release_now()
            return True
        return False

    def _release_now(self) -> None:
        self._released = True
        for _, ended, _ in self._tickets:
            ended.detach()
        pending = _pending()
        if self in pending:
            pending.remove(self)
        try:
            self._release()
        except Exception:
            logger.exception("django-rlock: releasing lock %r failed", self.name)


def release_ended() -> int:
    """Release what this thread holds for transactions that have ended; how many were released.

    The finalizer normally does this the moment a transaction ends; this catches a commit
    callback that Django skipped (an earlier one raised) or that was freed on another thread.
    """
    pending = getattr(_local, "pending", None)
    if not pending:
        return 0
    return sum(1 for p in list(pending) if p.settle())


@contextmanager
def hold_until_commit(lock: Any) -> Iterator[Any]:
    """``with hold_until_commit(get_lock(name)):`` is ``with lock:`` whose release waits for
    the transaction: the lock is taken on entry (blocking) and released when the transactions
    open on entry end, or on exit if none was open. A lost lock is logged (WARNING)."""
    lock.lock()

    def release() -> None:
        try:
            lock.unlock()
        except Exception as exc:
            logger.warning("django-rlock: lock %r was lost before its release (%s: %s)",
                           lock.name, type(exc).__name__, exc)

    pending = TransactionRelease(release, lock.name)
    try:
        yield lock
    finally:
        pending.done()
