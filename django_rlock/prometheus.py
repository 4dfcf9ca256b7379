"""Prometheus metrics for lock events: ``pip install django-rlock[prometheus]``.

    from django_rlock import prometheus
    prometheus.install()           # or RLOCK = {"PROMETHEUS": True} in Django settings

Every metric is labelled by ``lock`` = the event's label: the ``@locked`` template
(``"report:{pk}"``) or a lock's ``label=``, never the formatted name, so the number of series
stays bounded however many locks there are. Locks without a label count as ``"unlabelled"``.
Leader elections (``Leader``, ``get_leader``) are labelled by ``group``:
``django_rlock_leader{group}`` is 1 while this process leads it and 0 while it stands by, and
``django_rlock_leader_terms_total{group}`` counts the terms it won. Live gauges:
``django_rlock_held{lock}`` (holds this process has now) and ``django_rlock_waiting{lock}``
(acquires of this process waiting now), counted from events; under gunicorn, prometheus_client's
multiprocess mode adds the live workers' values (``livesum``, docs/django.md).
Built on ``engine.events``: no Django needed, and nothing on the hot path when not installed.
"""

from __future__ import annotations

import heapq
import threading
import time
import weakref
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .engine import events
from .engine.watchdog import watchdog

UNLABELLED = "unlabelled"
#: Seconds from the call to the grant: uncontended acquires take a round trip (~0.1-1 ms).
WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0)
#: Seconds a lock was held: from a request's milliseconds to a batch job's hours.
HELD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                1800.0, 3600.0, 4 * 3600.0)


class LockMetrics:
    """The metrics of one registry, and the event listener that feeds them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        registry.register(_Sweeper(self))  # first: collected before the gauge it brings up to date

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"django_rlock_{name}", doc, ["lock"], registry=registry)

        self.acquisitions = counter("acquisitions", "Locks acquired (reentry not counted).")
        self.busy = counter("busy", "@locked calls turned away because the lock stayed busy.")
        self.lost = counter("lost", "Holds found gone while held (expired, force-unlocked).")
        self.force_unlocks = counter("force_unlocks", "Locks deleted by force_unlock().")
        self.held_long = counter("held_long", "Holds held longer than their warn_held_after.")
        self.owner_ended = counter("owner_ended",
                                   "Holds released because their thread or task ended holding.")
        self.wait = Histogram("django_rlock_wait_seconds", "Time from the call to the grant.",
                              ["lock"], registry=registry, buckets=WAIT_BUCKETS)
        self.held = Histogram("django_rlock_held_seconds", "Time a lock was held until released.",
                              ["lock"], registry=registry, buckets=HELD_BUCKETS)
        self.leader = Gauge("django_rlock_leader",
                            "1 while this process leads the group, 0 while it campaigns.",
                            ["group"], registry=registry)
        self.terms = Counter("django_rlock_leader_terms", "Terms of the group this process won.",
                             ["group"], registry=registry)
        # Live gauges: counted up and down from events (no scan, no Redis command). livesum:
        # under prometheus_client's multiprocess mode the live processes' values are added.
        self.holding = Gauge("django_rlock_held", "Holds this process has now (reentry: one).",
                             ["lock"], registry=registry, multiprocess_mode="livesum")
        self.waiting = Gauge("django_rlock_waiting", "Acquires of this process waiting now.",
                             ["lock"], registry=registry, multiprocess_mode="livesum")
        #: label -> (holding, waiting) gauge children, cached like ``_hot``.
        self._live: dict[str, tuple[Any, Any]] = {}
        #: The holds counted in ``holding``: (key, owner) -> (label, lease end or None), and a
        #: heap of lease ends. A hold is counted once however often ``acquired`` says so, and
        #: a lease-mode hold that runs out unreleased (no event says so) is uncounted at the
        #: next event or scrape after its lease end.
        self._holds: dict[tuple[str, str], tuple[str, float | None]] = {}
        self._leases: list[tuple[float, tuple[str, str]]] = []
        self._holds_lock = threading.Lock()
        registry.register(OldestHold())
        #: label -> (acquisitions, wait, held) children: ``.labels()`` costs more than the
        #: increment itself, and these run on every acquire and release. Bounded like labels.
        self._hot: dict[str, tuple[Any, Any, Any]] = {}

    def _children(self, label: str) -> tuple[Any, Any, Any]:
        hot = self._hot.get(label)
        if hot is None:  # two threads may both get here: labels() gives both the same children
            hot = self._hot[label] = (self.acquisitions.labels(label), self.wait.labels(label),
                                      self.held.labels(label))
        return hot

    def _gauges(self, label: str) -> tuple[Any, Any]:
        live = self._live.get(label)
        if live is None:
            live = self._live[label] = (self.holding.labels(label), self.waiting.labels(label))
        return live

    def _hold(self, label: str, k: tuple[str, str], lease: float | None) -> None:
        until = None if lease is None else time.monotonic() + lease
        with self._holds_lock:
            if self._leases:
                self._sweep(time.monotonic())
            counted = k in self._holds
            self._holds[k] = (label, until)
            if until is not None:
                heapq.heappush(self._leases, (until, k))
        if not counted:
            self._gauges(label)[0].inc()

    def _unhold(self, k: tuple[str, str]) -> None:
        with self._holds_lock:
            if self._leases:
                self._sweep(time.monotonic())
            gone = self._holds.pop(k, None)
        if gone is not None:
            self._gauges(gone[0])[0].dec()

    def _sweep(self, now: float) -> None:
        """Uncount lease holds past their lease end (called holding ``_holds_lock``)."""
        leases = self._leases
        while leases and leases[0][0] <= now:
            until, k = heapq.heappop(leases)
            entry = self._holds.get(k)
            if entry is not None and entry[1] == until:
                del self._holds[k]
                self._gauges(entry[0])[0].dec()

    def sweep(self) -> None:
        with self._holds_lock:
            self._sweep(time.monotonic())

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        label = data.get("label") or UNLABELLED
        if event == "acquired":
            acquisitions, wait, _ = self._children(label)
            acquisitions.inc()
            wait.observe(data["wait"])
            self._hold(label, (data["key"], data["owner"]), data.get("lease"))
        elif event == "released":
            self._children(label)[2].observe(data["held"])
            self._unhold((data["key"], data["owner"]))
            if data.get("reason") == "owner ended":
                self.owner_ended.labels(label).inc()
        elif event == "wait_started":
            self._gauges(label)[1].inc()
        elif event == "wait_ended":
            self._gauges(label)[1].dec()
        elif event == "lost":
            self._unhold((data["key"], data["owner"]))
            self.lost.labels(label).inc()
        elif event == "held_long":
            self.held_long.labels(label).inc()
        elif event == "busy":
            self.busy.labels(label).inc()
        elif event == "force_unlocked" and data.get("deleted"):
            self.force_unlocks.labels(label).inc()
        elif event == "leader_elected":
            self.leader.labels(data["group"]).set(1)
            self.terms.labels(data["group"]).inc()
        elif event in ("leader_revoked", "leader_started"):
            self.leader.labels(data["group"]).set(0)


class _Sweeper(Collector):
    """Collects nothing: brings ``django_rlock_held`` up to date before a scrape reads it."""

    def __init__(self, metrics: LockMetrics) -> None:
        self._metrics = weakref.ref(metrics)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        metrics = self._metrics()
        if metrics is not None:
            metrics.sweep()
        return []
class OldestHold:
    """``django_rlock_oldest_hold_seconds{lock}``: how long the oldest hold of this process
    has been held, per label, read from the watchdog's registry at scrape time (nothing on
    the hot path; a scrape walks this process's holds once). A lock stuck behind a deadlock
    or a loop shows as a line that keeps climbing."""

    def collect(self) -> Any:
        gauge = GaugeMetricFamily("django_rlock_oldest_hold_seconds",
                                  "Age of the oldest hold of this process, per lock label.",
                                  labels=["lock"])
        for label, age in sorted(watchdog().oldest().items(), key=lambda x: x[0] or ""):
            gauge.add_metric([label or UNLABELLED], age)
        yield gauge

    def describe(self) -> Any:
        # Described without collecting: registering must not walk the holds.
        yield GaugeMetricFamily("django_rlock_oldest_hold_seconds",
                                "Age of the oldest hold of this process, per lock label.",
                                labels=["lock"])


#: Every registry's metrics, made once: metric names can be registered only once per registry,
#: so an uninstalled exporter keeps its metrics and a later install() resumes them. Weak keys:
#: a registry dropped by its owner takes its metrics along.
_metrics: weakref.WeakKeyDictionary[CollectorRegistry, LockMetrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def install(registry: CollectorRegistry | None = None) -> LockMetrics:
    """Count lock events into ``registry`` (default: prometheus_client's global one).

    Idempotent per registry: a second call returns the metrics already installed.
    """
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _metrics.get(registry)
        if metrics is None:
            metrics = _metrics[registry] = LockMetrics(registry)
        events.add_listener(metrics)  # once only, however often installed
        return metrics


def uninstall(registry: CollectorRegistry | None = None) -> None:
    """Stop counting into ``registry``; its metrics stay registered, frozen, until install()."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _metrics.get(registry)
        if metrics is not None:
            events.remove_listener(metrics)
