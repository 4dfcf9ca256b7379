"""@rate_limited on views (sync, async) and plain functions, get_rate_limiter, and the limiter in
``manage.py locks``, against a real Redis. (Celery tasks: tests/celery/test_rate_limited_celery.py.)"""

from __future__ import annotations

import logging
import math
import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_rlock import (
    LockBusy,
    LockError,
    RateLimited,
    RateLimiter,
    get_rate_limiter,
    rate_limited,
)

pytestmark = pytest.mark.urls(__name__)

KEY = "demo:rlock:"
ran: list[str] = []


@rate_limited("search:{request.GET[q]}", rate="2/m")
def search(request: HttpRequest) -> HttpResponse:
    ran.append(request.GET["q"])
    return HttpResponse("found")


@rate_limited("short", rate=(2, 1.5))
def short(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@rate_limited("asearch:{q}", rate="1/m")
async def asearch(request: HttpRequest, q: str) -> HttpResponse:
    return HttpResponse("found")


@rate_limited("teapot", rate="1/h", status=503)
def teapot(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("search/", search),
    path("short/", short),
    path("asearch/<str:q>/", asearch),
    path("teapot/", teapot),
]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    ran.clear()
    yield


def test_view_over_budget_gets_429_with_retry_after(db1):
    c = Client()
    assert [c.get("/search/?q=a").status_code for _ in range(2)] == [200, 200]
    over = c.get("/search/?q=a")
    assert over.status_code == 429
    assert 59 <= int(over["Retry-After"]) <= 60  # seconds until a permit, rounded up
    assert b"allows 2 per 60 s" in over.content and b"search:a" not in over.content
    assert ran == ["a", "a"]
    assert c.get("/search/?q=b").status_code == 200  # another name, another budget
    # Redisson's layout at the cache's prefix.
    assert db1.hget(KEY + "search:a", "rate") == b"2"
    assert db1.hget(KEY + "search:a", "interval") == b"60000"
    assert db1.get("{" + KEY + "search:a}:value") == b"0"
    # A limiter the decorator made expires one idle interval after its last grant.
    assert 60_000 < db1.pttl(KEY + "search:a") <= 61_000


def test_retry_after_is_rounded_up_and_honest(db1):
    c = Client()
    assert c.get("/short/").status_code == 200 and c.get("/short/").status_code == 200
    over = c.get("/short/")
    assert over.status_code == 429 and over["Retry-After"] == "2"  # 1.5 s, rounded up
    left = get_rate_limiter("short").time_until_available()
    time.sleep(left + 0.05)
    assert c.get("/short/").status_code == 200


def test_async_view(db1):
    async def run() -> list[Any]:
        c = AsyncClient()
        return [await c.get("/asearch/x/") for _ in range(2)]

    import asyncio

    ok, over = asyncio.run(run())
    assert ok.status_code == 200 and over.status_code == 429
    assert 59 <= int(over["Retry-After"]) <= 60


def test_status_can_be_chosen(db1):
    assert Client().get("/teapot/").status_code == 200
    assert Client().get("/teapot/").status_code == 503


def test_plain_function_raises_rate_limited(db1):
    @rate_limited("export:{user}", rate="1/m")
    def export(user: str) -> str:
        return f"exported {user}"

    assert export("ann") == "exported ann"
    with pytest.raises(RateLimited) as e:
        export("ann")
    assert isinstance(e.value, LockError) and isinstance(e.value, LockBusy)
    assert e.value.name == "export:ann"
    assert 59 < e.value.retry_after <= 60
    assert "export:ann" in str(e.value)
    assert export("bob") == "exported bob"


def test_wait_for_a_permit_and_skip(db1):
    @rate_limited("w", rate=(1, 0.5), wait=3)
    def waits() -> str:
        return "ran"

    @rate_limited("s", rate="1/h", on_busy="skip")
    def skips() -> str:
        return "ran"

    t = time.monotonic()
    assert [waits(), waits()] == ["ran", "ran"]
    assert 0.4 < time.monotonic() - t < 3
    assert [skips(), skips()] == ["ran", None]

    @rate_limited("w2", rate="1/h", wait=2)
    def hopeless() -> str:
        return "ran"

    hopeless()
    t = time.monotonic()
    with pytest.raises(RateLimited):  # the permit is an hour away: refused at once
        hopeless()
    assert time.monotonic() - t < 1


def test_permits_per_call_and_on_busy_callable(db1):
    @rate_limited("bulk", rate="5/m", permits=2,
                  on_busy=lambda limited, n: f"later ({limited.retry_after > 0})")
    def bulk(n: int) -> str:
        return f"sent {n}"

    assert [bulk(1), bulk(2), bulk(3)] == ["sent 1", "sent 2", "later (True)"]
    assert get_rate_limiter("bulk").available_permits() == 1


def test_bad_arguments_are_refused_when_decorating(redis_server):
    client = redis_server.client(db=1)
    client.config_resetstat()
    for kwargs, exc in [({"rate": "100"}, ValueError), ({"rate": 100}, TypeError),
                        ({"rate": "0/s"}, ValueError), ({"rate": "2/m", "permits": 3}, ValueError),
                        ({"rate": "2/m", "permits": 0}, ValueError),
                        ({"rate": "2/m", "permits": True}, TypeError),
                        ({"rate": "2/m", "wait": -1}, ValueError),
                        ({"rate": "2/m", "on_busy": "later"}, ValueError),
                        ({"rate": "2/m", "cache": ["a", "b"]}, ValueError)]:
        with pytest.raises(exc):
            rate_limited("x:{y}", **kwargs)
    with pytest.raises(ValueError, match="'z'"):
        rate_limited("x:{z}")(lambda y: y)  # the template's field is no parameter
    calls = {k: v["calls"] for k, v in client.info("commandstats").items()}
    assert set(calls) <= {"cmdstat_info", "cmdstat_config|resetstat", "cmdstat_config"}
    client.close()


def test_another_rate_stored_is_kept_with_one_warning(db1, caplog):
    RateLimiter(db1, KEY + "deploy").set_rate(3, 60)

    @rate_limited("deploy", rate="1/m")
    def call() -> str:
        return "ran"

    with caplog.at_level(logging.WARNING, logger="django_rlock"):
        assert [call(), call(), call()] == ["ran", "ran", "ran"]  # its own 3 per minute
    warnings = [r for r in caplog.records if "has a rate of 3 per 60 s" in r.getMessage()]
    assert len(warnings) == 1
    with pytest.raises(RateLimited):
        call()


@rate_limited("bulk-view", rate="10/m", permits=3)
def bulk_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@rate_limited("bulk-view", rate="10/m", permits=3)
async def abulk_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def test_a_rate_lowered_below_the_permits_turns_calls_away_as_over_budget(db1, caplog):
    """An operator lowers the rate below what one call costs (get_rate_limiter().set_rate):
    every call is answered as over budget for an interval (429, a task's skip or retry, a
    function's RateLimited), never a 500; one ERROR per decorator names the fix; raising the
    rate again serves the calls."""
    from django.test import RequestFactory

    @rate_limited("bulk-fn", rate="10/m", permits=3, wait=1)
    def bulk_fn() -> str:
        return "ran"

    @rate_limited("bulk-fn", rate="10/m", permits=3, on_busy="skip")
    def bulk_skip() -> str:
        return "ran"

    rf = RequestFactory()
    assert bulk_view(rf.get("/")).status_code == 200 and bulk_fn() == "ran"
    get_rate_limiter("bulk-view").set_rate(2, 30)
    get_rate_limiter("bulk-fn").set_rate(2, 30)
    import asyncio

    with caplog.at_level(logging.WARNING, logger="django_rlock"):
        for _ in range(2):
            over = bulk_view(rf.get("/"))
            assert over.status_code == 429 and over["Retry-After"] == "30", over.content
            aover = asyncio.run(abulk_view(rf.get("/")))
            assert aover.status_code == 429 and aover["Retry-After"] == "30"
            with pytest.raises(RateLimited) as e:
                bulk_fn()
            assert e.value.retry_after == 30.0 and e.value.name == "bulk-fn"
            assert bulk_skip() is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    # One per decorator (the sync and async views are two), each with the fix.
    assert len(errors) == 4, [r.getMessage() for r in errors]
    text = errors[0].getMessage()
    assert "has a rate of 2 per 30 s, below the 3 permits" in text
    assert "get_rate_limiter('bulk-view').set_rate(10, 60)" in text
    assert not [r for r in caplog.records if "keeps its own" in r.getMessage()]
    get_rate_limiter("bulk-view").set_rate(10, 60)  # the fix the ERROR names
    assert bulk_view(rf.get("/")).status_code == 200


def test_get_rate_limiter(db1):
    rl = get_rate_limiter("feed", rate="10/h")
    assert rl.key == KEY + "feed" and rl.get_rate() == (10, 3600.0)
    assert get_rate_limiter("feed", rate="99/s").get_rate() == (10, 3600.0)  # kept
    assert get_rate_limiter("feed").try_acquire(4)
    assert rl.available_permits() == 6
    other = get_rate_limiter("feed", cache="builtin", rate=(1, 1))
    assert other.key == "site2:rlock:feed" and other.available_permits() == 1
    with pytest.raises(ValueError):
        get_rate_limiter("feed", rate="ten per hour")


def test_locks_command_lists_and_clears_a_limiter(db1):
    rl = get_rate_limiter("quota", rate="10/m")
    assert rl.try_acquire(7)
    out = StringIO()
    call_command("locks", "list", stdout=out)
    line, = [ln for ln in out.getvalue().splitlines() if "quota" in ln]
    assert "rate" in line and "3/10 per 60s available" in line
    out = StringIO()
    call_command("locks", "show", "quota", stdout=out)
    assert "available now: 3" in out.getvalue()
    call_command("locks", "clear", "quota", "--no-input", stdout=StringIO(), stderr=StringIO())
    assert rl.available_permits() == 10  # the budget reset
    assert rl.get_rate() == (10, 60.0)  # the rate kept


def test_retry_after_matches_the_engine(db1):
    @rate_limited("m", rate=(1, 2.5))
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    from django.test import RequestFactory

    rf = RequestFactory()
    assert view(rf.get("/")).status_code == 200
    resp = view(rf.get("/"))
    left = get_rate_limiter("m").time_until_available()
    assert int(resp["Retry-After"]) == math.ceil(left) == 3



@pytest.mark.urls("testproject.urls")
def test_engine_command_and_admin_force_unlock_a_limiter_alike(admin_client, redis_server):
    """One force-unlock meaning (docs/django.md's table): the budget reset, the rate kept."""
    from django.urls import reverse

    from tests.django.test_force_meaning import snapshot

    db = redis_server.client(db=1)

    def by_engine() -> None:
        assert get_rate_limiter("forced").force_unlock()

    def by_command() -> None:
        call_command("locks", "clear", "forced", "--no-input", stdout=StringIO(),
                     stderr=StringIO())

    def by_admin() -> None:
        url = reverse("admin:django_rlock_lock_force_unlock", args=["forced"])
        assert admin_client.post(url).status_code == 302

    get_rate_limiter("forced", rate="5/m").try_acquire(2)
    html = admin_client.get(reverse("admin:django_rlock_lock_changelist")).content.decode()
    assert "forced" in html and "rate" in html and "3/5 per 60s available" in html
    states = []
    for way in (by_engine, by_command, by_admin):
        db.flushdb()
        rl = get_rate_limiter("forced", rate="5/m")
        assert rl.try_acquire(5)
        way()
        state = snapshot(db)
        state.pop(b"rlock-index:" + KEY.encode(), None)  # its time differs run to run
        states.append(state)
        assert rl.available_permits() == 5 and rl.get_rate() == (5, 60.0)
    db.close()
    assert states[0] == states[1] == states[2]
    assert set(states[0]) == {(KEY + "forced").encode()}  # the settings hash alone
