"""An event loop's own reader of this process's grant channels on one server (invariant 44).

A grant to an asyncio waiter (a token ending in ``PROCESS_TOKEN_MARK``) is published on the
process's own channel for the lock, ``<grant channel>@<process uuid>``. Read by the listener
thread, each grant cost a thread wake-up, the thread's parse and a hop into the waiter's loop
(``call_soon_threadsafe``: the self-pipe and one more wake-up): about a fifth of the client
CPU of a contended asyncio acquisition (4 processes x 16 tasks, ``bench/aiolocks.py``). Here
the loop reads those channels itself, on a connection of its own: one socket callback parses
the message and books the grant, and the waiter's task runs in the same turn of the loop.

One reader per (server, event loop) in use, made on the first contended asyncio wait there.
It carries the process grant channels only; the lock and grant channels stay on the process's
one subscription (whose ``PUBSUB NUMSUB`` the release scripts compare, invariant 21), which no
longer subscribes the process channels when readers serve them. A plain client only (TCP or
unix socket, password or ACL user); any other (TLS, Sentinel, a credential provider) keeps the
listener thread's way. A reader whose loop is closed is shut by the listener thread's
housekeeping, so a release then finds nobody on its channels and skips its waiters.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import redis

from . import settings

logger = logging.getLogger("django_rlock")

#: The connection classes a reader can stand in for (exact classes: a subclass may connect
#: some other way).
_PLAIN = (redis.connection.Connection, redis.connection.UnixDomainSocketConnection)


def supported(client: Any) -> bool:
    """Whether a reader can connect the way ``client``'s connections do."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return False
    kw = pool.connection_kwargs
    return pool.connection_class in _PLAIN and kw.get("credential_provider") is None


def _command(*args: bytes | str) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Error(Exception):
    """An error reply (the handshake failed)."""


def parse(buf: bytearray) -> tuple[list[Any], int]:
    """The complete RESP2 replies at the start of ``buf`` and how many bytes they took."""
    out: list[Any] = []
    pos = 0
    while True:
        r = _one(buf, pos)
        if r is None:
            return out, pos
        reply, pos = r
        out.append(reply)


def _one(buf: bytearray, pos: int) -> tuple[Any, int] | None:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return None
    kind, line = buf[pos:pos + 1], bytes(buf[pos + 1:end])
    pos = end + 2
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            return None
        return bytes(buf[pos:pos + n]), pos + n + 2
    if kind == b"*":
        items = []
        for _ in range(max(0, int(line))):
            r = _one(buf, pos)
            if r is None:
                return None
            item, pos = r
            items.append(item)
        return items, pos
    if kind == b":":
        return int(line), pos
    if kind == b"-":
        return _Error(line.decode(errors="replace")), pos
    return line, pos  # "+OK", "+PONG"


class Reader(asyncio.Protocol):
    """One loop's connection to the process grant channels of one server."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop,
                 deliver: Callable[[bytes, bytes], Any], name: str,
                 lost: Callable[[set[bytes]], Any], live: Callable[[bytes], bool]) -> None:
        self.loop = loop
        self._kwargs = client.connection_pool.connection_kwargs
        self._deliver = deliver  # (process channel, token): a grant read
        self._name = name        # its CLIENT SETNAME
        self._lost_cb = lost     # (names): messages to them may have been missed
        self._live = live        # a name still wanted (its lock channel is subscribed)
        self._wanted: set[bytes] = set()
        self._confirmed: set[bytes] = set()
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self._connecting = False
        self._closed = False
        self._backoff = 0.05
        self._last_io = 0.0
        self._ping_at = 0.0
        self._tick: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None  # (a task is only weakly kept by its loop)
        #: Connections made so far (read by tests).
        self.connects = 0

    # -- what a waiter asks (on the loop) ----------------------------------------------------
    def heard(self, name: bytes) -> bool:
        """A grant published now on ``name`` would reach this loop; if not, ask for it."""
        if name in self._confirmed:
            return True
        if name not in self._wanted:
            self._wanted.add(name)
            if self._transport is not None:
                self._send(_command("SUBSCRIBE", name))
        if self._transport is None and not self._connecting and not self._closed:
            self._start()
        return False

    def _start(self) -> None:
        self._connecting = True
        self._task = self.loop.create_task(self._connect())

    # -- the connection ----------------------------------------------------------------------
    async def _connect(self) -> None:
        kw = self._kwargs
        try:
            async with asyncio.timeout(kw.get("socket_connect_timeout") or settings.OPEN_TIMEOUT):
                if "path" in kw:
                    family, address = socket.AF_UNIX, kw["path"]
                else:
                    family, _, _, _, address = (await self.loop.getaddrinfo(
                        kw.get("host", "localhost"), kw.get("port", 6379),
                        type=socket.SOCK_STREAM))[0]
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setblocking(False)
                try:
                    await self.loop.sock_connect(sock, address)
                    self.sock = sock  # ours to close, even once its loop is closed (``shut``)
                    if family == socket.AF_UNIX:
                        await self.loop.create_unix_connection(lambda: self, sock=sock)
                    else:
                        await self.loop.create_connection(lambda: self, sock=sock)
                except BaseException:
                    sock.close()
                    raise
        except Exception as exc:
            self._connecting = False
            logger.debug("django-rlock: asyncio grant reader could not connect (%s)", exc)
            self._retry()
            return

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._connecting = False
        self.connects += 1
        kw = self._kwargs
        out = []
        if kw.get("password"):
            user = kw.get("username")
            out.append(_command("AUTH", *((user,) if user else ()), kw["password"]))
        out.append(_command("CLIENT", "SETNAME", self._name))
        if self._wanted:
            out.append(_command("SUBSCRIBE", *self._wanted))
        self._send(b"".join(out))
        if self._tick is None:
            self._tick = self.loop.call_later(settings.HOUSEKEEPING, self._housekeeping)

    def _send(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)
        self._last_io = time.monotonic()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        replies, used = parse(buf)
        del buf[:used]
        self._last_io = time.monotonic()
        self._ping_at = 0.0
        for reply in replies:
            if isinstance(reply, list) and len(reply) >= 2:
                kind = reply[0]
                if kind == b"message" and len(reply) > 2:
                    self._deliver(reply[1], reply[2])
                elif kind == b"subscribe":
                    if reply[1] in self._wanted:
                        self._confirmed.add(reply[1])
                elif kind == b"unsubscribe":
                    self._confirmed.discard(reply[1])
            elif isinstance(reply, _Error):
                logger.warning("django-rlock: asyncio grant reader refused (%s); grants to "
                               "asyncio waiters go through the shared grant channel", reply)
                self.shut()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        missed = set(self._confirmed)
        self._confirmed.clear()
        self._buf.clear()
        if missed:
            # A grant published while we were away reached nobody, and its waiter was skipped:
            # its waiters attempt again now (invariant 4).
            self._lost_cb(missed)
        if not self._closed:
            self._retry()

    def _retry(self) -> None:
        if self._closed or self.loop.is_closed():
            return
        delay, self._backoff = self._backoff, min(self._backoff * 2, 2.0)

        def again() -> None:
            if self._wanted and self._transport is None and not self._connecting \
                    and not self._closed:
                self._start()
        self.loop.call_later(delay, again)

    def _housekeeping(self) -> None:
        self._tick = None
        if self._closed or self._transport is None:
            return
        self._backoff = 0.05
        now = time.monotonic()
        gone = [n for n in self._wanted if not self._live(n)]
        if gone:  # their lock channels lingered out: so do they
            self._wanted.difference_update(gone)
            self._confirmed.difference_update(gone)
            self._send(_command("UNSUBSCRIBE", *gone))
        if self._ping_at and now - self._ping_at >= settings.PONG_TIMEOUT:
            self._transport.abort()  # half-open: connection_lost reconnects
            return
        if self._wanted and not self._ping_at and now - self._last_io >= settings.PING_AFTER:
            self._send(_command("PING"))
            self._ping_at = now
        if self._wanted or self._confirmed:
            self._tick = self.loop.call_later(settings.HOUSEKEEPING, self._housekeeping)
        else:
            self._transport.close()  # nothing to read: connected again when a waiter asks

    def shut(self) -> None:
        """For good (its loop is closed, or the server refused it): nothing is heard here."""
        self._closed = True
        self._confirmed.clear()
        if self._transport is not None and not self.loop.is_closed():
            self._transport.abort()
        elif self.sock is not None:
            try:
                self.sock.close()  # (its loop is closed: the socket alone)
            except OSError:
                pass
