"""@locked on views (sync, async, class-based) and plain functions, against a real Redis."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading

import pytest
from django.test import AsyncClient, Client

from django_rlock import LockBusy, RLock, get_lock, locked
from tests.django import views

pytestmark = pytest.mark.urls("tests.django.views")


@pytest.fixture(autouse=True)
def _reset_views():
    views.reset()
    yield
    views.release.set()


def get_in_thread(url: str) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        out.append(Client().get(url))

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_same_pk_one_runs_the_other_gets_423_different_pk_runs(db1):
    first, first_out = get_in_thread("/report/1/")
    assert views.entered.wait(5)
    views.entered.clear()
    busy = Client().get("/report/1/")
    assert busy.status_code == 423
    assert busy["Retry-After"] == "30"  # whole seconds left on the holder's 30 s watchdog lease
    other, other_out = get_in_thread("/report/2/")
    assert views.entered.wait(5)  # a different pk is a different lock: it runs meanwhile
    assert db1.exists("demo:rlock:report:1") and db1.exists("demo:rlock:report:2")
    views.release.set()
    first.join(10)
    other.join(10)
    assert first_out[0].status_code == 200 and other_out[0].status_code == 200
    assert views.worst == {"report:1": 1, "report:2": 1}
    assert not db1.exists("demo:rlock:report:1")  # released when the view returned


def test_retry_after_rounds_the_holders_ttl_up(hold, holders):
    lock = get_lock("report:7")
    h = holders()
    h.call(lambda: lock.lock(lease_time=2.2))
    response = Client().get("/report/7/")
    assert response.status_code == 423 and response["Retry-After"] == "3"
    h.call(lock.unlock)


def test_busy_status_is_configurable(settings, hold):
    hold(get_lock("report:3"))
    settings.RLOCK = {"BUSY_STATUS": 409}
    assert Client().get("/report/3/").status_code == 409
    hold(get_lock("user:None:4"))
    assert Client().get("/user/4/").status_code == 503  # the decorator's own status wins


def test_lock_is_released_when_the_view_raises(db1):
    with pytest.raises(RuntimeError):
        Client().get("/boom/")
    assert not db1.exists("demo:rlock:boom")


def test_template_can_reach_attributes(db1):
    assert Client().get("/user/5/").json() == {"user": None, "pk": 5}


def test_class_based_view(db1):
    first, out = get_in_thread("/cbv/9/")
    assert views.entered.wait(5)
    assert Client().get("/cbv/9/").status_code == 423
    views.release.set()
    first.join(10)
    assert out[0].status_code == 200 and out[0].content == b"cbv 9"
    assert views.worst == {"cbv:9": 1}


def test_async_view_twenty_concurrent_requests_never_overlap(db1):
    async def main():
        client = AsyncClient()
        return await asyncio.gather(*(client.get("/areport/1/") for _ in range(20)))

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 20
    # All twenty ran on one event loop (one thread); task ownership kept them apart.
    assert views.worst == {"areport:1": 1}


def test_async_view_busy_gets_423(db1):
    async def main():
        client = AsyncClient()
        return await asyncio.gather(*(client.get("/aonce/1/") for _ in range(5)))

    codes = sorted(r.status_code for r in asyncio.run(main()))
    assert codes == [200, 423, 423, 423, 423]
    assert views.worst == {"aonce:1": 1}


# -- plain functions ----------------------------------------------------------------------------
def test_plain_function_raises_lock_busy_with_name_and_ttl(hold):
    @locked("job:{n}")
    def job(n: int) -> int:
        return n * 2

    assert job(3) == 6
    hold(get_lock("job:4"))
    with pytest.raises(LockBusy) as err:
        job(4)
    assert err.value.name == "job:4" and 29 < err.value.ttl <= 30


def test_on_busy_skip_and_callable(hold):
    @locked("s:{n}", on_busy="skip")
    def skipped(n: int) -> str:
        return "ran"

    @locked("s:{n}", on_busy=lambda busy, n: f"busy {busy.name} {n}")
    def handled(n: int) -> str:
        return "ran"

    hold(get_lock("s:1"), thread="request-17")
    assert skipped(1) is None
    assert handled(1) == "busy s:1 1"
    assert skipped(2) == "ran"


def test_skip_log_says_who_holds_it_and_busy_events_carry_the_template(hold, caplog):
    from django_rlock.engine import events

    @locked("report:{n}", on_busy="skip")
    def report(n: int) -> str:
        return "ran"

    seen: list = []
    listener = lambda event, data: seen.append((event, data["name"], data["label"]))  # noqa: E731
    events.add_listener(listener)
    try:
        hold(get_lock("report:9"), thread="request-17")
        caplog.set_level("INFO", logger="django_rlock")
        assert report(9) is None
        assert report(8) == "ran"
    finally:
        events.remove_listener(listener)
    [line] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert "'report:9'" in line and "thread request-17" in line and f"pid {os.getpid()}" in line
    assert ("busy", "report:9", "report:{n}") in seen
    assert ("acquired", "report:8", "report:{n}") in seen  # labelled by template, not name


def test_wait_budget_then_busy(hold):
    @locked("w", wait=0.4)
    def work() -> None:
        pass

    hold(get_lock("w"))
    import time

    start = time.monotonic()
    with pytest.raises(LockBusy):
        work()
    assert 0.35 < time.monotonic() - start < 3


def test_reentrant_calls_in_one_thread():
    @locked("outer:{n}")
    def outer(n: int) -> int:
        return inner(n)

    @locked("outer:{n}")
    def inner(n: int) -> int:
        return get_lock(f"outer:{n}").hold_count()

    assert outer(1) == 2


def test_wraps_name_doc_and_signature():
    @locked("x:{a}")
    def f(a: int, b: str = "z") -> str:
        """Docs."""
        return b

    assert f.__name__ == "f" and f.__doc__ == "Docs."
    assert inspect.signature(f) == inspect.signature(f.__wrapped__)
    assert list(inspect.signature(f).parameters) == ["a", "b"]


def test_template_errors_are_caught_when_decorating():
    with pytest.raises(ValueError, match="'pk'"):
        @locked("report:{pk}")
        def f(request, id):
            pass

    with pytest.raises(ValueError, match="positional"):
        locked("report:{}")
    with pytest.raises(ValueError, match="positional"):
        locked("report:{0}")
    with pytest.raises(ValueError):
        locked("")
    with pytest.raises(TypeError):
        locked(42)
    with pytest.raises(ValueError):
        locked("x", wait=-1)
    with pytest.raises(ValueError):
        locked("x", lease=0)
    with pytest.raises(ValueError, match="on_busy"):
        locked("x", on_busy="explode")
    with pytest.raises(ValueError, match="wait > 0"):
        locked("x", on_busy="wait")


def test_template_error_at_call_time_names_the_template():
    @locked("x:{a.missing}")
    def f(a: object) -> None:
        pass

    with pytest.raises(ValueError, match="x:{a.missing}"):
        f(object())


def test_callable_template_and_plain_client(redis_server):
    client = redis_server.client(db=5)

    @locked(lambda order: f"order:{order['id']}", client=client, prefix="p:")
    def ship(order: dict) -> bool:
        return RLock(client, f"order:{order['id']}", "p:").is_held_by_current_thread()

    assert ship({"id": 8}) is True
    assert not client.exists("p:order:8")
    client.close()
