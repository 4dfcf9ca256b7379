"""Prometheus metrics for lock events: ``pip install django-rlock[prometheus]``.

    from django_rlock import prometheus
    prometheus.install()           # or RLOCK = {"PROMETHEUS": True} in Django settings

Every metric is labelled by ``lock`` = the event's label: the ``@locked`` template
(``"report:{pk}"``) or a lock's ``label=``, never the formatted name, so the number of series
stays bounded however many locks there are. Locks without a label count as ``"unlabelled"``.
Leader elections (``Leader``, ``get_leader``) are labelled by ``group``:
``django_rlock_leader{group}`` is 1 while this process leads it and 0 while it stands by, and
``django_rlock_leader_terms_total{group}`` counts the terms it won.
Built on ``engine.events``: no Django needed, and nothing on the hot path when not installed.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

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

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        label = data.get("label") or UNLABELLED
        if event == "acquired":
            acquisitions, wait, _ = self._children(label)
            acquisitions.inc()
            wait.observe(data["wait"])
        elif event == "released":
            self._children(label)[2].observe(data["held"])
            if data.get("reason") == "owner ended":
                self.owner_ended.labels(label).inc()
        elif event == "lost":
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
