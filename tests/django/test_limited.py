"""@limited on views (sync, async) and plain functions, against a real Redis."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_rlock import LockBusy
from django_rlock.factory import get_semaphore
from django_rlock.limits import limited

pytestmark = pytest.mark.urls(__name__)

KEY = "demo:rlock:"

inside: dict[str, int] = {}
worst: dict[str, int] = {}
changed = threading.Condition()
release = threading.Event()


def enter(name: str) -> None:
    with changed:
        inside[name] = inside.get(name, 0) + 1
        worst[name] = max(worst.get(name, 0), inside[name])
        changed.notify_all()


def leave(name: str) -> None:
    with changed:
        inside[name] -= 1
        changed.notify_all()


def wait_inside(name: str, n: int, timeout: float = 15.0) -> None:
    with changed:
        assert changed.wait_for(lambda: inside.get(name, 0) == n, timeout), (name, inside)


@limited("export:{pk}", permits=2)
def export(request: HttpRequest, pk: int) -> HttpResponse:
    enter(f"export:{pk}")
    try:
        assert release.wait(15)
        return HttpResponse("exported")
    finally:
        leave(f"export:{pk}")


@limited("boom", permits=1)
def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


@limited("teapot", permits=1, status=503)
def teapot(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


aevent: dict[str, asyncio.Event] = {}


@limited("aexport:{pk}", permits=2)
async def aexport(request: HttpRequest, pk: int) -> HttpResponse:
    enter(f"aexport:{pk}")
    try:
        await asyncio.wait_for(aevent["go"].wait(), 15)
        return HttpResponse("exported")
    finally:
        leave(f"aexport:{pk}")


urlpatterns = [
    path("export/<int:pk>/", export),
    path("boom/", boom),
    path("teapot/", teapot),
    path("aexport/<int:pk>/", aexport),
]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    inside.clear()
    worst.clear()
    release.clear()
    yield
    release.set()


def get_in_thread(url: str, out: list[Any], start: threading.Barrier) -> threading.Thread:
    def run() -> None:
        start.wait()
        out.append(Client().get(url))

    t = threading.Thread(target=run)
    t.start()
    return t


def test_n_plus_one_concurrent_requests_exactly_one_429_while_n_run(db1):
    out: list[Any] = []
    start = threading.Barrier(3, timeout=10)
    threads = [get_in_thread("/export/1/", out, start) for _ in range(3)]
    wait_inside("export:1", 2)  # two are inside and hold on...
    deadline = time.monotonic() + 15
    while not out and time.monotonic() < deadline:  # ...while the third has its answer
        time.sleep(0.01)
    assert len(out) == 1 and out[0].status_code == 429
    retry_after = int(out[0]["Retry-After"])
    assert 1 <= retry_after <= 30  # the nearest permit expiry: renewed, about the watchdog's 30 s
    assert b"runs at most 2 at once" in out[0].content
    assert b"export:1" not in out[0].content  # no lock names by default (BUSY_EXPOSE_NAME)
    sem = get_semaphore("export:1")
    assert sem.available_permits() == 0
    assert db1.zcard("{" + KEY + "export:1}:timeout") == 2  # Redisson's layout: two permit ids
    release.set()
    for t in threads:
        t.join(15)
    assert sorted(r.status_code for r in out) == [200, 200, 429]
    assert worst == {"export:1": 2}
    assert sem.available_permits() == 2  # every permit came back
    assert db1.zcard("{" + KEY + "export:1}:timeout") == 0
    assert Client().get("/export/1/").status_code == 200  # and can be taken again


def test_other_pk_is_another_semaphore(db1):
    out: list[Any] = []
    start = threading.Barrier(2, timeout=10)
    threads = [get_in_thread("/export/3/", out, start), get_in_thread("/export/3/", out, start)]
    wait_inside("export:3", 2)
    out4: list[Any] = []
    other = get_in_thread("/export/4/", out4, threading.Barrier(1))
    wait_inside("export:4", 1)  # pk 4 has its own two permits
    release.set()
    for t in [*threads, other]:
        t.join(15)
    assert [r.status_code for r in out + out4] == [200, 200, 200]


def test_permit_returns_when_the_view_raises(db1):
    with pytest.raises(RuntimeError):
        Client().get("/boom/")
    assert get_semaphore("boom").available_permits() == 1
    with pytest.raises(RuntimeError):  # not a 429: the permit is free again
        Client().get("/boom/")


def test_busy_status_can_be_set_and_retry_after_follows_a_leased_permit(db1):
    sem = get_semaphore("teapot", permits=1)
    permit = sem.try_acquire(lease_time=2.2)
    assert permit is not None
    busy = Client().get("/teapot/")
    assert busy.status_code == 503 and busy["Retry-After"] == "3"  # 2.2 s left, rounded up
    sem.release(permit)
    assert Client().get("/teapot/").status_code == 200


def test_async_view_n_plus_one_one_429(db1):
    async def run() -> list[Any]:
        aevent["go"] = asyncio.Event()
        client = AsyncClient()
        tasks = [asyncio.ensure_future(client.get("/aexport/1/")) for _ in range(3)]
        done, _ = await asyncio.wait(tasks, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        for _ in range(500):
            if inside.get("aexport:1") == 2:
                break
            await asyncio.sleep(0.01)
        aevent["go"].set()
        return list(await asyncio.gather(*tasks))

    responses = asyncio.run(run())
    assert sorted(r.status_code for r in responses) == [200, 200, 429]
    busy = next(r for r in responses if r.status_code == 429)
    assert 1 <= int(busy["Retry-After"]) <= 30
    assert worst == {"aexport:1": 2}
    assert get_semaphore("aexport:1").available_permits() == 2


def test_plain_function_raise_skip_wait_and_callable(holders):
    @limited("fn:{n}", permits=1, on_busy="raise")
    def fn(n: int) -> str:
        return "ran"

    assert fn(1) == "ran"
    sem = get_semaphore("fn:1")
    permit = sem.try_acquire()
    with pytest.raises(LockBusy) as err:
        fn(1)
    assert err.value.name == "fn:1" and "no free permit (all 1 taken" in str(err.value)
    assert 29 < err.value.ttl <= 30

    @limited("fn:{n}", permits=1, on_busy=lambda busy, n: f"busy {busy.name}")
    def fn2(n: int) -> str:
        return "ran"

    assert fn2(1) == "busy fn:1"

    @limited("fn:{n}", permits=1, wait=10)
    def waiter(n: int) -> str:
        return "ran"

    timer = threading.Timer(0.3, sem.release, (permit,))
    timer.start()
    assert waiter(1) == "ran"  # waited, woken by the release
    timer.join()
    assert sem.available_permits() == 1


def test_skip_logs_the_permit_holders(caplog):
    @limited("sk", permits=1, on_busy="skip")
    def sk() -> str:
        return "ran"

    sem = get_semaphore("sk", permits=1)
    sem.try_acquire()
    caplog.set_level("INFO", logger="django_rlock")
    assert sk() is None
    assert any("'sk'" in r.getMessage() and "1 permit holders (0 of 1 permits free)"
               in r.getMessage() for r in caplog.records)


def test_a_different_stored_count_is_kept_and_logged(db1, caplog):
    get_semaphore("deploy", permits=5)

    @limited("deploy", permits=2)
    def run() -> int:
        return get_semaphore("deploy").available_permits()

    caplog.set_level(logging.WARNING, logger="django_rlock")
    assert run() == 4  # five permits, one taken
    assert any("semaphore 'deploy' has 5 permits, not the 2 of @limited(permits=2)"
               in r.getMessage() and "add_permits(-3)" in r.getMessage() for r in caplog.records)
    assert get_semaphore("deploy").available_permits() == 5


def test_a_deleted_semaphore_is_set_up_again(db1):
    @limited("gone", permits=2, on_busy="raise")
    def run() -> str:
        return "ran"

    assert run() == "ran"
    db1.delete(KEY + "gone")  # `locks clear`, or a flush
    assert run() == "ran"
    assert get_semaphore("gone").available_permits() == 2


@pytest.mark.django_db(transaction=True)
def test_permit_held_until_commit(db1):
    @limited("tx", permits=1)
    def run() -> None: ...

    with transaction.atomic():
        run()
        assert get_semaphore("tx").available_permits() == 0
    assert get_semaphore("tx").available_permits() == 1


def test_plain_client(redis_server):
    with redis_server.client(db=7) as c:
        c.flushdb()

        @limited("pc", permits=1, client=c, prefix="p:", on_busy="raise")
        def run() -> int:
            return int(c.get("p:pc"))

        assert run() == 0 and int(c.get("p:pc")) == 1


def test_bad_input_fails_when_decorating():
    with pytest.raises(ValueError, match=r"permits must be >= 1, got 0 \(semaphore 'x:\{n\}'\)"):
        limited("x:{n}", permits=0)
    with pytest.raises(TypeError, match="permits must be an int"):
        limited("x", permits="2")
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'permits'"):
        limited("x")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="one cache alias, not a list"):
        limited("x", permits=1, cache=["default", "builtin"])
    with pytest.raises(ValueError, match="on_busy must be one of"):
        limited("x", permits=1, on_busy="later")
    with pytest.raises(ValueError, match="wait must be a finite number"):
        limited("x", permits=1, wait=-1)
    with pytest.raises(ValueError, match="on_busy='wait' needs wait > 0"):
        limited("x", permits=1, on_busy="wait")
    with pytest.raises(ValueError, match="'pk', which is not a parameter"):
        @limited("x:{pk}", permits=1)
        def f(n: int) -> None: ...
