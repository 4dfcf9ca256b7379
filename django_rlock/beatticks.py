"""The ticks of a Celery schedule as the beat leader reckons them: times in server µs.

A tick is a scheduled time of an entry, a pure function of the previous one, so every replica
that becomes leader computes the same ticks from the progress in Redis (``engine.ticks``):
``next_after(schedule, t)`` is the schedule's next time after ``t``, evaluated as if "now"
were ``t`` (Celery's ``remaining_estimate`` measures from now; measured from ``t`` itself the
host's clock drops out). Interval schedules are computed in whole µs (no float drift).

Times handed to a schedule are in the schedule's own timezone (``schedule.tz``: the app's
``timezone``, or a django-celery-beat row's): Celery 5.5's crontab reads the hour and day of
the datetime it is given as they are, so a UTC datetime would put ``hour=9`` at 09:00 UTC
whatever the app's timezone (5.7 converts first). Differences are taken in UTC (real time).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from celery.schedules import schedule as interval_schedule
from celery.utils.time import maybe_make_aware

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

#: At most this many ticks are stepped through from one starting tick when looking for the
#: latest one due (a non-interval schedule: crontab, solar). After a longer gap the search
#: starts again near now (``latest_tick``), so a gap of any length is one send.
CATCH_UP_STEPS = 1000

#: How far before now the search for the latest tick looks, widening until it finds a tick
#: (µs): a minute, an hour, a day, a week, 31 days, then years.
_SPANS = tuple(int(s * 1e6) for s in (60, 3600, 86400, 7 * 86400, 31 * 86400, 366 * 86400,
                                      4 * 366 * 86400, 30 * 366 * 86400))


def to_us(when: datetime) -> int:
    """µs since the epoch of ``when`` (naive: UTC, as Celery reads it)."""
    return (maybe_make_aware(when).astimezone(UTC) - EPOCH) // _US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def zone_of(sched: Any) -> tzinfo:
    """The timezone ``sched`` reckons in (UTC if it names none)."""
    try:
        tz = getattr(sched, "tz", None)
    except Exception:  # an app without a timezone it can load: Celery's default is UTC
        tz = None
    return tz if isinstance(tz, tzinfo) else UTC


def local(sched: Any, us: int) -> datetime:
    """``us`` as an aware datetime in ``sched``'s timezone (what its ``last_run_at`` and "now"
    must be: see the module docstring)."""
    return from_us(us).astimezone(zone_of(sched))


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
    at = local(sched, tick)
    saved = sched.nowfun
    sched.nowfun = lambda: at
    try:
        rem = sched.remaining_estimate(at)
    except NotImplementedError:
        return None
    finally:
        sched.nowfun = saved
    return tick + rem // _US


def _step(sched: Any, tick: int, now: int) -> tuple[int, bool]:
    """Step from ``tick`` through the ticks at or before ``now`` (at most ``CATCH_UP_STEPS``):
    (the last reached, whether it is the latest, i.e. the next one is after ``now``)."""
    for _ in range(CATCH_UP_STEPS):
        following = next_after(sched, tick)
        if following is None or following <= tick or following > now:
            return tick, True
        tick = following
    return tick, False


def latest_tick(sched: Any, base: int, now: int) -> int | None:
    """The latest tick after ``base`` at or before ``now`` (µs): the one a leader sends, the
    ticks before it coalesced into it; None if the first tick after ``base`` is after ``now``.
    A schedule that cannot say its next time gets ``now`` (after ``base``) as its tick.

    Crontab and solar ticks are absolute (the schedule's own times, not steps from the last):
    after a gap of more than ``CATCH_UP_STEPS`` of them, the latest is looked for near now
    instead (the first tick after now - 1 min, 1 h, 1 d, ... that is at or before now, then
    stepped forward), so a week of a minutely crontab is one send, on the grid."""
    first = next_after(sched, base)
    if first is None:
        return max(now, base + 1)
    if first > now:
        return None
    period = interval_us(sched)
    if period is not None:
        return first + (now - first) // period * period
    tick, latest = _step(sched, first, now)
    if latest:
        return tick
    for span in _SPANS:  # the first span with a tick in it (a wider one would step longer)
        near = next_after(sched, now - span)
        if near is None:
            break
        if near <= now:
            if near > tick:
                tick = _step(sched, near, now)[0]
            break
    return tick


def server_clock(sched: Any, now_us: Callable[[], int]) -> None:
    """Make ``sched`` read "now" from the server's clock as estimated by ``now_us`` (in the
    schedule's timezone)."""
    if getattr(sched, "nowfun", None) is not None and getattr(sched.nowfun, "rlock_beat", False):
        return

    def now() -> datetime:
        return local(sched, now_us())

    now.rlock_beat = True  # type: ignore[attr-defined]
    sched.nowfun = now


__all__ = ["CATCH_UP_STEPS", "EPOCH", "from_us", "interval_us", "latest_tick", "local",
           "next_after", "server_clock", "to_us", "zone_of"]
