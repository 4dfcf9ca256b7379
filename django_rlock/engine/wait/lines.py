"""A waiting thread's own line to Redis, so a grant from another process wakes it directly.

The shared subscription (``subscription``) reads every message in one listener thread, which then
wakes the waiting thread: two thread switches per hand-off, and every subscribed process woken
by every grant. A thread that has waited before keeps a subscription of its own, on its own
connection, to ``naming.wake_channel(owner)``; its registrations then carry a token ending in
``naming.DIRECT_TOKEN_MARK``, and a release that grants it the lock publishes the token there
only. The thread sleeps in ``poll`` on that socket and on a pipe (the listener's wake-ups for
everything else: a free release, a foreign client's ``0``, a reconnect), reads the grant itself
and returns holding the lock: no listener, no other process woken, no command sent.

The publish also proves the heir alive: a process that died (SIGKILL) has lost its
subscription, so the release finds no receiver and grants the next in line instead.

One line per thread and server, opened during the thread's first cross-process wait (whose
registration still uses the shared grant channel) and kept for the thread's life; it costs one
connection per thread that ever waited. ``settings.LINES_ENABLED = False`` (the old
``wakeline.ENABLED``) turns it off for new waits; ``settings.MAX_LINES`` caps them (invariant 25).
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import identity, process
from ..naming import wake_channel
from ..watchdog import server_id
from . import settings

logger = logging.getLogger("django_rlock")


# -- per-process state: the calling thread's lines and the open count, reset in a forked child
class _Count:
    __slots__ = ("lock", "open")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0

    def add(self, delta: int) -> None:
        with self.lock:
            self.open += delta


class _Lines:
    __slots__ = ("local", "count")

    def __init__(self) -> None:
        self.local = threading.local()  # .lines: server id -> WakeLine, or a retry time
        self.count = _Count()



def _forked(old: _Lines) -> None:
    # The forking thread's lines are the parent's sockets: never read or shut down here. The
    # lines dropped with the old state count down in the old count, under a new lock (a
    # parent thread may have held its lock at the fork), never in the child's.
    old.count.lock = threading.Lock()


#: This process's lines (none in a forked child).
_state = process.local(_Lines, _forked)


def open_count() -> int:
    """Lines of this process that are open now."""
    return _state().count.open


class WakeLine:
    """The calling thread's subscription connection and the pipe others wake it through."""

    __slots__ = ("conn", "owner", "ident", "_client", "_rfd", "_wfd", "_retry_at",
                 "_finalizer", "__weakref__")

    def __init__(self, client: Any, owner: str) -> None:
        self._client = client
        self.owner = owner
        self.ident = threading.get_ident()  # the one thread that reads and parks on it
        self.conn = _subscribe(client, owner)
        self._retry_at = 0.0
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._finalizer = weakref.finalize(self, _close, self.conn, self._rfd, self._wfd)
        # (Counted in the process that opened it: a line dropped in a forked child leaves the
        # child's count alone.)
        count = _state().count
        count.add(1)
        weakref.finalize(self, count.add, -1)

    @property
    def alive(self) -> bool:
        return self.conn._sock is not None

    def _reopen(self) -> bool:
        """The connection was lost (a server restart, CLIENT KILL): subscribe again. Until we
        do, a grant to us finds no receiver and goes to the next in line."""
        now = time.monotonic()
        if now < self._retry_at:
            return False
        try:
            conn = _subscribe(self._client, self.owner)
        except Exception as exc:
            logger.debug("django-rlock: could not reopen a wake line (%s: %s)",
                         type(exc).__name__, exc)
            self._retry_at = now + 1.0
            return False
        old, self.conn = self.conn, conn
        self._finalizer.detach()
        _close(old, -1, -1)
        self._finalizer = weakref.finalize(self, _close, conn, self._rfd, self._wfd)
        return True

    def poke(self) -> None:
        """Wake the thread if it sleeps in ``park`` (any thread may call this; the thread
        itself, booking a grant it read, needs no poke: it looks at ``pending`` next)."""
        if threading.get_ident() == self.ident:
            return
        try:
            os.write(self._wfd, b"x")
        except OSError:  # the pipe is full (a wake is pending anyway) or closed
            pass

    def _drain(self) -> None:
        """Empty the pipe (poll saw it readable). Only here: a poke's byte left in it (its
        waiter returned without reading it) makes the next park's poll return at once, and
        that park reads it then and sleeps on."""
        try:
            # A short read emptied it: no second read to hear EAGAIN.
            while len(os.read(self._rfd, 512)) == 512:
                pass
        except OSError:  # nothing left (EAGAIN)
            pass

    def park(self, waiter: Any, timeout: float | None,
             deliver: Callable[[bytes], Any]) -> None:
        """Sleep until ``waiter.pending`` is set (by ``poke`` or by a grant read here) or
        ``timeout``. A grant for ``waiter.token`` is handed to ``deliver`` (which books the
        hold and sets ``pending``); grants for earlier tokens of this thread are stale (their
        waits withdrew them) and dropped."""
        end = None if timeout is None else time.monotonic() + timeout
        ready = False  # poll just saw the line readable: read without polling it again
        while True:
            if waiter.pending:
                # The pipe is left as it is (a heir returns with the lock, and a read is a
                # syscall): a poke's byte still there is drained by the next park's poll.
                waiter.pending = False
                return
            if not self.alive and self._reopen():
                return  # a spurious wake: the waiter's next attempt puts it back in line
            sock = self.conn._sock
            if sock is not None:
                try:
                    # (can_read also sees a reply the parser has buffered already.)
                    while ready or self.conn.can_read(timeout=0):
                        ready = False
                        self._message(self.conn.read_response(disconnect_on_error=True,
                                                              push_request=True),
                                      waiter, deliver)
                        if waiter.pending:
                            break  # the grant: anything behind it is read at the next park
                except Exception as exc:
                    self._broken(exc)
                    continue
                if waiter.pending:
                    continue
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            # poll, not select: a busy process may have file descriptors past select's 1024.
            poller = select.poll()
            poller.register(self._rfd, select.POLLIN)
            if sock is None:
                # Lost and not back yet (retried each second): the listener's wake-ups still
                # come through the pipe.
                left = 1.0 if left is None else min(left, 1.0)
            else:
                poller.register(sock, select.POLLIN)
            try:
                events = poller.poll(None if left is None else max(1, math.ceil(left * 1000)))
            except OSError as exc:
                self._broken(exc)
                continue
            for fd, _ in events:
                if fd != self._rfd:
                    ready = True
                elif not waiter.pending:
                    self._drain()

    def _message(self, reply: Any, waiter: Any, deliver: Callable[[bytes], Any]) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind = reply[0]
        if kind in (b"message", "message"):
            token = reply[2]
            if isinstance(token, str):
                token = token.encode()
            if token == waiter.token:
                deliver(token)

    def _broken(self, exc: BaseException) -> None:
        logger.debug("django-rlock: wake line of %s lost (%s: %s)", self.owner,
                     type(exc).__name__, exc)
        try:
            self.conn.disconnect()
        except Exception:
            pass


def _close(conn: Any, rfd: int, wfd: int) -> None:
    try:
        conn.disconnect()
    except Exception:
        pass
    for fd in (rfd, wfd):
        try:
            os.close(fd)
        except OSError:
            pass


def _lines() -> dict[Any, Any]:
    local = _state().local
    lines: dict[Any, Any] | None = getattr(local, "lines", None)
    if lines is None:
        lines = local.lines = {}
    return lines


def _subscribe(client: Any, owner: str) -> Any:
    """A connection of the line's own, outside the pool (like the shared subscription's),
    subscribed to ``owner``'s wake channel once the call returns."""
    pool = client.connection_pool
    kw = dict(pool.connection_kwargs)
    kw["client_name"] = f"rlock-wake:{identity.process_id()}"
    conn = pool.connection_class(**kw)
    try:
        conn.connect()
        conn.send_command("SUBSCRIBE", wake_channel(owner), check_health=False)
        if not conn.can_read(timeout=settings.OPEN_TIMEOUT):
            raise TimeoutError("no SUBSCRIBE confirmation")
        conn.read_response(disconnect_on_error=True, push_request=True)
    except BaseException:
        _close(conn, -1, -1)
        raise
    return conn


def usable(client: Any) -> bool:
    """Lines need a plain pool: a Sentinel pool's master moves, and a line left on the old one
    would make every grant to us look like one to a dead process."""
    pool = getattr(client, "connection_pool", None)
    return (settings.LINES_ENABLED and pool is not None and hasattr(pool, "connection_kwargs")
            and getattr(pool, "service_name", None) is None)


def line_for(client: Any, owner: str) -> WakeLine | None:
    """The calling thread's standing line to ``client``'s server (None: none yet, or lost)."""
    if not usable(client):
        return None
    line = _lines().get(server_id(client))
    # (No read here: this runs before every blocking acquire. A line lost since is found in
    # ``park``, which opens it again and has the waiter register anew.)
    if not isinstance(line, WakeLine) or line.owner != owner or not line.alive:
        return None
    return line


def open_line(client: Any, owner: str) -> WakeLine | None:
    """Open the calling thread's line to ``client``'s server, unless it stands already or a
    recent try failed. Blocks for the connection and the SUBSCRIBE's confirmation: called
    while the thread waits for a lock anyway."""
    if not usable(client):
        return None
    lines = _lines()
    sid = server_id(client)
    old = lines.get(sid)
    if isinstance(old, WakeLine):
        if old.owner == owner and old.alive:  # (stale grants on it are dropped by park)
            return old
        _close(old.conn, -1, -1)  # lost, or the parent's (a fork): its pipe closes with it
    elif isinstance(old, float) and time.monotonic() < old:
        return None
    if _state().count.open >= settings.MAX_LINES:
        return None
    try:
        line = lines[sid] = WakeLine(client, owner)
    except Exception as exc:
        logger.debug("django-rlock: could not open a wake line (%s: %s)", type(exc).__name__, exc)
        lines[sid] = time.monotonic() + settings.RETRY_AFTER
        return None
    return line
