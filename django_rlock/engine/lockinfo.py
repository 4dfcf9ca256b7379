"""What listing reads a lock as: ``Holder`` (one hash field) and ``LockInfo`` (one live lock),
and the parsing of Redis replies into them.

The kind's own part (its details and their summary) comes from the kind registry
(``kinds``), so this module names no kind.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .identity import NAME_CODES
from .kinds import get
from .naming import LEASE_MARK

#: Redisson's score of a permit that never expires (Long.MAX_VALUE / 10000).
NEVER_MS = 922337203685477

_FIELD = re.compile(r"(.+):(\d+)", re.DOTALL)
_WRITER = re.compile(r"(.+):(\d+):write", re.DOTALL)
_COUNT = re.compile(r"\d+")
_INTEGER = re.compile(r"-?\d+")


def text(value: Any) -> str | None:
    """Replies are bytes, or str with ``decode_responses=True``; None if not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def number(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    t = text(value)
    return int(t) if t is not None and _INTEGER.fullmatch(t) else None



@dataclass(frozen=True)
class Holder:
    """One hash field: who holds the lock, how many times (reentrancy), and, when this
    package took it, where and since when (None for a holder another Redisson client wrote).

    ``thread_id`` is the owner's number in the field (a per-process serial for this package);
    ``os_thread_id`` the OS thread it ran on; ``thread`` the thread or asyncio task name.
    ``write`` marks a read-write lock's writer (its field is ``<owner>:write``).
    """

    client_id: str
    thread_id: int
    hold_count: int
    host: str | None = None
    pid: int | None = None
    process: str | None = None
    thread: str | None = None
    held_for: float | None = None
    os_thread_id: int | None = None
    write: bool = False

    @property
    def owner(self) -> str:
        return f"{self.client_id}:{self.thread_id}"

    @property
    def field(self) -> str:
        """The hash field as Redis has it (the writer's carries ``:write``)."""
        return self.owner + (":write" if self.write else "")

    def as_dict(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "thread_id": self.thread_id,
                "hold_count": self.hold_count, "host": self.host, "pid": self.pid,
                "process": self.process, "thread": self.thread, "held_for": self.held_for}

    def describe(self) -> str:
        """One line for logs: ``<field> (runserver pid 12 on web-1, thread Thread-3, 2.5 s)``."""
        owner = self.field
        held = "" if self.held_for is None else f", held {self.held_for:.1f} s"
        if self.pid is None:  # no entry (another client); or its process record is gone
            return owner if self.thread is None else (
                f"{owner} (process unknown, thread {self.thread}{held})")
        return (f"{owner} ({self.process} pid {self.pid} on {self.host}, thread {self.thread}"
                f"{held})")


@dataclass(frozen=True)
class LockInfo:
    """A live lock (or semaphore, latch) as read from Redis.

    ``ttl`` is in seconds, ``inf`` when the key has no expiry. ``fields`` is the raw hash
    (empty for the string kinds, whose raw value is ``value``). ``details`` holds what the kind
    adds (see ``Locks``): permits, count, mode, readers and writer, queue, token.
    """

    name: str
    key: str
    ttl: float
    holders: tuple[Holder, ...]
    fields: dict[str, str] = field(repr=False)
    kind: str = "lock"
    details: dict[str, Any] = field(default_factory=dict)
    value: str | None = None
    #: Who waits for it, longest first (``waiters.Waiter``).
    waiters: tuple[Any, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``ttl`` is null for a key without expiry; the kind's details flat."""
        return {
            "name": self.name,
            "key": self.key,
            "ttl": None if self.ttl == float("inf") else self.ttl,
            "holders": [h.as_dict() for h in self.holders],
            "kind": self.kind,
            **self.details,
            "waiters": [w.as_dict() for w in self.waiters],
        }

    def summary(self) -> str:
        """The kind's details in a few words ("" for a plain lock)."""
        kind = get(self.kind)
        return "" if kind is None or kind.summary is None else kind.summary(self.details)


def lease_text(seconds: float | None) -> str:
    """A lease left, for a person: ``"1.250s"``, or ``"no expiry"``."""
    return "no expiry" if seconds is None else f"{seconds:.3f}s"


#: Separates the parts of an index entry (format 2); never inside a part (``identity``).
SEP = "\x1f"
#: Separates the parts of a format 3 entry (``identity.SEP3``).
SEP3 = "\x1e"
_HEX = frozenset("0123456789abcdef")
_BASE36 = frozenset("0123456789abcdefghijklmnopqrstuvwxyz")


def parse_entry(raw: Any) -> tuple[float, dict[str, Any]] | None:
    """An index value as (since, in seconds since the epoch; what it says about the holder).

    Three formats are read (entries of processes of the previous releases stay listed during
    a deploy):

    - format 3: ``<ms hex> <owner> <thread> <os thread id, base 36>``, each space being ``SEP3``
      (``\x1e``), with ``SEP3<kind>`` for a kind other than RLock's (``identity.thread_info``);
      the thread name coded by ``identity.NAME_CODES``. The process (pid, label, host) is not
      in it but in its process record (``records``), joined by the reader: the info has
      ``"record": True`` and no ``pid``. Restamped by a release of the previous release (a
      hand-off), it has that release's ``<s>.<ms> `` in front, which is then its since;
    - format 2: ``<ms> <owner> <thread> <os thread id> <pid> <process> <host>``, each space
      being ``SEP`` (the unit separator), with ``SEP<kind>`` for a kind other than RLock's,
      and after it any parts of the kind's own (``more``: a task mark's state and task name,
      ``taskmark.entry``); ``<owner>`` is the holder's field with its uuid cut to 8
      characters (``identity.short_owner``). Written by the previous release, and still by
      a leader and a task mark (``identity.thread_info_inline``). Written by a release of
      an older release (a hand-off), it has that release's ``<s>.<us> `` in front;
    - format 1: ``<s>.<us> <json>`` (``owner``, ``host``, ``pid``, ``process``, ``thread``,
      ``os_thread_id``, ``kind`` members), which the kinds without a holder still write.
    """
    t = text(raw)
    if not t:
        return None
    if SEP in t:
        parts = t.split(SEP)
        old, _, ms = parts[0].rpartition(" ")
        if len(parts) < 7 or _digits(ms) is None:
            return None
        info: dict[str, Any] = {"owner_short": parts[1], "thread": parts[2],
                                "os_thread_id": _digits(parts[3]), "pid": _digits(parts[4]),
                                "process": parts[5], "host": parts[6]}
        return _tail(old, int(ms), parts, 7, info)
    if SEP3 in t:
        parts = t.split(SEP3)
        old, _, ms = parts[0].rpartition(" ")
        if len(parts) < 4 or not (old or ms) or _hex(ms or "0") is None:
            return None
        info = {"owner_short": parts[1], "thread": decoded_name(parts[2]),
                "os_thread_id": _base36(parts[3]), "record": True}
        return _tail(old, _hex(ms or "0") or 0, parts, 4, info)
    since, _, blob = t.partition(" ")
    try:
        about = json.loads(blob)
        at = float(since)
    except (ValueError, TypeError):
        return None
    return (at, about) if isinstance(about, dict) else None


def _tail(old: str, ms: int, parts: list[str], n: int, info: dict[str, Any]
          ) -> tuple[float, dict[str, Any]] | None:
    """An entry's kind and the kind's own parts (after the first ``n``), and its since."""
    if len(parts) > n and parts[n]:
        info["kind"] = parts[n]
    if len(parts) > n + 1:
        info["more"] = parts[n + 1:]  # the kind's own parts (a task mark's state and name)
    try:
        return (float(old) if old else ms / 1000.0), info
    except ValueError:
        return None


def decoded_name(name: str) -> str:
    """A thread or task name as a format 3 entry codes it, decoded (``identity.NAME_CODES``)."""
    if name.isprintable():
        return name
    for code, full in NAME_CODES:
        name = name.replace(code, full)
    return name


def _base36(v: str) -> int | None:
    return int(v, 36) if v and len(v) <= 13 and _BASE36.issuperset(v) else None


def _hex(v: str) -> int | None:
    return int(v, 16) if v and len(v) <= 16 and _HEX.issuperset(v) else None


def _digits(v: str) -> int | None:
    return int(v) if v.isascii() and v.isdigit() else None


def describes(entry: dict[str, Any], field: str) -> bool:
    """Is ``entry`` (``parse_entry``'s) about the holder of hash field ``field``? Format 1
    names the field whole; format 2 its uuid's first 8 characters and its serial."""
    if "owner" in entry:
        return entry["owner"] == field
    short = entry.get("owner_short")
    if not isinstance(short, str):
        return False
    if short == field:
        return True
    head, sep, serial = short.rpartition(":")
    return (bool(sep) and len(field) > len(short) and field.startswith(head)
            and field.endswith(sep + serial) and field[len(head):-len(sep + serial)].find(":") < 0)


def entry_of(raw: Any, now: float) -> dict[str, Any] | None:
    """An index value as a dict with ``held_for`` (``parse_entry``); None if unreadable."""
    parsed = parse_entry(raw)
    if parsed is None:
        return None
    since, info = parsed
    info["held_for"] = max(0.0, now - since)
    return info


def decoded(raw: Any) -> dict[str, str] | None:
    if not isinstance(raw, dict) or not raw:
        return None
    fields: dict[str, str] = {}
    for f, v in raw.items():
        f, v = text(f), text(v)
        if f is None or v is None:
            return None
        fields[f] = v
    return fields


def holders_of(fields: dict[str, str], entry: dict[str, Any] | None, modes: bool
             ) -> tuple[Holder, ...] | None:
    """The holders of a lock hash, or None if it is not one. With ``modes`` (a read-write
    lock) its ``mode`` field is no holder, and its writer's field is ``<owner>:write``."""
    holders = []
    for f, v in fields.items():
        if modes and f == "mode":
            continue
        m = _WRITER.fullmatch(f) if modes else None
        write = m is not None
        if m is None:
            m = _FIELD.fullmatch(f)
        if m is None or _COUNT.fullmatch(v) is None:
            return None
        holder = Holder(m.group(1), int(m.group(2)), int(v), write=write)
        # A hold left as a lease (hold_at_least) keeps its holder's entry: the field is the
        # holder's with LEASE_MARK after its process part.
        if entry is not None and (describes(entry, f)
                                  or describes(entry, f.replace(LEASE_MARK, "", 1))):
            holder = Holder(holder.client_id, holder.thread_id, holder.hold_count,
                            _str(entry.get("host")), _int(entry.get("pid")),
                            _str(entry.get("process")), _str(entry.get("thread")),
                            round(float(entry["held_for"]), 3), _int(entry.get("os_thread_id")),
                            write)
        holders.append(holder)
    return tuple(holders)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def kind_named(entry: dict[str, Any] | None, default: str | None) -> str | None:
    """The kind an index entry names (``default`` if it names none); None without an entry."""
    if entry is None:
        return None
    kind = entry.get("kind", default)
    return kind if isinstance(kind, str) else None


def seconds_left(score: Any, now_ms: float) -> float | None:
    """A zset score (expiry, ms) as seconds left, None for never; 0 once past."""
    try:
        ms = float(score)
    except (TypeError, ValueError):
        return None
    if ms >= NEVER_MS:
        return None
    return round(max(0.0, ms - now_ms) / 1000.0, 3)


def permits_read(reply: Any, now_ms: float) -> tuple[int, int, list[dict[str, Any]]]:
    """``lua/pes_peek.lua``'s reply as (permits expired, permits taken, the taken ones it
    returned: ``id`` as 32 hex chars, ``ttl`` as ``seconds_left``); nothing for an error (the
    key beside is no zset)."""
    if not isinstance(reply, list) or len(reply) != 3 or not isinstance(reply[2], list):
        return 0, 0, []
    flat = reply[2]
    return count_of(reply[0]), count_of(reply[1]), [
        {"id": m.hex() if isinstance(m, bytes) else str(m), "ttl": seconds_left(text(sc), now_ms)}
        for m, sc in zip(flat[::2], flat[1::2], strict=True)]


def count_of(reply: Any) -> int:
    """LLEN / ZCARD reply; 0 for a wrong-type error."""
    return reply if isinstance(reply, int) and not isinstance(reply, bool) else 0
