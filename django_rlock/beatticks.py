"""The ticks of a Celery schedule as the beat leader reckons them: times in server µs.

A tick is a scheduled time of an entry, a pure function of the previous one, so every replica
that becomes leader computes the same ticks from the progress in Redis (``engine.ticks``):
``next_after(schedule, t)`` is the schedule's next time after ``t``, evaluated as if "now"
were ``t`` (Celery's ``remaining_estimate`` measures from now; measured from ``t`` itself the
host's clock drops out). Interval schedules are computed in whole µs (no float drift).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import schedule as interval_schedule
from celery.utils.time import maybe_make_aware

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

#: At most this many ticks are stepped through to find the latest one due after a gap (a
#: non-interval schedule: crontab, solar); a longer gap is caught up this many ticks at a time.
CATCH_UP_STEPS = 1000


def to_us(when: datetime) -> int:
    """µs since the epoch of ``when`` (naive: UTC, as Celery reads it)."""
    return (maybe_make_aware(when).astimezone(UTC) - EPOCH) // _US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def interval_us(sched: Any) -> int | None:
    """The period of a plain interval schedule (µs), None for any other schedule."""
    if (isinstance(sched, interval_schedule) and not sched.relative
            and type(sched).remaining_estimate is interval_schedule.remaining_estimate):
        period = sched.run_every // _US
        return period if period > 0 else None
    return None


def next_after(sched: Any, tick: int) -> int | None:
    """The schedule's next time after ``tick`` (µs), None if it cannot say."""
    period = interval_us(sched)
    if period is not None:
        return tick + period
    at = from_us(tick)
    saved = sched.nowfun
    sched.nowfun = lambda: at
    try:
        rem = sched.remaining_estimate(at)
    except NotImplementedError:
        return None
    finally:
        sched.nowfun = saved
    return to_us(at + rem)


def latest_tick(sched: Any, base: int, now: int) -> int | None:
    """The latest tick after ``base`` at or before ``now`` (µs): the one a leader sends, the
    ticks before it coalesced into it; None if the first tick after ``base`` is after ``now``.
    A schedule that cannot say its next time gets ``now`` (after ``base``) as its tick."""
    first = next_after(sched, base)
    if first is None:
        return max(now, base + 1)
    if first > now:
        return None
    period = interval_us(sched)
    if period is not None:
        return first + (now - first) // period * period
    tick = first
    for _ in range(CATCH_UP_STEPS):
        following = next_after(sched, tick)
        if following is None or following <= tick or following > now:
            break
        tick = following
    return tick


def server_clock(sched: Any, now_us: Callable[[], int]) -> None:
    """Make ``sched`` read "now" from the server's clock as estimated by ``now_us``."""
    if getattr(sched, "nowfun", None) is not None and getattr(sched.nowfun, "rlock_beat", False):
        return

    def now() -> datetime:
        return from_us(now_us())

    now.rlock_beat = True  # type: ignore[attr-defined]
    sched.nowfun = now


__all__ = ["CATCH_UP_STEPS", "EPOCH", "from_us", "interval_us", "latest_tick", "next_after",
           "server_clock", "to_us"]
