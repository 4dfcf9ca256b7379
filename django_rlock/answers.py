"""What a decorated view answers when it did not run: busy (423/429) or no Redis (503).

Three things a client and an operator rely on, decided here once for ``@locked``,
``@limited`` and ``@rate_limited``:

- **Retry-After tells the truth.** Every busy answer carries one. It comes from the failed
  attempt itself (the acquire script returns the holder's PTTL in the same round trip), never
  from a second PTTL that finds the holder gone. In watchdog mode that PTTL is only when the
  lease would run out if the holder died (about ``WATCHDOG_TIMEOUT``), so by default the answer
  is an estimate from the recent hold times of the same template in this process (a high
  percentile of the last ``SAMPLES``), bounded by that PTTL (``RLOCK["BUSY_RETRY_AFTER"]``).
- **Bodies say no more than needed.** The lock's Redis name (often a user id or an order
  number) is not in the body unless ``RLOCK["BUSY_EXPOSE_NAME"]``; a client sending
  ``Accept: application/json`` gets JSON (``RLOCK["BUSY_JSON"]``).
- **Redis unreachable is an outage, not a bug.** A view answers ``503`` with a short
  Retry-After (``RLOCK["UNAVAILABLE_STATUS"]``, ``"raise"`` keeps the exception); one WARNING
  per outage (per cache), not per request, and the ``backend_unavailable`` event (the
  ``lock_backend_unavailable`` signal) for every call turned away.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
from typing import Any

import redis.exceptions

from .engine import events

logger = logging.getLogger("django_rlock")

#: What "the lock backend is unreachable" means: no connection, no answer in time, a server
#: still loading its data after a restart, a cluster without a master for the slot.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError)

#: Error replies of a server that is up but takes no writes for now: too few replicas for
#: ``min-replicas-to-write`` (the seconds after a failover), a replica that lost its master
#: (``replica-serve-stale-data no``), a demoted master a plain client still points at.
#: (redis-py raises ``READONLY`` as ``ReadOnlyError`` without its code, ``MASTERDOWN`` as
#: ``MasterDownError``; a replica also refuses an acquire's ``WAIT`` for its replicas.)
REFUSING = ("NOREPLICAS", "MASTERDOWN", "READONLY")
ON_A_REPLICA = "cannot be used with replica instances"


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means the lock backend cannot take a lock now (503, a task's retry),
    not that the call is wrong: ``UNAVAILABLE``, or a server refusing writes."""
    if isinstance(exc, (*UNAVAILABLE, redis.exceptions.ReadOnlyError,
                        redis.exceptions.MasterDownError)):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and (
        str(exc).startswith(REFUSING) or ON_A_REPLICA in str(exc))


#: Hold times kept per template, and the share of them the estimate covers.
SAMPLES = 32
PERCENTILE = 0.9


class HoldTimes:
    """The recent hold times (seconds) of one template in this process.

    Appends from any thread (a bounded deque: atomic appends, the oldest fall out); the
    estimate copies the deque, so it never blocks a release.
    """

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: collections.deque[float] = collections.deque(maxlen=SAMPLES)

    def add(self, seconds: float) -> None:
        self.times.append(seconds)

    def estimate(self) -> float | None:
        """The ``PERCENTILE`` hold time of the recent ones; None before the first."""
        times = sorted(self.times)
        if not times:
            return None
        return times[min(len(times) - 1, int(PERCENTILE * len(times)))]


def _config() -> Any:
    from .conf import get_config

    return get_config()


def retry_after(spec: Any, ttl: float | None) -> int:
    """Whole seconds (>= 1) a client turned away by ``spec``'s busy lock should wait.

    ``ttl``: the holder's remaining lease, or a limiter's exact wait, as the failed attempt
    returned it (None: unknown; ``inf``: a holder without expiry).
    """
    bound = None if ttl is None or math.isinf(ttl) else max(0.0, ttl)
    hold_times = getattr(spec, "hold_times", None)
    if hold_times is None:  # a rate limiter: the attempt's wait is exact
        return max(1, math.ceil(bound if bound is not None else 1.0))
    setting = _config()["BUSY_RETRY_AFTER"] if spec.client is None else "estimate"
    if setting == "ttl":
        guess = bound
    elif setting == "estimate":
        guess = hold_times.estimate()
        if guess is None:
            guess = bound
    else:
        guess = float(setting)
    if guess is None:  # no PTTL, no history: the lock just became free, or never expires
        guess = 1.0
    if bound is not None:
        guess = min(guess, bound)
    return max(1, math.ceil(guess))


def wants_json(request: Any) -> bool:
    accept = request.headers.get("Accept", "") if request is not None else ""
    return "application/json" in accept and _config()["BUSY_JSON"] is True


def _response(request: Any, status: int, text: str, detail: dict[str, Any],
              after: int) -> Any:
    from django.http import HttpResponse

    if wants_json(request):
        response = HttpResponse(json.dumps({**detail, "retry_after": after}),
                                status=status, content_type="application/json")
    else:
        response = HttpResponse(text, status=status, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(after)
    return response


def busy_response(spec: Any, busy: Any, request: Any = None) -> Any:
    """The answer of a view whose lock, permit or rate stayed busy."""
    after = retry_after(spec, busy.ttl)
    name = busy.name if _config()["BUSY_EXPOSE_NAME"] is True else None
    status = spec.busy_status()
    detail = {"error": spec.busy_code, "detail": spec.busy_body(name, after).strip()}
    if name is not None:
        detail["lock"] = name
    return _response(request, status, spec.busy_body(name, after), detail, after)


# -- the backend is unreachable -------------------------------------------------------------------
#: backend -> (monotonic time the outage was first seen, calls turned away since); guarded
#: by ``_outage_lock`` for changes. Read without it on the fast path (a dict truth test).
_down: dict[str, tuple[float, int]] = {}
_outage_lock = threading.Lock()


def backend_of(spec: Any) -> str:
    """What an outage is counted per: the cache alias (or the spec's own client)."""
    if spec.client is not None:
        return f"client {type(spec.client).__name__}@{id(spec.client):x}"
    cache = spec.cache[0] if isinstance(spec.cache, (list, tuple)) else spec.cache
    return f"cache {cache or _config()['CACHE']!r}"


def backend_down(spec: Any, name: str | None, exc: BaseException) -> None:
    """A call could not reach its lock's Redis: one WARNING for the outage, an event per call."""
    backend = backend_of(spec)
    with _outage_lock:
        since, count = _down.get(backend, (time.monotonic(), 0))
        _down[backend] = (since, count + 1)
    if count == 0:
        logger.warning("django-rlock: the lock backend (%s) is unavailable: %s: %s; calls of "
                       "%s and every other lock on it are turned away until it answers again "
                       "(logged once per outage)", backend, type(exc).__name__, exc,
                       spec.decorator)
    if events.listeners:
        events.emit("backend_unavailable", name=name, key=None, label=spec.label,
                    backend=backend, error=exc, first=count == 0)


def backend_up(spec: Any) -> None:
    """A call reached the backend: ends an outage (logged once). Cheap when none is under way."""
    if not _down:
        return
    backend = backend_of(spec)
    with _outage_lock:
        seen = _down.pop(backend, None)
    if seen is not None:
        logger.warning("django-rlock: the lock backend (%s) answers again after %.1f s; %d "
                       "call(s) were turned away", backend, time.monotonic() - seen[0], seen[1])


def unavailable_status() -> int | str:
    return _config()["UNAVAILABLE_STATUS"]  # type: ignore[no-any-return]


def unavailable_response(spec: Any, request: Any, status: int) -> Any:
    after = max(1, math.ceil(float(_config()["UNAVAILABLE_RETRY_AFTER"])))
    text = (f"Service Unavailable: the lock service is unreachable, try again in {after} s.\n")
    return _response(request, status, text,
                     {"error": "lock_backend_unavailable", "detail": text.strip()}, after)


__all__ = ["PERCENTILE", "REFUSING", "SAMPLES", "UNAVAILABLE", "HoldTimes", "backend_down", "backend_of",
           "backend_up", "busy_response", "retry_after", "unavailable_response",
           "unavailable_status", "unreachable", "wants_json"]
