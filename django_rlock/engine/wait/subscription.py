"""The process's one subscription connection to a server, and its listener thread.

One connection per (server, database) per process (per node on a cluster), outside the pool,
named ``rlock-pubsub:<process>:<db>``. It (S)SUBSCRIBEs each lock channel with its grant
channel in one command (invariant 21), reads every message in one listener thread and hands
it to the channel's waiters (``Channel.heard``) or to the hand-off bookkeeping (a grant). After
a reconnect every waiter is woken, since messages may have been missed (invariant 4); no waiter
relies on a message alone, since each park is bounded. Once a second the listener does its
housekeeping: overdue hand-offs (invariant 12), lingering unsubscribes (``LINGER``), a PING on a
quiet line, and following a Sentinel pool's new master.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from redis.crc import key_slot

from .. import identity
from ..clients import sharded
from . import settings
from .channel import Channel, Channels
from .handoff import HandOffs
from .waiter import hold_wakes, send_held_wakes

logger = logging.getLogger("django_rlock")

_SHARDED_KINDS = {b"smessage": b"message", b"ssubscribe": b"subscribe",
                  b"sunsubscribe": b"unsubscribe"}


def _as_is(message: Any) -> Any:
    return message


def subscriber_name(db: Any = 0) -> str:
    """The CLIENT SETNAME of this process's subscription connection for database ``db``."""
    return f"rlock-pubsub:{identity.process_id()}:{db}"


class Subscription:
    """The subscription connection to one server and its listener thread."""

    def __init__(self, client: Any, channels: Channels, handoffs: HandOffs) -> None:
        self._client = client
        self._channels = channels
        self._handoffs = handoffs
        #: Sharded pub/sub (a Redis 7+ or Valkey cluster node: ``clients.sharded``): the scripts
        #: SPUBLISH, so channels are SSUBSCRIBEd, one slot per command (invariant 29).
        self._sharded = sharded(client)
        #: Our process's part of a process grant channel's name (invariant 44).
        self._process = identity.process_id().encode()
        self._sub = "SSUBSCRIBE" if self._sharded else "SUBSCRIBE"
        self._unsub = "SUNSUBSCRIBE" if self._sharded else "UNSUBSCRIBE"
        self._conn: Any = None
        #: The connection is up and every channel's SUBSCRIBE has been sent on it.
        self.connected = False
        self._sent: dict[bytes, int] = {}
        self._acked: dict[bytes, int] = {}
        self._thread: threading.Thread | None = None
        self._last_io = time.monotonic()
        self._ping_at = 0.0  # when a PING went out that no reply has followed yet
        #: Reconnections so far (read by tests).
        self.reconnects = 0

    def abandon(self) -> None:
        """In a forked child: the connection is the parent's. Close the child's copy of its
        socket (redis-py shuts a socket down only in the process that made it), so the
        subscription does not outlive its process in the child (invariants 25, 44)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()

    def heard(self, ch: Channel) -> bool:
        """A message on ``ch`` published now would reach us."""
        return self.connected and ch.confirmed.is_set()

    def add(self, ch: Channel, grant: bytes | None) -> None:
        """Under the lock: a waiter joined ``ch`` (``grant``: its grant channel, if it can be
        granted the lock by any process): subscribe what is not yet, start the listener."""
        if grant is not None and ch.grant is None:
            ch.grant = grant
            ch.direct = grant + b"@" + self._process
            self._channels.by_grant[grant] = ch
            self._channels.by_grant[ch.direct] = ch
            if ch.want:
                self._subscribe_grant(ch)
        if ch.want == 0 or not self.connected:
            self._subscribe(ch)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="django-rlock-pubsub",
                                            daemon=True)
            self._thread.start()

    # -- (S)SUBSCRIBE bookkeeping, under the lock ---------------------------------------------
    def _subscribe(self, ch: Channel) -> None:
        if not self.connected:
            return  # the listener subscribes every channel when it (re)connects
        # One SUBSCRIBE for the channel and its grant channel: a release script's NUMSUB
        # then never sees one of ours on the first but not yet on the second (a "foreign"
        # waiter, which makes it free the lock instead of granting it, invariant 21).
        names = (ch.name,) if ch.grant is None else (ch.name, ch.grant, ch.direct)
        try:
            self._conn.send_command(self._sub, *names, check_health=False)  # one slot
        except Exception:
            self._lost()
            return
        n = self._sent[ch.name] = self._sent.get(ch.name, 0) + 1
        ch.want = n
        if ch.grant is not None:
            self._sent_grant(ch)
        self._last_io = time.monotonic()

    def _sent_grant(self, ch: Channel) -> None:
        assert ch.grant is not None and ch.direct is not None
        ch.grant_want = self._sent[ch.grant] = self._sent.get(ch.grant, 0) + 1
        ch.direct_want = self._sent[ch.direct] = self._sent.get(ch.direct, 0) + 1

    def _subscribe_grant(self, ch: Channel) -> None:
        """The channel is subscribed already (a waiter of a kind without hand-off came first):
        add its grant channel; waiters joining from now on wait for that confirmation too."""
        assert ch.grant is not None
        if not self.connected:
            return
        try:
            self._conn.send_command(self._sub, ch.grant, ch.direct, check_health=False)
        except Exception:
            self._lost()
            return
        self._sent_grant(ch)
        ch.confirmed.clear()
        self._last_io = time.monotonic()

    def _lost(self) -> None:
        self.connected = False
        self._conn.disconnect()

    def _send(self, command: str, names: list[bytes]) -> None:
        """(UN)SUBSCRIBE ``names``: one command, or one per slot for sharded channels (a
        sharded command may only name channels of one slot)."""
        if not self._sharded:
            self._conn.send_command(command, *names, check_health=False)
            return
        by_slot: dict[int, list[bytes]] = {}
        for name in names:
            by_slot.setdefault(key_slot(name), []).append(name)
        for group in by_slot.values():
            self._conn.send_command(command, *group, check_health=False)

    # -- the listener thread -------------------------------------------------------------
    def _connect(self) -> None:
        # A connection of our own, outside the pool: pool.disconnect() (client.close(),
        # DJANGO_REDIS_CLOSE_CONNECTION) must not cut every waiter's subscription. Named, so
        # CLIENT LIST shows whose it is. Connected outside the lock: a dead network may block
        # here, and every lock and unlock of the process takes that lock.
        pool = self._client.connection_pool
        db = pool.connection_kwargs.get("db", 0)
        conn = pool.connection_class(**{**pool.connection_kwargs, "client_name": subscriber_name(db)})
        conn.connect()
        # redis-py's RESP3 parser hands each message to a handler that formats it for a DEBUG
        # log line, wanted or not (``str`` of the message and a ``getLogger`` per message, a
        # grant's every time): ours passes it on as is.
        set_handler = getattr(getattr(conn, "_parser", None), "set_pubsub_push_handler", None)
        if set_handler is not None:
            set_handler(_as_is)
        with self._channels.lock:
            old, self._conn = self._conn, conn
            first = old is None
            if old is not None:
                try:
                    old.disconnect()
                except Exception:
                    pass
            self._sent.clear()
            self._acked.clear()
            names = []
            for ch in self._channels.by_name.values():
                ch.confirmed.clear()
                ch.want = 1
                ch.echoes = 0
                names.append(ch.name)
                if ch.grant is not None and ch.direct is not None:
                    ch.grant_want = ch.direct_want = 1
                    names += (ch.grant, ch.direct)
            if names:
                self._send(self._sub, names)
                for name in names:
                    self._sent[name] = 1
            self.connected = True
            self._last_io = time.monotonic()
            if not first:
                # Messages may have been missed while we were away: everyone re-checks
                # (invariant 4).
                for ch in self._channels.by_name.values():
                    ch.wake_all()

    def _run(self) -> None:
        backoff = 0.05
        next_housekeeping = time.monotonic() + settings.HOUSEKEEPING
        while True:
            try:
                if not self.connected:
                    if self._conn is not None:
                        self.reconnects += 1
                    self._connect()
                timeout = settings.HOUSEKEEPING
                watch = self._handoffs.next_watch
                if watch:
                    timeout = max(0.0, min(timeout, watch - time.monotonic()))
                if self._conn.can_read(timeout=timeout):
                    reply = self._conn.read_response(disconnect_on_error=True, push_request=True)
                    hold_wakes()  # written once the lock is released (``waiter.hold_wakes``)
                    try:
                        self._dispatch(reply)
                    finally:
                        send_held_wakes()
                now = time.monotonic()
                watch = self._handoffs.next_watch
                if watch and now >= watch:
                    self._handoffs.watch(now)
                if now >= next_housekeeping:
                    next_housekeeping = now + settings.HOUSEKEEPING
                    self._housekeeping(now)
                backoff = 0.05
            except Exception as exc:
                if self.connected:
                    logger.warning("django-rlock: pub/sub connection lost (%s: %s); waiters fall "
                                   "back to the holder's TTL until it is back",
                                   type(exc).__name__, exc)
                self.connected = False
                try:
                    if self._conn is not None:
                        self._conn.disconnect()
                except Exception:
                    pass
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _dispatch(self, reply: Any) -> None:
        self._last_io = time.monotonic()
        self._ping_at = 0.0
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind = reply[0]
        if isinstance(kind, str):
            kind = kind.encode()
        if self._sharded:  # smessage, ssubscribe, sunsubscribe: handled as their classic kin
            kind = _SHARDED_KINDS.get(kind, kind)
        name = reply[1]
        if isinstance(name, str):
            name = name.encode()
        grant: tuple[bytes, Any] | None = None
        channels = self._channels
        with channels.lock:
            if kind == b"message":
                ch = channels.by_name.get(name)
                if ch is not None:
                    ch.heard(reply[2] if len(reply) > 2 else b"0")
                else:
                    ch = channels.by_grant.get(name)
                    if ch is not None and len(reply) > 2:
                        grant = (ch.name, reply[2])
            elif kind == b"subscribe":
                self._acked[name] = self._acked.get(name, 0) + 1
                ch = channels.by_name.get(name) or channels.by_grant.get(name)
                if ch is not None and self._acked.get(ch.name, 0) >= ch.want and (
                        ch.grant is None or ch.direct is None
                        or (self._acked.get(ch.grant, 0) >= ch.grant_want
                            and self._acked.get(ch.direct, 0) >= ch.direct_want)):
                    ch.set_confirmed()
            elif (kind == b"unsubscribe" and name not in channels.by_name
                  and name not in channels.by_grant
                  and self._acked.get(name, 0) >= self._sent.get(name, 0)):
                self._acked.pop(name, None)
                self._sent.pop(name, None)
            elif kind == b"unsubscribe" and self._sharded and name in channels.by_name:
                # The server dropped a channel we still want: its slot moved to another node.
                # The waiters attempt again (their lock follows the slot) and meanwhile sleep
                # no longer than their bound (invariant 28).
                ch = channels.by_name[name]
                ch.confirmed.clear()
                ch.wake_all()
        if grant is not None:
            self._handoffs.granted(*grant)

    def _housekeeping(self, now: float) -> None:
        with self._channels.lock:
            self._handoffs.detach_overdue(now)
            if not self.connected:
                return
            # A Sentinel pool that found a new master (a switchover leaves the old one up, and
            # our subscription on it, until Sentinel demotes it): follow it.
            try:  # (asks the sentinels: once a second per subscription)
                address = getattr(self._client.connection_pool, "master_address", None)
            except Exception:  # no sentinel answers: keep what we have
                address = None
            if address is not None and (getattr(self._conn, "host", None),
                                        getattr(self._conn, "port", None)) != tuple(address):
                self._lost()
                return
            if self._ping_at and now - self._ping_at >= settings.PONG_TIMEOUT:
                # A half-open connection (NAT or firewall dropped it) reads nothing forever.
                logger.warning("django-rlock: pub/sub connection silent after PING; reconnecting")
                self._ping_at = 0.0
                self._lost()
                return
            self._handoffs.prune_early(now)
            by_name = self._channels.by_name
            idle = [ch for ch in by_name.values()
                    if ch.refs == 0 and now - ch.idle_since >= settings.LINGER]
            names = []
            for ch in idle:
                del by_name[ch.name]
                names.append(ch.name)
                if ch.grant is not None and ch.direct is not None:
                    self._channels.by_grant.pop(ch.grant, None)
                    self._channels.by_grant.pop(ch.direct, None)
                    names += (ch.grant, ch.direct)
            try:
                if idle:
                    self._send(self._unsub, names)
                    self._last_io = now
                elif by_name and not self._ping_at and now - self._last_io >= settings.PING_AFTER:
                    self._conn.send_command("PING", check_health=False)
                    self._ping_at = now
            except Exception:
                self._lost()
