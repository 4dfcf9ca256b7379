"""The progress of a periodic schedule in Redis, advanced only by a current leadership term.

A schedule run on every replica (Celery beat, ``django_rlock.beat``) sends from the leader
only. What it has sent lives here, not in the process: per entry, the last tick sent (its
scheduled time, server clock, µs). ``advance`` decides that a tick is due and moves the
progress to it in one script that first checks the term is still current (the leadership's
field and token, as ``Leader`` keeps them): so a new leader starts from exactly where the last
one stopped, and a leader that was paused past its lease, or deposed, advances nothing, and
so sends nothing (its caller sends only on ``SEND``).

The order is: progress advanced, then message sent. A leader that dies between the two has
used the tick without sending it: every tick is sent at most once, never twice.

Ticks are in the Redis server's clock (``TIME`` inside the script decides "due"), so replicas
whose host clocks differ agree on what is due; ``now`` is this process's estimate of that
clock (the monotonic clock plus the offset the last reply showed), used to plan, never to
decide.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from .clients import for_key
from .lua import load
from .naming import beat_progress
from .scripts import call

#: ``advance`` replies: send the tick; not due yet; the progress is at or past it already;
#: the term is not current (nothing changed).
SEND, NOT_YET, PAST, STALE = 1, 0, -1, -2

ADVANCE_SCRIPT = load("beat_advance", SEND=SEND, NOT_YET=NOT_YET, PAST=PAST, STALE=STALE)


@dataclass(frozen=True)
class Advance:
    """What ``advance`` did: ``code`` (``SEND``, ``NOT_YET``, ``PAST``, ``STALE``), the entry's
    progress after it (µs; None for ``STALE``), and the server's clock (µs)."""

    code: int
    progress: int | None
    now: int


def _int(value: Any) -> int | None:
    if value is None:
        return None
    return int(value.decode() if isinstance(value, bytes) else value)


class TickProgress:
    """The progress hash of one leadership (``leader.key``, ``leader.token_key``).

    Thread-safe; the clock offset is the only state, and it is only an estimate.
    """

    def __init__(self, client: Any, leader_key: str, token_key: str) -> None:
        self.client = client
        self.leader_key = leader_key
        self.token_key = token_key
        self.key = beat_progress(leader_key)
        self._node = for_key(client, leader_key)
        self._mu = threading.Lock()
        self._offset: int | None = None  # server µs - monotonic µs

    def __repr__(self) -> str:
        return f"<TickProgress {self.key!r}>"

    # -- the server's clock ----------------------------------------------------------------
    def _observe(self, server_us: int, sent: float, received: float) -> None:
        mid = (sent + received) / 2.0
        with self._mu:
            self._offset = server_us - int(mid * 1e6)

    def now(self) -> int:
        """The server's clock as this process estimates it (µs); reads ``TIME`` once if no
        reply has shown it yet."""
        with self._mu:
            offset = self._offset
        if offset is None:
            self.sync_clock()
            with self._mu:
                offset = self._offset
        return int(time.monotonic() * 1e6) + (offset or 0)

    def sync_clock(self) -> None:
        sent = time.monotonic()
        secs, micros = self._node.time()
        self._observe(int(secs) * 1_000_000 + int(micros), sent, time.monotonic())

    # -- progress --------------------------------------------------------------------------
    def load(self) -> dict[str, int]:
        """Every entry's progress (µs), and the clock offset measured on the way."""
        sent = time.monotonic()
        pipe = self._node.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(self.key)
        (secs, micros), fields = pipe.execute()
        self._observe(int(secs) * 1_000_000 + int(micros), sent, time.monotonic())
        return {(k.decode() if isinstance(k, bytes) else k): _int(v)  # type: ignore[misc]
                for k, v in fields.items()}

    def advance(self, term: int, owner: str, name: str, tick: int, base: int) -> Advance:
        """Send ``name``'s ``tick`` (µs) if the term is current, the tick is due by the
        server's clock and after the entry's progress (``base``: the progress the caller
        computed the tick from, written if the entry has none)."""
        if not isinstance(term, int) or isinstance(term, bool):
            raise TypeError(f"term must be an int, not {type(term).__name__} ({self.key!r})")
        sent = time.monotonic()
        code, progress, now = call(self._node, ADVANCE_SCRIPT,
                                   (self.leader_key, self.token_key, self.key),
                                   (owner, str(term), name, str(int(tick)), str(int(base))))
        server = int(now)
        self._observe(server, sent, time.monotonic())
        return Advance(int(code), _int(progress), server)

    def clear(self) -> None:
        """Forget every entry's progress (the next leader anchors each entry anew)."""
        self._node.delete(self.key)


__all__ = ["ADVANCE_SCRIPT", "NOT_YET", "PAST", "SEND", "STALE", "Advance", "TickProgress"]
