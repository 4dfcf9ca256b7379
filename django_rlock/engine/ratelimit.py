"""RateLimiter: Redisson's ``RRateLimiter`` (its ``OVERALL`` mode), on the server's clock.

Redisson's layout, so a Java or Node Redisson client on the same name draws from the same
budget: the hash ``<key>`` (``rate``, ``interval`` in ms, ``type`` 0 = OVERALL,
``keepAliveTime``), the counter ``{<key>}:value`` (permits left) and the zset
``{<key>}:permits`` of grants (member ``struct.pack('Bc0I', #id, id, permits)``, score: the
grant's server time in ms, with the microseconds as a fraction). Where Redisson is wrong,
ours differs (docs/engine.md, "Rate limiter"):
every time is the server's (``TIME`` in the script, not each client's clock), a grant counts
until its interval has fully passed (no window holds more than ``rate``), ``set_rate`` keeps the
window's grants, two grants with the same id never overwrite each other, ``permits > rate`` is
refused before any command, and a lost counter is recounted from the grants, never reset to a
full budget.

Waiting is the engine's one wait loop: a refused attempt replies how long until its permits
can be had, the waiter parks exactly that long (``park_until``, then the bound each attempt
returns) and tries once. Waiters keep a place in a line (``{<key>}:rlock_line``) so the permit
that frees goes to the first of them, not to whichever of N sleepers wakes first: a blocking
``acquire`` costs two round trips per grant however many callers wait, instead of one per
caller per freed permit. ``set_rate`` and ``force_unlock`` publish on the limiter's channel, which
wakes every local waiter to re-check.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from . import waiters
from .errors import LockBusy, LockError
from .kinds import Kind, declare
from .lua import Script, source
from .named import Named
from .naming import rate_channel, rate_keys
from .scripts import call, call_once
from .wait import loop as waiting
from .wait.channel import wake_all

# KEYS, ARGV and the reply: in each file's header (``lua/rate_*.lua``, ``lua/_rate.lua``).
#: Milliseconds added per round of grants not made yet to a wait counted on them (lua/_rate).
LATE_MS = 5
RATE_ACQUIRE_SCRIPT = Script(source("rate_acquire", LATE_MS=LATE_MS))
RATE_PEEK_SCRIPT = Script(source("rate_peek", LATE_MS=LATE_MS))
RATE_SET_SCRIPT = Script(source("rate_set", LATE_MS=LATE_MS))
RATE_RESET_SCRIPT = Script(source("rate_reset"))
RATE_LEAVE_SCRIPT = Script(source("rate_leave"))

#: How long (seconds) a waiter's place in line outlives the wait it was told: a waiter that
#: died (or woke this much late) stops holding back the waiters behind it after that.
LINE_SLACK = 2.0

GRANTED, REFUSED, BEYOND = 1, 0, 2
_NO_RATE, _PER_CLIENT, _ABOVE_RATE = -1, -2, -3

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([smhd])\s*")


class RateLimiterError(LockError, ValueError):
    """A limiter cannot serve the call: no rate set, a ``PER_CLIENT`` limiter (another
    client's mode), or more permits asked for at once than its rate."""


class RateLimited(LockBusy):
    """A call found its rate limiter's budget spent (``@rate_limited`` on a plain callable).

    ``retry_after``: seconds until the permits could be had (server clock); also ``ttl``, as
    for a ``LockBusy``, which it is (so ``except LockBusy`` catches both).
    """

    def __init__(self, message: str, name: str | None = None,
                 retry_after: float | None = 0.0) -> None:
        super().__init__(message, name, retry_after)
        self.retry_after = 0.0 if retry_after is None else retry_after


@dataclass(frozen=True, slots=True)
class Grant:
    """One attempt's outcome. ``at``: the grant's server time (seconds since the epoch);
    ``retry_after``: seconds until the permits could be had (0 when granted); ``available``:
    the permits left after it (may be below 0 just after the rate was lowered)."""

    granted: bool
    at: float | None
    retry_after: float
    available: int
    code: int = GRANTED
    id: str = ""


def parse_rate(rate: Any, what: str = "rate") -> tuple[int, float]:
    """``"100/s"``, ``"100/m"``, ``"100/h"``, ``"100/d"`` (Celery's form; ``"10/30s"``: 10 per 30
    seconds) or ``(permits, seconds)`` -> ``(permits, interval seconds)``."""
    if isinstance(rate, tuple) and len(rate) == 2:
        return check_rate(rate[0], rate[1], what)
    if not isinstance(rate, str):
        raise TypeError(f"{what} must be a str like '100/m' or a (permits, seconds) tuple, "
                        f"not {type(rate).__name__}")
    m = _RATE.fullmatch(rate)
    if m is None:
        raise ValueError(f"{what} must look like '100/s', '100/m', '100/h' or '10/30s', "
                         f"got {rate!r}")
    return check_rate(int(m[1]), float(m[2] or 1) * _UNITS[m[3]], what)


def check_rate(rate: Any, interval: Any, what: str = "rate") -> tuple[int, float]:
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise TypeError(f"{what}: permits per interval must be an int, not "
                        f"{type(rate).__name__}")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"{what}: interval must be a number of seconds, not "
                        f"{type(interval).__name__}")
    if rate < 1 or rate > 2**32 - 1:
        raise ValueError(f"{what}: permits per interval must be 1 .. 2**32-1, got {rate!r}")
    if not (math.isfinite(interval) and interval >= 0.001):
        raise ValueError(f"{what}: interval must be at least 0.001 seconds, got {interval!r}")
    return rate, float(interval)


def grant_id() -> str:
    # ASCII, so a decode_responses client reads the reply; Redisson packs any bytes the same.
    return os.urandom(8).hex()


class RateLimiterBase(Named):
    """Validation, names, replies and the kind's force-unlock: what both twins share."""

    _WHAT = "rate limiter"
    _WAKES = staticmethod(wake_all)
    #: Longest park (seconds) before a waiter asks again. Nothing but ``set_rate`` and a
    #: force-unlock (which publish) changes a wait the server computed, so this only bounds
    #: what a message lost over a reconnect costs; long waits are not polled every 5 s.
    _RECHECK = 30.0

    def __init__(self, client: Any, name: str, prefix: str = "", *, rate: Any = None,
                 keep_alive: float | None = None, aio: bool = False,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=aio, sync_client=sync_client)
        self._channel = rate_channel(self.key).encode()
        self._keys = rate_keys(self.key)
        #: The rate this object last saw (its own set_rate, or any reply): permits above it
        #: are refused before any command.
        self._rate: int | None = None
        #: ``(rate, interval seconds)`` as the last reply said (``seen_rate``).
        self._seen: tuple[int, float] | None = None
        #: ``rate=``: set by the first attempt that finds none (no extra round trip).
        self._default: tuple[Any, ...] = ("", "", "")
        if rate is not None:
            r, i = parse_rate(rate, f"{self._WHAT} {name!r}")
            self._default = (r, *self._rate_args(r, i, keep_alive)[1:])
            self._rate = r
        elif keep_alive is not None:
            raise ValueError(f"keep_alive needs rate= ({self._WHAT} {name!r})")

    # -- validation (before any Redis command) ---------------------------------------------
    def _permits(self, permits: Any) -> int:
        n = self._count(permits, least=1)
        if self._rate is not None and n > self._rate:
            raise RateLimiterError(f"{n} permits at once is more than the rate of {self._rate} "
                                   f"({self._WHAT} {self.name!r})", self.name)
        return n

    def _rate_args(self, rate: Any, interval: Any, keep_alive: Any = None) -> tuple[int, int, int]:
        """(rate, interval ms, keepAliveTime ms): Redisson's fields. ``keep_alive``: seconds
        the keys outlive the last grant (None: until deleted); at least the interval, as in
        Redisson (an idle limiter's budget is full by then anyway)."""
        r, i = check_rate(rate, interval, f"{self._WHAT} {self.name!r}")
        ms = max(1, round(i * 1000))
        if keep_alive is None:
            return r, ms, 0
        if isinstance(keep_alive, bool) or not isinstance(keep_alive, (int, float)):
            raise TypeError(f"keep_alive must be a number of seconds, not "
                            f"{type(keep_alive).__name__} ({self._WHAT} {self.name!r})")
        if not (math.isfinite(keep_alive) and keep_alive >= i):
            raise ValueError(f"keep_alive must be at least the interval ({i:g} s), got "
                             f"{keep_alive!r} ({self._WHAT} {self.name!r})")
        return r, ms, round(keep_alive * 1000)

    def _wait_budget(self, wait_time: Any) -> float | None:
        if wait_time is None:
            return None
        if isinstance(wait_time, bool) or not isinstance(wait_time, (int, float)):
            raise TypeError(f"wait_time must be a number of seconds, not "
                            f"{type(wait_time).__name__} ({self._WHAT} {self.name!r})")
        if math.isnan(wait_time) or wait_time < 0:
            raise ValueError(f"wait_time must be >= 0 seconds, got {wait_time!r} "
                             f"({self._WHAT} {self.name!r})")
        return None if math.isinf(wait_time) else float(wait_time)

    # -- replies ---------------------------------------------------------------------------
    def _refused(self, code: int, rate: int, n: int) -> RateLimiterError:
        if code == _NO_RATE:
            return RateLimiterError(f"no rate is set (set_rate first) ({self._WHAT} "
                                    f"{self.name!r})", self.name)
        if code == _PER_CLIENT:
            return RateLimiterError(f"it is a PER_CLIENT limiter, which django-rlock does not "
                                    f"serve ({self._WHAT} {self.name!r})", self.name)
        return RateLimiterError(f"{n} permits at once is more than the rate of {rate} "
                                f"({self._WHAT} {self.name!r})", self.name)

    @property
    def seen_rate(self) -> tuple[int, float] | None:
        """``(permits, interval seconds)`` as the server last said (None: not asked yet)."""
        return self._seen

    def _grant(self, reply: Any, n: int) -> Grant:
        code, x, available, rate, interval = (int(v) for v in reply[:5])
        if code < 0:
            raise self._refused(code, rate, n)
        self._rate = rate
        self._seen = (rate, interval / 1000.0)
        gid = reply[5].decode() if isinstance(reply[5], bytes) else str(reply[5])
        if code == GRANTED:
            return Grant(True, x / 1e6, 0.0, available, code, gid)
        return Grant(False, None, x / 1e6, available, code)

    def _peeked(self, reply: Any, n: int) -> tuple[float, int]:
        code, wait, available, rate, interval = (int(v) for v in reply[:5])
        if code < 0:
            raise self._refused(code, rate, n)
        self._rate = rate
        self._seen = (rate, interval / 1000.0)
        return wait / 1e6, available

    def _attempt_args(self, n: int, token: str, budget: float | None) -> tuple[Any, ...]:
        budget_ms = -1 if budget is None else math.floor(budget * 1000)
        recheck_ms = int(self._RECHECK * 1000)
        return (n, grant_id(), token, budget_ms, int(LINE_SLACK * 1000), recheck_ms,
                *self._default)

    def _sending(self, n: int, token: str, budget: float | None, note: waiters.Note | None
                 ) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
        """The attempt as sent; a waiter's (``note``) carries its record while in line."""
        return waiters.noted(note, RATE_ACQUIRE_SCRIPT, (*self._keys, self._index),
                             self._attempt_args(n, token, budget),
                             "type(reply) == 'table' and tonumber(reply[1]) == 0",
                             "math.floor(tonumber(reply[2]) / 1000)")

    def _park_ms(self, g: Grant, deadline: float | None) -> int:
        """How long the wait loop parks after a refusal (ms): until the permits can be had, or
        (out of line: not within the budget) until the budget ends, for the last try."""
        if g.code == BEYOND and deadline is not None:
            return max(0, math.ceil((deadline - time.monotonic()) * 1000))
        # +1 ms: the client's clock may run a hair ahead of the server's over a short sleep.
        return self._bound(math.ceil(g.retry_after * 1000) + 1)

    @staticmethod
    def _left(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    # -- force-unlock: the kind's one meaning (``locks clear``, the admin) -------------------
    def _force_call(self) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
        return RATE_RESET_SCRIPT, (*self._keys, self._index), (self.channel, "0")

    def _delete_call(self) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
        return RATE_RESET_SCRIPT, (*self._keys, self._index), (self.channel, "1")


class RateLimiter(RateLimiterBase):
    """Redisson's ``RRateLimiter`` in ``OVERALL`` mode: at most ``rate`` permits per
    ``interval`` seconds to all clients of the name together, in any sliding window.

    Set the rate once (``try_set_rate``; ``set_rate`` to change it, keeping the window's
    grants), then ``try_acquire`` / ``acquire``. Permits are spent, never given back.
    """

    def try_set_rate(self, rate: int, interval: float, keep_alive: float | None = None) -> bool:
        """Set ``rate`` permits per ``interval`` seconds if no rate is set; True if set.
        ``keep_alive``: seconds the limiter outlives its last grant (Redisson's
        keepAliveTime, >= interval; None: until deleted)."""
        r, i, k = self._rate_args(rate, interval, keep_alive)
        done = bool(call_once(self._client, RATE_SET_SCRIPT, (*self._keys, self._index),
                              (r, i, "1", self.channel, k)))
        if done:
            self._rate = r
        return done

    def set_rate(self, rate: int, interval: float, keep_alive: float | None = None) -> None:
        """Set (or change) the rate. The grants of the current window still count against
        the new rate; waiters re-check at once."""
        r, i, k = self._rate_args(rate, interval, keep_alive)
        call_once(self._client, RATE_SET_SCRIPT, (*self._keys, self._index),
                  (r, i, "0", self.channel, k))
        self._rate = r

    def get_rate(self) -> tuple[int, float] | None:
        """``(permits, interval seconds)``, or None if no rate is set."""
        rate, interval = self._reader.hmget(self.key, "rate", "interval")
        if rate is None or interval is None:
            return None
        self._rate = int(rate)
        return int(rate), int(interval) / 1000.0

    def try_acquire(self, permits: int = 1, wait_time: float = 0.0) -> bool:
        """Take ``permits`` if they can be had within ``wait_time`` seconds; True if taken.
        Returns False at once when the server says they cannot come within the budget."""
        return self.attempt(permits, wait_time).granted

    def acquire(self, permits: int = 1) -> float:
        """Take ``permits``, waiting as long as it takes; returns the grant's server time."""
        g = self._take(self._permits(permits), None)
        return g.at if g.at is not None else 0.0

    def attempt(self, permits: int = 1, wait_time: float = 0.0) -> Grant:
        """``try_acquire`` with the whole outcome: when it was granted (server time), or how
        long until the permits could be had (what ``Retry-After`` says)."""
        n = self._permits(permits)
        return self._take(n, self._wait_budget(wait_time))

    def _send(self, n: int, token: str, budget: float | None,
              note: waiters.Note | None = None) -> Grant:
        return self._grant(call_once(self._client, *self._sending(n, token, budget, note)), n)

    def _take(self, n: int, budget: float | None) -> Grant:
        t0 = time.monotonic()
        token = "" if budget == 0 else grant_id()
        # A waiter in line shows from its first attempt: it may park long before the next.
        note = self._note(t0, budget) if token else None
        g = self._send(n, token, budget, note)
        if g.granted or g.code != REFUSED or not token:
            return g
        deadline = None if budget is None else time.monotonic() + budget
        last = [g]

        def attempt(claim: bool) -> int | None:
            r = last[0] = self._send(n, token, self._left(deadline), note)
            return None if r.granted else self._park_ms(r, deadline)

        try:
            waiting.wait(self._wait(t0), attempt, self._left(deadline),
                         park_until=time.monotonic() + min(g.retry_after + 0.001, self._RECHECK))
        finally:
            if not last[0].granted and last[0].code == REFUSED:
                self._leave(f"{token}|{n}", "", n)
        return last[0]

    def _leave(self, member: str, gid: str, n: int) -> None:
        try:
            call(self._client, RATE_LEAVE_SCRIPT, self._keys, (member, gid, n))
        except Exception:
            pass  # its place expires LINE_SLACK after its wait

    def available_permits(self) -> int:
        """Permits left in the window now (Redisson's meaning: waiters in line not deducted)."""
        _, available = self._peeked(call(self._client, RATE_PEEK_SCRIPT, self._keys, (1,)), 1)
        return max(available, 0)

    def time_until_available(self, permits: int = 1) -> float:
        """Seconds until ``try_acquire(permits)`` could succeed (0: now), waiters in line
        served first."""
        n = self._permits(permits)
        wait, _ = self._peeked(call(self._client, RATE_PEEK_SCRIPT, self._keys, (n,)), n)
        return wait

    def force_unlock(self) -> bool:
        """Reset the budget (the window's grants and the line forgotten, the rate kept) and
        wake the waiters: what ``manage.py locks clear`` and the admin do."""
        before = self._forcing()
        script, keys, args = self._force_call()
        return self._forced(call_once(self._client, script, keys, args), before)

    def delete(self) -> bool:
        """Delete the limiter (rate and budget); waiters wake and find no rate set."""
        script, keys, args = self._delete_call()
        self._rate = None
        return bool(call_once(self._client, script, keys, args))


def read_rate(client: Any, key: str) -> dict[str, Any] | None:
    """What listing shows of a limiter: rate, interval, permits available now and asked for
    by waiters in line (one read-only script); None if it is not one (any more)."""
    try:
        reply = call(client, RATE_PEEK_SCRIPT, rate_keys(key), (1,))
    except Exception:
        return None
    code, _, available, rate, interval, waiting_permits = (int(v) for v in reply[:6])
    if code < 0:
        return None
    return {"rate": rate, "interval": interval / 1000.0, "available": max(available, 0),
            "waiting": waiting_permits}


def _summary(d: dict[str, Any]) -> str:
    return f"{d['available']}/{d['rate']} per {d['interval']:g}s available"


RATE = declare(Kind(
    "rate", "hash",
    note="The budget is reset: the grants of the current window are forgotten and the full "
         "rate is available at once; the rate itself stays. Waiters are woken.",
    open=RateLimiter,
    detect=lambda probe: {"rate", "interval", "type"} <= probe["fields"].keys(),
    read=read_rate, summary=_summary,
    lines=lambda d: [f"rate: {d['rate']} per {d['interval']:g} s",
                     f"available now: {d['available']}",
                     f"asked for by waiters in line: {d['waiting']}"]))

__all__ = ["BEYOND", "GRANTED", "LINE_SLACK", "REFUSED", "Grant", "RateLimited", "RateLimiter",
           "RateLimiterBase", "RateLimiterError", "check_rate", "grant_id", "parse_rate", "read_rate"]
