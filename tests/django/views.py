"""Views for the decorator tests. Each records who is inside its critical section."""

from __future__ import annotations

import asyncio
import threading
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_rlock import locked

inside: dict[str, int] = {}
worst: dict[str, int] = {}
release = threading.Event()
entered = threading.Event()
_guard = threading.Lock()


def enter(name: str) -> None:
    with _guard:
        inside[name] = inside.get(name, 0) + 1
        worst[name] = max(worst.get(name, 0), inside[name])
    entered.set()


def leave(name: str) -> None:
    with _guard:
        inside[name] -= 1


def reset() -> None:
    inside.clear()
    worst.clear()
    release.clear()
    entered.clear()


@locked("report:{pk}")
def report(request: HttpRequest, pk: int) -> HttpResponse:
    enter(f"report:{pk}")
    try:
        release.wait(10)
        return HttpResponse(f"report {pk}")
    finally:
        leave(f"report:{pk}")


@locked("boom")
def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


@locked("areport:{pk}", wait=10)
async def async_report(request: HttpRequest, pk: int) -> HttpResponse:
    enter(f"areport:{pk}")
    await asyncio.sleep(0.01)
    leave(f"areport:{pk}")
    return HttpResponse(f"async report {pk}")


@locked("aonce:{pk}")
async def async_once(request: HttpRequest, pk: int) -> HttpResponse:
    enter(f"aonce:{pk}")
    await asyncio.sleep(0.5)
    leave(f"aonce:{pk}")
    return HttpResponse("ran")


@locked("auser:{request.user.pk}", wait=5)  # README's async example
async def async_per_user(request: HttpRequest) -> HttpResponse:
    name = f"auser:{request.user.pk}"  # (loaded already: the lock's name needed it)
    enter(name)
    await asyncio.sleep(0.2)
    leave(name)
    return HttpResponse(name)


@locked("user:{request.user.pk}:{pk}", status=503)
def per_user(request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse({"user": request.user.pk, "pk": pk})


@method_decorator(locked("cbv:{pk}"), name="dispatch")
class ReportView(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        enter(f"cbv:{pk}")
        try:
            release.wait(10)
            return HttpResponse(f"cbv {pk}")
        finally:
            leave(f"cbv:{pk}")


def slow(request: HttpRequest) -> HttpResponse:  # pragma: no cover - helper
    time.sleep(0.1)
    return HttpResponse("slow")


urlpatterns = [
    path("report/<int:pk>/", report),
    path("boom/", boom),
    path("areport/<int:pk>/", async_report),
    path("aonce/<int:pk>/", async_once),
    path("user/<int:pk>/", per_user),
    path("auser/", async_per_user),
    path("cbv/<int:pk>/", ReportView.as_view()),
]
