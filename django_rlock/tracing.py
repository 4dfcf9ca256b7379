"""OpenTelemetry spans for lock waits and holds: ``pip install django-rlock[otel]``.

    from django_rlock import tracing
    tracing.install()        # or RLOCK = {"OTEL": True}; Django does it by itself when a
                             # tracer provider is already set as it starts (RLOCK["OTEL"] None)

Two spans, children of the span current where the lock was asked for (a Django request, a
Celery task):

- ``lock.acquire``, for an acquisition that waited or was refused (an uncontended one gets
  none: it is one round trip, the hold span says when it happened). Attributes: ``lock.name``,
  ``lock.label``, ``lock.kind``, ``lock.outcome`` (``acquired``, ``busy``: a one-shot try
  refused, ``timeout``: the wait's budget ran out, ``error``: it raised or was cancelled),
  ``lock.wait_seconds``, ``lock.handed_over`` (granted by a release rather than taken by its
  own attempt), and when it did not get the lock ``lock.holder.host`` / ``lock.holder.pid`` /
  ``lock.holder.process`` / ``lock.holder.thread`` (read from the lock index: one Redis read,
  only on that path; ``holders=False`` turns it off).
- ``lock.hold``, from the grant to the release (``lock.end`` = ``released``, ``owner ended``)
  or the loss (``lost``, status ERROR, ``lock.lost_how``), with ``lock.held_seconds``.

Built on ``engine.events`` (no Django needed). Nothing is created until a real tracer provider
is set: without one the listener returns after a clock read per lock event (it looks for a
provider again once a second, so spans start within a second of one being set).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from .engine import events
from .engine.listing import Locks

logger = logging.getLogger("django_rlock")

#: Holds and waits tracked at once; past it the oldest is ended (a leak guard, not a limit
#: anyone should meet: every hold and wait ends with an event).
MAX_TRACKED = 10_000

#: Seconds between two looks for a global tracer provider while none is set.
RECHECK = 1.0

_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def _label_attrs(data: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {"lock.name": data["name"]}
    if data.get("label"):
        attrs["lock.label"] = data["label"]
    if data.get("kind"):
        attrs["lock.kind"] = data["kind"]
    return attrs


class LockTracer:
    """The event listener that turns lock events into spans (one per tracer provider)."""

    def __init__(self, tracer_provider: Any = None, *, holders: bool = True) -> None:
        self._provider = tracer_provider
        self._tracer: Tracer | None = None
        self.holders = holders
        #: (key, owner) -> the context the wait began in: a grant booked on the releasing
        #: thread still parents its hold span under the waiter's request.
        self._waits: dict[tuple[str, str], Any] = {}
        #: (key, owner) -> its open ``lock.hold`` span.
        self._holds: dict[tuple[str, str], Span] = {}
        self._lock = threading.Lock()
        self._next_look = 0.0

    @property
    def tracer(self) -> Tracer | None:
        """The tracer, once a real provider is set (the global one is set once, never reset).

        Without one, looked for again at most every ``RECHECK`` seconds: the lookup reads the
        environment (a few microseconds), too much for every acquire of a process that traces
        nothing.
        """
        tracer = self._tracer
        if tracer is None:
            now = time.monotonic()
            if now < self._next_look:
                return None
            provider = self._provider or trace.get_tracer_provider()
            if isinstance(provider, _NO_PROVIDER):
                self._next_look = now + RECHECK
                return None
            tracer = self._tracer = provider.get_tracer("django_rlock")
        return tracer

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        handler = _HANDLERS.get(event)
        if handler is None:
            return
        tracer = self._tracer or self.tracer
        if tracer is not None:
            handler(self, tracer, data)

    # -- waits ------------------------------------------------------------------------------
    def _wait_started(self, tracer: Tracer, data: dict[str, Any]) -> None:
        with self._lock:
            _bounded(self._waits)
            self._waits[(data["key"], data["owner"])] = otel_context.get_current()

    def _wait_ended(self, tracer: Tracer, data: dict[str, Any]) -> None:
        with self._lock:
            self._waits.pop((data["key"], data["owner"]), None)
        self._acquire_span(tracer, data, data["outcome"], data["handed_over"])

    def _refused(self, tracer: Tracer, data: dict[str, Any]) -> None:
        self._acquire_span(tracer, data, "busy", False)

    def _busy(self, tracer: Tracer, data: dict[str, Any]) -> None:
        """A ``@locked`` call turned away. Its failed acquire has its span already (``refused``,
        or a wait's ``timeout``); a kind that sent neither gets its span here (no kind, no
        holder; ``lock.holder.ttl_seconds``)."""
        if _spanned.get() == data["key"]:
            _spanned.set(None)
            return
        attrs = {**data, "wait": 0.0}
        self._acquire_span(tracer, attrs, "busy", False)
        _spanned.set(None)

    def _acquire_span(self, tracer: Tracer, data: dict[str, Any], outcome: str,
                      handed_over: bool) -> None:
        wait = data["wait"]
        attrs = _label_attrs(data)
        attrs.update({"lock.outcome": outcome, "lock.wait_seconds": wait,
                      "lock.handed_over": handed_over})
        if outcome != "acquired" and self.holders and data.get("client") is not None:
            attrs.update(_holder_attrs(data["client"], data["key"], data["name"]))
        if outcome != "acquired":
            _spanned.set(data["key"])
            if data.get("ttl") is not None:
                attrs["lock.holder.ttl_seconds"] = data["ttl"]
        end = time.time_ns()
        span = tracer.start_span("lock.acquire", start_time=end - int(wait * 1e9),
                                 attributes=attrs)
        if outcome == "error":
            span.set_status(Status(StatusCode.ERROR, "the acquire raised or was cancelled"))
        span.end(end_time=end)

    # -- holds ------------------------------------------------------------------------------
    def _acquired(self, tracer: Tracer, data: dict[str, Any]) -> None:
        k = (data["key"], data["owner"])
        with self._lock:
            parent = self._waits.get(k)
        # No wait recorded: the grant came on the owner's own thread (or task), in its context.
        span = tracer.start_span("lock.hold", context=parent, attributes={
            **_label_attrs(data), "lock.wait_seconds": data["wait"]})
        with self._lock:
            _bounded(self._holds)
            old = self._holds.pop(k, None)
            self._holds[k] = span
        if old is not None:  # a lease that ran out unreleased, taken again
            old.set_attribute("lock.end", "lease ran out")
            old.end()

    def _released(self, tracer: Tracer, data: dict[str, Any]) -> None:
        self._end_hold(data, data.get("reason") or "released", None)

    def _lost(self, tracer: Tracer, data: dict[str, Any]) -> None:
        self._end_hold(data, "lost", data.get("how") or "lost")

    def _end_hold(self, data: dict[str, Any], end: str, lost: str | None) -> None:
        with self._lock:
            span = self._holds.pop((data["key"], data["owner"]), None)
        if span is None:
            return
        span.set_attribute("lock.held_seconds", data.get("held") or 0.0)
        span.set_attribute("lock.end", "released" if end == "unlock" else end)
        if lost is not None:
            span.set_attribute("lock.lost_how", lost)
            span.set_status(Status(StatusCode.ERROR, f"lock lost: {lost}"))
        span.end()


def _bounded(tracked: dict[Any, Any]) -> None:
    while len(tracked) >= MAX_TRACKED:
        old = tracked.pop(next(iter(tracked)))
        if isinstance(old, Span):
            old.end()


def _holder_attrs(client: Any, key: str, name: str) -> dict[str, Any]:
    """Who holds ``key`` now, from the lock index (best effort: a failed read adds nothing)."""
    prefix = key[:len(key) - len(name)] if key.endswith(name) else ""
    try:
        infos = Locks(client, prefix).read_keys([key])
    except Exception as err:
        logger.debug("django-rlock: tracing: reading the holder of %r failed: %s", key, err)
        return {}
    holders = infos[0].holders if infos else []
    if not holders:
        return {}
    h = holders[0]
    attrs = {"lock.holder.host": h.host, "lock.holder.pid": h.pid,
             "lock.holder.process": h.process, "lock.holder.thread": h.thread}
    if len(holders) > 1:
        attrs["lock.holder.count"] = len(holders)
    return {k: v for k, v in attrs.items() if v is not None}


#: The key of the last acquire span of this thread (or task) that did not get its lock: the
#: ``busy`` event that may follow it (a ``@locked`` call turned away) is the same acquire.
_spanned: contextvars.ContextVar[str | None] = contextvars.ContextVar("django_rlock_spanned",
                                                                      default=None)

_HANDLERS: dict[str, Callable[[LockTracer, Tracer, dict[str, Any]], None]] = {
    "busy": LockTracer._busy,
    "wait_started": LockTracer._wait_started,
    "wait_ended": LockTracer._wait_ended,
    "refused": LockTracer._refused,
    "acquired": LockTracer._acquired,
    "released": LockTracer._released,
    "lost": LockTracer._lost,
}

_installed: dict[int, LockTracer] = {}
_install_lock = threading.Lock()


def install(tracer_provider: Any = None, *, holders: bool = True) -> LockTracer:
    """Trace lock waits and holds with ``tracer_provider`` (default: the global one, looked up
    at each lock event until one is set). Idempotent per provider."""
    with _install_lock:
        tracer = _installed.get(id(tracer_provider))
        if tracer is None or tracer._provider is not tracer_provider:
            tracer = _installed[id(tracer_provider)] = LockTracer(tracer_provider,
                                                                   holders=holders)
        tracer.holders = holders
        events.add_listener(tracer)
        return tracer


def uninstall(tracer_provider: Any = None) -> None:
    """Stop tracing into ``tracer_provider``; spans under way are left open."""
    with _install_lock:
        tracer = _installed.pop(id(tracer_provider), None)
        if tracer is not None:
            events.remove_listener(tracer)


def provider_set() -> bool:
    """Whether a real (not the no-op default) global tracer provider is set."""
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)
