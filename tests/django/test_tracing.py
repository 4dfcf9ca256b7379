"""OpenTelemetry spans of lock waits and holds, taken by real Django views on real Redis and
read back from the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient
from django.urls import path

pytest.importorskip("opentelemetry.sdk")

import redis.asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from django_rlock import AsyncRLock, get_lock, locked, tracing
from django_rlock.engine import events

ROUNDS = 200
#: What the views use: set by each test (a holder thread of the ``holders`` fixture).
state: dict[str, Any] = {}


def contended(request: HttpRequest) -> HttpResponse:
    """``ROUNDS`` acquisitions, each made while another thread holds the lock: it lets go ~2 ms
    after the view has begun to wait (whatever the load, every acquisition waits)."""
    lock = get_lock("traced", label="traced:{n}")
    holder, held, waiting = state["holder"], threading.Event(), state["waiting"]

    def hold_briefly() -> None:
        lock.lock()
        held.set()
        assert waiting.wait(10)
        time.sleep(0.002)
        lock.unlock()

    measured = []
    for _ in range(ROUNDS):
        held.clear()
        waiting.clear()
        done = holder.submit(hold_briefly)
        assert held.wait(10)
        t0 = time.monotonic()
        lock.lock()
        measured.append(time.monotonic() - t0)
        lock.unlock()
        done(10)
    return JsonResponse({"measured": measured})


def refused(request: HttpRequest) -> HttpResponse:
    lock = get_lock("traced-busy", label="busy:{n}")
    return JsonResponse({"one_shot": lock.try_lock(), "waited": lock.try_lock(wait_time=0.1)})


def free(request: HttpRequest) -> HttpResponse:
    for _ in range(50):
        with get_lock("traced-free"):
            pass
    return HttpResponse("ok")


@locked("traced-locked:{n}")
def locked_view(request: HttpRequest, n: str) -> HttpResponse:
    return HttpResponse("ran")


@locked("traced-alocked:{n}")
async def async_locked_view(request: HttpRequest, n: str) -> HttpResponse:
    return HttpResponse("ran")


urlpatterns = [path("contended/", contended), path("refused/", refused), path("free/", free),
               path("locked/<str:n>/", locked_view), path("alocked/<str:n>/", async_locked_view)]

pytestmark = pytest.mark.urls(__name__)


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.install(provider)
    yield memory, provider
    tracing.uninstall(provider)


def children_of(spans: Any, parent: Any, name: str) -> list[Any]:
    return [s for s in spans if s.name == name and s.parent is not None
            and s.parent.span_id == parent.context.span_id
            and s.context.trace_id == parent.context.trace_id]


def _contended_run(client: Any, memory: InMemorySpanExporter, provider: TracerProvider,
                   holders: Any) -> tuple[list[Any], list[Any], Any, list[float]]:
    """One run of the contended view under a request span: its spans, acquire spans, the
    request span and the gaps (measured wait minus the span's wait attribute), sorted."""
    memory.clear()
    state["holder"] = holders()
    state["waiting"] = waiting = threading.Event()

    def waits(event: str, data: dict) -> None:
        if event == "wait_started" and data["name"] == "traced":
            waiting.set()

    events.add_listener(waits)
    try:
        with provider.get_tracer("test").start_as_current_span("GET /contended/") as request_span:
            response = client.get("/contended/")
    finally:
        events.remove_listener(waits)
    assert response.status_code == 200
    measured = response.json()["measured"]
    spans = memory.get_finished_spans()
    acquires = children_of(spans, request_span, "lock.acquire")
    assert len(acquires) == ROUNDS
    gaps = []
    for span, wait in zip(acquires, measured, strict=True):
        a = span.attributes
        assert a["lock.outcome"] == "acquired"
        assert a["lock.label"] == "traced:{n}" and a["lock.kind"] == "RLock"
        assert a["lock.name"] == "traced"
        # Measured inside the call on the same clock: never longer than the call itself.
        assert a["lock.wait_seconds"] <= wait
        gaps.append(wait - a["lock.wait_seconds"])
        assert span.end_time - span.start_time == pytest.approx(a["lock.wait_seconds"] * 1e9,
                                                                abs=1e5)
    gaps.sort()
    print(f"wait gaps: median {gaps[ROUNDS // 2] * 1e3:.3f} ms, worst {gaps[-1] * 1e3:.3f} ms, "
          f"over 5 ms: {sum(g >= 0.005 for g in gaps)}")
    return spans, acquires, request_span, gaps


def test_contended_acquisitions_give_acquire_spans_with_their_measured_wait(client, exporter,
                                                                          holders):
    memory, provider = exporter
    # Every one of the 200 within 5 ms of the wait the view measured around its call. A thread
    # descheduled between the wait's end and the call's return (load above the core count) can
    # miss it once in a run without the attribute being wrong, so a run with a miss is run
    # again, at most three times in all; a wrong attribute (a part of the wait left out) misses
    # in every run.
    for _ in range(3):
        spans, acquires, request_span, gaps = _contended_run(client, memory, provider, holders)
        assert gaps[ROUNDS // 2] < 0.001, gaps[ROUNDS // 2]
        if gaps[-1] < 0.005:
            break
    assert gaps[-1] < 0.005, gaps[-10:]
    # Handed over by the holder's release, but the first: a lock not yet seen held is waited
    # for unregistered (woken by the release, it takes the lock by its own attempt).
    handed = [s.attributes["lock.handed_over"] for s in acquires]
    assert handed[1:] == [True] * (ROUNDS - 1)
    # The holds too: granted on the holder's thread as it released, parented to the request.
    holds = children_of(spans, request_span, "lock.hold")
    assert len(holds) == ROUNDS
    assert all(h.attributes["lock.end"] == "released" and h.attributes["lock.held_seconds"] >= 0
               for h in holds)
    # The holder thread has no current span: its holds are roots, never in the request.
    assert sum(1 for s in spans if s.name == "lock.hold" and s.parent is None) == ROUNDS


def test_refused_and_timed_out_acquires_name_the_holder(client, exporter, hold):
    memory, provider = exporter
    hold(get_lock("traced-busy"), thread="report-worker")
    with provider.get_tracer("test").start_as_current_span("GET /refused/") as request_span:
        assert client.get("/refused/").json() == {"one_shot": False, "waited": False}
    busy, timeout = children_of(memory.get_finished_spans(), request_span, "lock.acquire")
    assert busy.attributes["lock.outcome"] == "busy"
    assert timeout.attributes["lock.outcome"] == "timeout"
    assert timeout.attributes["lock.wait_seconds"] >= 0.1
    for span in (busy, timeout):
        a = span.attributes
        assert a["lock.handed_over"] is False and a["lock.label"] == "busy:{n}"
        assert a["lock.holder.host"] == socket.gethostname()
        assert a["lock.holder.pid"] == os.getpid()
        assert a["lock.holder.thread"] == "report-worker"


def test_a_locked_view_turned_away_is_one_busy_span_sync_or_async(client, exporter, hold):
    memory, provider = exporter
    hold(get_lock("traced-locked:1"))
    hold(get_lock("traced-alocked:1"))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("GET /locked/1/") as sync_span:
        assert client.get("/locked/1/").status_code == 423
    with tracer.start_as_current_span("GET /alocked/1/") as async_span:
        assert asyncio.run(AsyncClient().get("/alocked/1/")).status_code == 423
    spans = memory.get_finished_spans()
    [sync_busy] = children_of(spans, sync_span, "lock.acquire")
    [async_busy] = children_of(spans, async_span, "lock.acquire")
    for span in (sync_busy, async_busy):
        assert span.attributes["lock.outcome"] == "busy"
        assert span.attributes["lock.holder.pid"] == os.getpid()
    assert sync_busy.attributes["lock.label"] == "traced-locked:{n}"
    assert async_busy.attributes["lock.label"] == "traced-alocked:{n}"
    assert async_busy.attributes["lock.kind"] == "AsyncRLock"


def test_uncontended_acquires_send_no_extra_command_and_no_acquire_span(client, exporter,
                                                                        redis_server):
    memory, _ = exporter
    counts = []
    with redis_server.client() as admin:
        for traced in (False, True, False):
            (tracing.install if traced else tracing.uninstall)(exporter[1])
            client.get("/free/")  # connections made, scripts loaded
            admin.config_resetstat()
            client.get("/free/")
            stats = admin.info("commandstats")
            counts.append({k: v["calls"] for k, v in stats.items()
                           if k not in ("cmdstat_info", "cmdstat_config|resetstat")})
    assert counts[0] == counts[1] == counts[2]
    # 50 acquires and 50 releases, one script each (commandstats counts the scripts' calls too).
    assert counts[1]["cmdstat_evalsha"] == 100
    spans = memory.get_finished_spans()
    assert not [s for s in spans if s.name == "lock.acquire"]
    assert len([s for s in spans if s.name == "lock.hold"]) == 100  # both traced requests


def test_nothing_is_traced_without_a_tracer_provider(settings, hold):
    assert not tracing.provider_set()  # nobody set the global one in this process
    settings.RLOCK = {}
    apps.get_app_config("django_rlock").ready()  # OTEL None: only with a provider set
    assert not [x for x in events.listeners if isinstance(x, tracing.LockTracer)]
    settings.RLOCK = {"OTEL": True}
    apps.get_app_config("django_rlock").ready()
    [listener] = [x for x in events.listeners if isinstance(x, tracing.LockTracer)]
    try:
        hold(get_lock("untraced"))
        assert get_lock("untraced").try_lock(wait_time=0.05) is False
        assert listener.tracer is None and not listener._holds and not listener._waits
        assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    finally:
        tracing.uninstall()


def test_asyncio_waits_and_holds_are_children_of_the_tasks_span(exporter, redis_server):
    """No Django request here: an asyncio task's own span is the parent, through its context."""
    memory, provider = exporter
    tracer = provider.get_tracer("test")

    async def main() -> Any:
        ar = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ar, "traced-async", label="async")
        held = asyncio.Event()

        async def holder() -> None:
            await lock.lock()
            held.set()
            await asyncio.sleep(0.1)
            await lock.unlock()

        task = asyncio.create_task(holder())
        await held.wait()
        with tracer.start_as_current_span("task") as span:
            assert await lock.try_lock(wait_time=5) is True
            await lock.unlock()
        await task
        await ar.aclose()
        return span

    parent = asyncio.run(main())
    spans = memory.get_finished_spans()
    [acquire] = children_of(spans, parent, "lock.acquire")
    [held] = children_of(spans, parent, "lock.hold")
    assert acquire.attributes["lock.kind"] == "AsyncRLock"
    assert acquire.attributes["lock.wait_seconds"] >= 0.05
    assert held.attributes["lock.end"] == "released"


def test_the_checks_want_none_or_a_bool_and_opentelemetry(settings, monkeypatch):
    from django_rlock.checks import check_settings

    settings.RLOCK = {"OTEL": "yes"}
    assert [m.id for m in check_settings()] == ["django_rlock.E003"]
    settings.RLOCK = {"OTEL": True}
    assert check_settings() == []
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    [error] = check_settings()
    assert error.id == "django_rlock.E011" and "django-rlock[otel]" in error.hint
    settings.RLOCK = {"OTEL": None}
    assert check_settings() == []
