"""Views of the async-load tests (``asgi_load``: settings and application)."""

from __future__ import annotations

import asyncio

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from django_rlock import locked
from django_rlock.connection import get_client
from django_rlock.engine.clients import async_twin

_inside = 0
_worst = 0


@locked("hot", wait=120)
async def hot(request: HttpRequest, n: int) -> HttpResponse:
    global _inside, _worst
    _inside += 1
    _worst = max(_worst, _inside)
    try:
        client = get_client()
        count = int(client.get("load:count") or 0)  # read ...
        await asyncio.sleep(0.001)                  # ... let every other request run ...
        client.set("load:count", count + 1)         # ... write: lost if another was inside
    finally:
        _inside -= 1
    return HttpResponse("ok")


@locked("cold:{n}", wait=120)
async def cold(request: HttpRequest, n: int) -> HttpResponse:
    await asyncio.sleep(0.001)
    return HttpResponse("ok")


@locked("once")
async def once(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def stats(request: HttpRequest) -> HttpResponse:
    pool = async_twin(get_client()).connection_pool
    return JsonResponse({"worst": _worst, "async_pool": pool.max_connections})


urlpatterns = [
    path("hot/<int:n>/", hot),
    path("cold/<int:n>/", cold),
    path("once/", once),
    path("stats/", stats),
]

