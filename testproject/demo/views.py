"""Demo views: one sync and one async view, each locked per report id."""

from __future__ import annotations

import asyncio
import os
import time

from django.http import HttpRequest, HttpResponse, JsonResponse

from django_rlock import locked

from .tasks import sync_account


def _seconds(request: HttpRequest) -> float:
    return min(float(request.GET.get("seconds", 5)), 60.0)


@locked("report:{pk}")
def report(request: HttpRequest, pk: int) -> JsonResponse:
    """Builds report ``pk``; a second request for the same report meanwhile gets 423."""
    started = time.time()
    time.sleep(_seconds(request))
    return JsonResponse({"report": pk, "built_in_s": round(time.time() - started, 2),
                         "pid": os.getpid()})


@locked("areport:{pk}", wait=1)
async def async_report(request: HttpRequest, pk: int) -> JsonResponse:
    """The async twin: concurrent requests are distinct owners even on one event loop."""
    started = time.time()
    await asyncio.sleep(_seconds(request))
    return JsonResponse({"report": pk, "built_in_s": round(time.time() - started, 2), "async": True})


def start_sync(request: HttpRequest, account_id: int) -> JsonResponse:
    """Enqueue the same task twice: the second run is skipped while the first holds the lock."""
    first = sync_account.delay(account_id)
    second = sync_account.delay(account_id)
    return JsonResponse({"enqueued": [first.id, second.id],
                         "hint": "watch the worker log: one runs, the duplicate is skipped"})


def index(request: HttpRequest) -> HttpResponse:
    return HttpResponse(
        "django-rlock demo\n\n"
        "  /demo/report/<pk>/?seconds=5        sync view locked per report (busy -> 423)\n"
        "  /demo/async-report/<pk>/?seconds=5  async view, waits up to 1 s, then 423\n"
        "  /demo/sync/<account_id>/            enqueue a locked Celery task twice\n"
        "  /admin/django_rlock/lock/           live locks (admin)\n",
        content_type="text/plain")
