"""The asyncio side's connections: the pool of each asyncio twin, and the check that an idle
connection is still open before a script is written to it (docs/engine.md, invariant 38).

``clients.async_twin`` gives every lock on one sync pool, in one event loop, the same asyncio
client; its pool is a ``TwinPool`` of ``async_cap(pool)`` connections. A call that finds them
all in use waits for one within the budget of the acquire it belongs to (``set_budget``, set by
``AsyncRLock.lock``/``try_lock``), at least ``POOL_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
import weakref
from collections import deque
from contextvars import ContextVar, Token
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

#: redis-py 8's default ``max_connections`` (it was 2**31 before): a twin's size when the sync
#: pool sets none.
DEFAULT_CAP = 100
_HAS_CAN_GET = hasattr(redis.asyncio.ConnectionPool, "can_get_connection")

#: Connections of each asyncio twin's pool (one pool per sync pool and event loop); None: the
#: sync pool's own ``max_connections`` (the cache's ``CONNECTION_POOL_KWARGS``), or redis-py 8's
#: default (100) when that is unbounded. The Django app sets it from
#: ``RLOCK["ASYNC_MAX_CONNECTIONS"]``.
ASYNC_MAX_CONNECTIONS: int | None = None
#: The least time (seconds) a call on an asyncio twin waits for a connection when every one is
#: in use; an acquire whose budget (``try_lock``'s wait) is longer waits that long, ``lock()``
#: as long as it takes. Past it: a ``ConnectionError`` naming the pool's size.
POOL_TIMEOUT = 5.0

#: The deadline (monotonic) of the acquire running in this context: ``None`` for ``lock()``
#: (no end), ``0.0`` outside an acquire (``POOL_TIMEOUT`` applies).
_budget: ContextVar[float | None] = ContextVar("django_rlock_budget", default=0.0)


def set_budget(deadline: float | None) -> Token[float | None]:
    """The acquire in this context ends at ``deadline`` (None: never): a twin pool's checkout
    may wait that long for a connection. Undo with ``reset_budget``."""
    return _budget.set(deadline)


def reset_budget(token: Token[float | None]) -> None:
    _budget.reset(token)


#: ``Task.cancelling()`` when the acquire running in this context began (None: outside one).
_cancels: ContextVar[int | None] = ContextVar("django_rlock_cancels", default=None)


def mark_cancels() -> Token[int | None]:
    """An acquire begins in this task: remember how many cancellations it had, so that one
    that redis-py drops later can be told (``cancel_dropped``). Undo with ``reset_cancels``.

    On Python 3.11, ``asyncio.wait_for`` returns normally when its task is cancelled just as
    the awaited thing finishes; redis-py runs every command's write under it (connecting:
    HELLO, CLIENT SETINFO, SELECT; the replica probe), so a cancellation landing there is
    lost, and the task goes on acquiring (or waiting in line) as if it had not been
    cancelled. The request stays counted in ``Task.cancelling()``."""
    return _cancels.set(cancelling())


def reset_cancels(token: Token[int | None]) -> None:
    _cancels.reset(token)


def cancelling() -> int:
    """``Task.cancelling()`` of the running task (0 outside one)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def cancel_dropped(since: int | None = None) -> bool:
    """The running task was cancelled after the acquire began (or after ``since``, a
    ``cancelling()``) and no ``CancelledError`` reached our code: the caller raises one."""
    base = _cancels.get() if since is None else since
    return base is not None and cancelling() > base


def connection_wait() -> float | None:
    """How long a checkout in this context may wait for a connection (None: without end)."""
    deadline = _budget.get()
    if deadline is None:
        return None
    return max(POOL_TIMEOUT, deadline - time.monotonic())


class TwinPool(redis.asyncio.ConnectionPool):
    """The asyncio twin's pool: at most ``max_connections`` connections; a checkout with all
    of them in use waits for one, in arrival order, for ``connection_wait()`` at most, instead
    of raising redis-py's ``MaxConnectionsError`` (which failed async views under load).

    redis-py's ``BlockingConnectionPool`` does the same through a condition taken on every
    checkout and release (about twice the cost of a plain checkout on the bench host); here a
    checkout that finds a connection free pays one check, and only a full pool queues: each
    release hands its connection to the oldest waiter (``_promised`` until it has it, so that
    no newcomer takes it first)."""

    def __init__(self, max_connections: int, **kwargs: Any) -> None:
        super().__init__(max_connections=max_connections, **kwargs)
        self._queue: deque[asyncio.Future[None]] = deque()
        self._promised = 0
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()

    def make_connection(self) -> Any:
        conn = super().make_connection()
        self._made.add(conn)
        return conn

    def abandon(self) -> None:
        """Its event loop is closed (Django runs each async view of a WSGI server in a loop
        of its own): nothing can be awaited on its connections any more, so their sockets are
        shut down here, and the server closes them at once, instead of each request leaving a
        connection open until the garbage collector finds the loop."""
        for conn in list(self._made):
            writer = getattr(conn, "_writer", None)
            sock = None if writer is None else writer.transport.get_extra_info("socket")
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _free(self) -> bool:
        if _HAS_CAN_GET:
            return bool(self.can_get_connection())
        return bool(self._available_connections  # redis-py 5: no can_get_connection
                    or len(self._in_use_connections) < self.max_connections)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        while True:
            if self._queue or self._promised or not self._free():
                await self._turn()
            try:
                return await super().get_connection()
            except redis.exceptions.MaxConnectionsError:
                continue  # (not expected: its connection was promised) queue again

    async def _turn(self) -> None:
        """Wait in line until a release hands this task a connection (or the wait is over)."""
        wait = connection_wait()
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        if not self._promised and self._free():
            self._wake()  # room, and nobody promised it: the head of the line takes it
        try:
            async with asyncio.timeout(wait):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._promised -= 1  # handed a connection, but gone: pass it on
                self._wake()
            else:
                try:
                    self._queue.remove(fut)
                except ValueError:
                    pass
            if isinstance(exc, TimeoutError):  # asyncio's (the builtin), not redis-py's
                raise redis.exceptions.ConnectionError(
                    f"django-rlock: no connection of the asyncio pool came free within "
                    f"{wait:g} s (all {self.max_connections} in use); raise "
                    f"RLOCK['ASYNC_MAX_CONNECTIONS'] or the cache's CONNECTION_POOL_KWARGS "
                    f"max_connections") from exc
            raise
        self._promised -= 1

    def _wake(self) -> None:
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)
                self._promised += 1
                return

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        if self._queue:
            self._wake()


def async_cap(pool: Any) -> int:
    """``max_connections`` of the asyncio twin of ``pool``."""
    if ASYNC_MAX_CONNECTIONS is not None:
        return ASYNC_MAX_CONNECTIONS
    cap = getattr(pool, "max_connections", None)
    if isinstance(cap, int) and 0 < cap < 2**31:
        return cap
    return DEFAULT_CAP


def closed_while_idle(conn: Any) -> bool:
    """An idle, connected asyncio connection whose socket has input the event loop has not
    read yet: an EOF (the server restarted or closed it: ``timeout``, ``CLIENT KILL``) or bytes
    nobody asked for. Either way it must not be written to.

    redis-py's checkout only looks at what the loop has already read, which misses an EOF that
    arrived while the loop was busy; a sync checkout polls the socket itself, and so does this
    (one ``poll``, no round trip).
    """
    writer = getattr(conn, "_writer", None)
    if writer is None:
        return False  # not connected: it connects before the first write
    transport = writer.transport
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    try:
        fd = sock.fileno() if sock is not None else -1
    except OSError:
        return True
    if fd < 0:
        return sock is not None
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def packed(conn: Any, args: tuple[Any, ...]) -> list[bytes]:
    """``args`` as one RESP command, byte for byte what ``conn.pack_command(*args)`` gives.

    redis-py's packer costs ~11 us for an acquire's 13 arguments on the bench host (a call of
    its encoder per argument, a check for commands of two words, buffers split for large
    values); a lock script's arguments are ``str``, ``int`` and ``bytes``, encoded here
    inline with the connection's encoding (~4 us). Anything else goes through its encoder
    (which rejects ``bool``, formats ``float``)."""
    encoder = conn.encoder
    encoding, errors = encoder.encoding, encoder.encoding_errors
    out = [b"*%d\r\n" % len(args)]
    add = out.append
    for a in args:
        t = type(a)
        if t is str:
            b = a.encode(encoding, errors)
        elif t is int:
            b = b"%d" % a
        elif t is bytes:
            b = a
        else:
            b = encoder.encode(a)
        add(b"$%d\r\n%b\r\n" % (len(b), b))  # one piece per argument (a few bytes each)
    return out


def written(conn: Any, command: list[bytes]) -> bool:
    """Write ``command`` (``packed``) to ``conn`` from the calling task; False (nothing written) if this
    connection cannot be written to that way (not connected, or a redis-py without a stream
    writer), and the caller sends through redis-py instead.

    redis-py's ``send_packed_command`` runs the write in ``asyncio.wait_for`` whenever the
    connection has a ``socket_timeout`` (redis-py 8's default is 5 s): a task of its own per
    command on Python 3.11, about a fifth of a bare ``EVALSHA``'s time on the bench host. A
    script of ours fits in the socket's buffer, so the write is done when ``writelines``
    returns; only what the kernel did not take (``drained`` waits for it) needs the timeout.
    """
    writer = getattr(conn, "_writer", None)
    if writer is None or writer.transport is None or writer.transport.is_closing():
        return False
    writer.writelines(command)
    return True


async def drained(conn: Any) -> None:
    """Wait, within the connection's ``socket_timeout``, for what the kernel has not taken yet
    of a ``written`` command (usually nothing: no await at all). A timeout or a lost
    connection disconnects it (the command may be half sent) and raises redis-py's errors."""
    writer = conn._writer
    if not writer.transport.get_write_buffer_size():
        return
    try:
        async with asyncio.timeout(conn.socket_timeout):
            await writer.drain()
    except TimeoutError as exc:
        await conn.disconnect(nowait=True)
        raise redis.exceptions.TimeoutError("Timeout writing to socket") from exc
    except OSError as exc:
        await conn.disconnect(nowait=True)
        raise redis.exceptions.ConnectionError(f"Error while writing to socket: {exc}") from exc


# -- the connection an event loop keeps for lock scripts --------------------------------------
#: Acquire and release scripts of ``AsyncRLock`` go out on one connection the pool lends for
#: good (``Kept``), while no other task of the loop is using it, instead of a checkout and a
#: release per script (redis-py's take a lock, record observability counters and look for
#: unread input under ``asyncio.timeout(0)``: about 8 us a script on the bench host). Only on
#: a plain ``redis.asyncio.ConnectionPool`` or a ``TwinPool`` of redis-py's default size
#: (100) or more: the kept connection is one of the pool's, counted against its cap and
#: closed by ``aclose()``, and a smaller cap is the user's limit. False: every script checks
#: a connection out.
KEEP_CONNECTION = True
_KEPT_ATTR = "_django_rlock_kept"


class Kept:
    """One pool's connection kept for lock scripts, and whether a task is using it (a second
    task goes through the pool meanwhile: tasks interleave on one thread)."""

    __slots__ = ("busy", "conn", "loop")

    def __init__(self) -> None:
        self.conn: Any = None
        self.loop: Any = None
        self.busy = False

    async def take(self, pool: Any) -> Any:
        """The kept connection, connected (nothing is sent; an error is raised as is)."""
        self.busy = True
        try:
            loop = asyncio.get_running_loop()
            if self.conn is None or self.loop is not loop:
                old, self.conn = self.conn, None
                if old is not None:  # (the pool's other connections are of that loop too)
                    await pool.release(old)
                self.conn = await pool.get_connection()
                self.loop = loop
            elif not self.conn.is_connected:
                await self.conn.connect()
            return self.conn
        except BaseException:
            self.busy = False
            raise

    async def release(self, conn: Any) -> None:
        """Done with it (kept, not given back to the pool)."""
        self.busy = False


def kept(pool: Any) -> Kept | None:
    """The connection ``pool`` keeps for lock scripts, if free; None: check one out."""
    k = getattr(pool, _KEPT_ATTR, None)
    if k is None:
        ok = (type(pool) in (redis.asyncio.ConnectionPool, TwinPool)
              and getattr(pool, "max_connections", 0) >= DEFAULT_CAP
              and getattr(pool, "cache", None) is None)
        k = Kept() if ok else False
        try:
            setattr(pool, _KEPT_ATTR, k)
        except AttributeError:
            return None
    if not k or k.busy or not KEEP_CONNECTION:
        return None
    return k
