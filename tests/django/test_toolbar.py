"""The Debug Toolbar's Locks panel, rendered by the real toolbar middleware around a view that
takes real locks (one free, one waited for and handed over, one refused)."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient
from django.urls import path

pytest.importorskip("debug_toolbar")

from django_rlock import get_lock, locked, toolbar
from django_rlock.engine import events


@locked("toolbar:{page}")
def page(request: HttpRequest, page: str) -> HttpResponse:
    waited = get_lock("toolbar-waited", label="waited")
    with waited:  # held by another thread until 50 ms into this wait: handed over
        pass
    refused = get_lock("toolbar-refused").try_lock()
    return HttpResponse(f"<html><body><p>refused={refused}</p></body></html>")


@locked("toolbar-async:{page}", wait=10)
async def async_page(request: HttpRequest, page: str) -> HttpResponse:
    return HttpResponse("<html><body>async</body></html>")


def busy_page(busy: Any, request: HttpRequest, page: str) -> HttpResponse:
    return HttpResponse("<html><body>busy</body></html>", status=423)


@locked("toolbar-once:{page}", on_busy=busy_page)
def once_page(request: HttpRequest, page: str) -> HttpResponse:
    return HttpResponse("<html><body>ran</body></html>")


@locked("toolbar-aonce:{page}", on_busy=busy_page)
async def async_once_page(request: HttpRequest, page: str) -> HttpResponse:
    return HttpResponse("<html><body>ran</body></html>")


def __getattr__(name: str) -> Any:
    # The toolbar's URLs import its models: only once "debug_toolbar" is installed (toolbar_on).
    if name == "urlpatterns":
        from debug_toolbar.toolbar import debug_toolbar_urls

        return [path("page/<str:page>/", page), path("async/<str:page>/", async_page),
                path("once/<str:page>/", once_page), path("aonce/<str:page>/", async_once_page),
                *debug_toolbar_urls()]
    raise AttributeError(name)


pytestmark = pytest.mark.urls(__name__)


@pytest.fixture
def toolbar_on(settings: Any) -> None:
    settings.DEBUG = True
    settings.INTERNAL_IPS = ["127.0.0.1"]
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "debug_toolbar"]
    settings.MIDDLEWARE = ["debug_toolbar.middleware.DebugToolbarMiddleware",
                           *settings.MIDDLEWARE]
    settings.DEBUG_TOOLBAR_PANELS = ["django_rlock.toolbar.LocksPanel"]
    settings.DEBUG_TOOLBAR_CONFIG = {"RENDER_PANELS": True, "IS_RUNNING_TESTS": False}


def rows(html: str) -> list[list[str]]:
    body = html.split('id="LocksPanel"', 1)[1]
    return [[re.sub(r"<[^>]+>", "", cell).strip()
             for cell in re.findall(r"<td>(.*?)</td>", tr, re.S)]
            for tr in re.findall(r'<tr class="djdt-rlock-[a-z]+">(.*?)</tr>', body, re.S)]


def test_the_panel_lists_the_locks_the_request_took(client, toolbar_on, holders, hold):
    h = holders()
    waited = get_lock("toolbar-waited")
    h.call(waited.lock)
    hold(get_lock("toolbar-refused"), thread="someone-else")

    def let_go_once_waited_for(event: str, data: dict) -> None:
        if event == "wait_started" and data["name"] == "toolbar-waited":
            threading.Timer(0.05, lambda: h.call(waited.unlock)).start()

    events.add_listener(let_go_once_waited_for)
    try:
        response = client.get("/page/7/")
    finally:
        events.remove_listener(let_go_once_waited_for)
    assert response.status_code == 200
    html = response.content.decode()
    assert "refused=False" in html
    got = rows(html)
    names = [r[0] for r in got]
    assert names == ["toolbar:7", "toolbar-waited", "toolbar-refused"], got
    view, waited, refused = got
    # name, label, kind, outcome, wait, handed over, held, end
    # An acquire that never waited has its kind too (the ``acquired`` event carries it).
    assert view[1:4] == ["toolbar:{page}", "RLock", "acquired"] and view[5] == ""
    assert view[7] == "released" and float(view[6]) >= 50  # held across the 50 ms wait
    assert waited[1:4] == ["waited", "RLock", "acquired"] and waited[5] == "yes"
    assert float(waited[4]) >= 50 and waited[7] == "released"
    assert refused[3] == "busy" and refused[6] == "" and refused[2] == "RLock"
    assert "3 locks" in html  # the sidebar's subtitle
    # Over with the request: nothing of it is left behind, and later locks are not recorded.
    assert not toolbar._waiting and not toolbar._holding
    with get_lock("after"):
        pass


def test_an_async_view_waiting_for_its_lock_is_listed(toolbar_on, holders):
    h = holders()
    lock = get_lock("toolbar-async:1")
    h.call(lock.lock)

    def let_go_once_waited_for(event: str, data: dict) -> None:
        # The holder lets go 50 ms after the view has begun to wait, whatever the load.
        if event == "wait_started" and data["name"] == "toolbar-async:1":
            threading.Timer(0.05, lambda: h.call(lock.unlock)).start()

    events.add_listener(let_go_once_waited_for)
    try:
        response = asyncio.run(AsyncClient().get("/async/1/"))
    finally:
        events.remove_listener(let_go_once_waited_for)
    assert response.status_code == 200
    [row] = rows(response.content.decode())
    assert row[0] == "toolbar-async:1" and row[2] == "AsyncRLock" and row[3] == "acquired"
    assert float(row[4]) >= 50 and row[7] == "released"


def test_locked_views_turned_away_are_one_busy_row_sync_or_async(client, toolbar_on, hold):
    hold(get_lock("toolbar-once:8"))
    hold(get_lock("toolbar-aonce:8"))
    sync = client.get("/once/8/")
    asynchronous = asyncio.run(AsyncClient().get("/aonce/8/"))
    assert sync.status_code == asynchronous.status_code == 423
    [row] = rows(sync.content.decode())
    assert row[0] == "toolbar-once:8" and row[3] == "busy" and row[2] == "RLock"
    [arow] = rows(asynchronous.content.decode())
    assert arow[0] == "toolbar-aonce:8" and arow[3] == "busy"


def test_without_the_toolbar_the_listener_is_a_no_op(client, hold):
    """The module may be installed (a previous request) while no request is instrumented."""
    toolbar._install()
    hold(get_lock("toolbar-refused"))
    assert get_lock("toolbar-refused").try_lock(wait_time=0.05) is False
    assert not toolbar._waiting and not toolbar._holding
