"""The watchdog's warning that renewals went out late, and what it blames.

A renewal sent with less than a sixth of its lease left is late, and three causes need three
different fixes, so the warning names the one the numbers show:

- the process holds more than it can renew in time (many holds, renewals queued behind the
  batch): raise ``watchdog_timeout``, or spread the holds over processes or servers;
- the process itself did not run (SIGSTOP, a debugger, a frozen container or VM, swapping, CPU
  starvation): its renewal sweep woke up late, by at least as long as the renewals are late,
  however few holds it has. Capacity is not the fix; its locks survive a stop shorter than
  their lease, no longer;
- the server or the network held the renewals (few holds, nothing queued, the sweep on time):
  the previous batch's reply came late.

``Stalls`` keeps the sweep's late wake-ups (``renewal.Scheduler`` records them); ``Lateness``
counts the late renewals and says so at most every ``WARN_EVERY`` seconds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

logger = logging.getLogger("django_rlock")

#: At most one lateness WARNING per this many seconds (with the counts since the last one).
WARN_EVERY = 10.0
#: A sweep that wakes this many seconds past its planned time did not run meanwhile (a sweep
#: on a loaded machine wakes within milliseconds; a late renewal is half a lease late at least).
STALL = 0.5
#: Holds one renewal pipeline sends at once (``renewal.PIPELINE_HOLDS``): with no more than
#: these and nothing queued, sending cannot take seconds; the lateness came from elsewhere.
FEW_HOLDS = 1000


class Stalls:
    """The sweep thread's late wake-ups of the last minute: ``(when, seconds late)``."""

    def __init__(self) -> None:
        self._seen: deque[tuple[float, float]] = deque(maxlen=64)
        self._lock = threading.Lock()

    def woke(self, planned: float, now: float) -> None:
        """The sweep planned to wake at ``planned`` and woke at ``now`` (monotonic)."""
        if now - planned >= STALL:
            with self._lock:
                self._seen.append((now, now - planned))

    def worst_since(self, since: float) -> float:
        """The latest wake-up's lateness among those at or after ``since`` (0: none)."""
        with self._lock:
            return max((late for at, late in self._seen if at >= since), default=0.0)


#: The process's sweep (one watchdog per process).
stalls = Stalls()


class Lateness:
    """Counts renewals sent late and says so, at most every ``WARN_EVERY`` seconds."""

    def __init__(self) -> None:
        self.late = 0          # since the last warning
        self.expired = 0       # of which sent after their last confirmed lease had ended
        self.worst = math.inf  # the least lease left at a send (negative: past its end)
        self.total = 0         # since start (read by tests and the benchmark)
        self._warned = -math.inf
        self._since = 0.0      # the first late renewal since the last warning

    def note(self, late: int, expired: int, worst_left: float, holds: int, queued: int,
             server: Any) -> None:
        """``late`` renewals were just sent with less than a sixth of their lease left
        (``expired`` of them after it); ``holds`` registered, ``queued`` still waiting."""
        now = time.monotonic()
        if not self.late:
            self._since = now
        self.late += late
        self.expired += expired
        self.total += late
        self.worst = min(self.worst, worst_left)
        if now - self._warned < WARN_EVERY:
            return
        self._warned = now
        stopped = stalls.worst_since(self._since - WARN_EVERY)
        few = holds <= FEW_HOLDS and queued == 0
        if few and stopped:
            why = (f"This process was paused or starved for at least {stopped:.1f} s (its "
                   f"watchdog thread woke that late), not short of capacity: a debugger, "
                   f"SIGSTOP, a frozen container or VM, swapping or CPU starvation. Its locks "
                   f"are lost when it stops for longer than their lease (watchdog_timeout)")
        elif few:
            why = ("The server or the network held the renewals (the watchdog ran on time and "
                   "has few to send): locks may be lost if replies take longer than the lease")
        else:
            why = ("It holds more than it can renew in time: locks may be lost (raise "
                   "watchdog_timeout, or spread the holds over processes or servers)")
        logger.warning(
            "django-rlock: %d lock renewal(s) went out late in the last %.1f s: less than a sixth "
            "of their lease left, %d after it had run out (the worst %.2f s %s its end); this "
            "process holds %d lock(s) and %d renewal(s) are queued for %s. %s",
            self.late, now - self._since, self.expired,
            abs(self.worst), "before" if self.worst >= 0 else "past", holds, queued, server, why)
        self.late = self.expired = 0
        self.worst = math.inf


__all__ = ["FEW_HOLDS", "STALL", "WARN_EVERY", "Lateness", "Stalls", "stalls"]
