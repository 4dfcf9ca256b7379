"""@locked on views (sync, async, class-based) and plain functions, against a real Redis."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading

import pytest
from django.test import AsyncClient, Client

from django_rlock import LockBusy, LockReentryError, RLock, get_lock, locked
from tests.conftest import script_calls
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


def test_same_pk_one_runs_the_other_gets_423_different_pk_runs(db1, settings):
    settings.RLOCK = {"BUSY_RETRY_AFTER": "ttl"}  # not the estimate from earlier tests' holds
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


def test_retry_after_rounds_the_holders_ttl_up(hold, holders, settings):
    settings.RLOCK = {"BUSY_RETRY_AFTER": "ttl"}
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


@pytest.mark.django_db(transaction=True)
def test_async_view_named_after_the_logged_in_user(db1, django_user_model):
    """README's async example: the name reads ``request.user``, which a logged-in request
    loads from the database, which Django refuses on the event loop's thread. It once
    answered 500 (SynchronousOnlyOperation) to every logged-in user."""
    ann = django_user_model.objects.create_user("ann", password="pw")

    async def main():
        client = AsyncClient()
        await client.aforce_login(ann)
        return await asyncio.gather(client.get("/auser/"), client.get("/auser/"))

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200, 200]
    assert {r.content for r in responses} == {f"auser:{ann.pk}".encode()}
    assert views.worst == {f"auser:{ann.pk}": 1}  # the one user's requests took turns
    assert not db1.exists(f"demo:rlock:auser:{ann.pk}")


def test_non_reentrant_locked_call_asking_again_raises_reentry_not_busy(db1):
    """``@locked(kind="non_reentrant")`` calling itself: docs/django.md promises
    ``LockReentryError``; ``try_lock()``'s False once made it a ``LockBusy`` ("held by
    someone else"), which a view answers 423."""

    @locked("nr:{n}", kind="non_reentrant")
    def again(n: int, depth: int = 0) -> int:
        return again(n, depth + 1) if depth == 0 else depth

    @locked("anr:{n}", kind="non_reentrant")
    async def aagain(n: int, depth: int = 0) -> int:
        return await aagain(n, depth + 1) if depth == 0 else depth

    with pytest.raises(LockReentryError, match="nr:1"):
        again(1)
    assert not db1.exists("demo:rlock:nr:1")  # the outer call's hold was released
    with pytest.raises(LockReentryError, match="anr:2"):
        asyncio.run(aagain(2))
    assert not db1.exists("demo:rlock:anr:2")


@pytest.mark.parametrize("kwargs, error, text", [
    ({"lease": 10, "max_hold": 5}, ValueError, "longer than max_hold"),
    ({"dedupe": "yes"}, TypeError, "dedupe must be True or False"),
    ({"until_commit": "no"}, TypeError, "until_commit must be True or False"),
    ({"dedupe": 2}, TypeError, r"dedupe must be True or False \(or 1 or 0\), not 2"),
    ({"cache": 5}, TypeError, "cache must be a cache alias"),
])
def test_bad_options_are_refused_when_decorating(kwargs, error, text):
    with pytest.raises(error, match=text):
        locked("opt:{n}", **kwargs)


def test_zero_and_one_still_pass_for_the_flags():
    assert locked("flags:{n}", dedupe=1, until_commit=0).__closure__ is not None


def test_a_bad_conversion_in_the_template_is_refused_when_decorating():
    with pytest.raises(ValueError, match=r"!z"):
        locked("cv:{pk!z}")
    locked("cv:{pk!r}")  # the real ones are fine


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


# -- the call planned at decoration time (#22) --------------------------------------------------
class _Obj:
    def __init__(self, **attrs: object) -> None:
        self.__dict__.update(attrs)


def _both_names(template: str, func, *args, **kwargs) -> tuple[str, str]:
    """The name ``@locked`` builds for this call, and the one ``Signature.bind`` gives."""
    from django_rlock.decorators import LockSpec

    spec = LockSpec(template, 0, None, None, None, object(), None, None, False)
    sig = inspect.signature(func)
    spec.check_signature(func, sig)
    return spec.name_builder(func, sig)(args, kwargs), spec.name_for(func, sig, args, kwargs)


def test_names_picked_from_the_call_are_the_bound_arguments_names():
    def view(request, pk, fmt="csv", *, page=1, **extra):
        pass

    def plain(a, b=2, /, c=3, *rest, d, **kw):
        pass

    request = _Obj(user=_Obj(pk=7))
    cases = [
        ("r:{pk}", view, (request, 5), {}),
        ("r:{pk}", view, (request,), {"pk": 5}),
        ("r:{pk}:{fmt}:{page}", view, (request, 5), {}),
        ("r:{pk}:{fmt}:{page}", view, (request, 5, "pdf"), {"page": 3}),
        ("r:{fmt}:{pk}", view, (), {"request": request, "pk": 1, "fmt": "x"}),
        ("u:{request.user.pk}:{pk!r}:{pk:>4}", view, (request, "9"), {}),
        ("e:{slug}", view, (request, 1), {"slug": "abc"}),  # through **extra
        ("i:{extra[k]}", view, (request, 1), {"k": 1}),  # **kwargs itself, whole: bound
        ("i:{extra}", view, (request, 1), {"extra": 2}),  # the dict, not a keyword "extra"
        ("p:{a}:{b}:{c}:{d}", plain, (1,), {"d": 4}),  # positional-only: bound
        ("p:{c}:{d}:{rest}", plain, (1, 2, 3, 4, 5), {"d": 4}),  # *args: bound
        ("p:{c}:{d}", plain, (1, 2), {"d": 4, "c": 8}),
    ]
    for template, func, args, kwargs in cases:
        try:
            fast, bound = _both_names(template, func, *args, **kwargs)
        except ValueError as exc:
            fast = bound = str(exc)
        assert fast == bound, (template, args, kwargs)
    assert _both_names("u:{request.user.pk}:{pk}", view, request, 3) == ("u:7:3", "u:7:3")
    assert _both_names("i:{extra[k]}", view, request, 1, k=5) == ("i:5", "i:5")
    assert _both_names("i:{extra}", view, request, 1, extra=2) == ("i:{'extra': 2}",) * 2


def test_a_template_may_read_the_var_keyword_parameter_itself(db1):
    """``"kw:{opts[mode]}"`` over ``def kw(self, **opts)``: the bound arguments hold the
    ``**opts`` dict (every call used to fail with ``KeyError: 'opts'``), for @locked,
    @limited and @rate_limited alike (one LockSpec)."""
    from django_rlock import limited, rate_limited

    seen: list[list[str]] = []

    class Svc:
        @locked("kw:{opts[mode]}")
        def run(self, **opts: str) -> None:
            seen.append(sorted(k.decode() for k in db1.keys("demo:rlock:kw*")))

        @limited("lkw:{opts[mode]}", permits=1)
        def lim(self, **opts: str) -> str:
            return opts["mode"]

        @rate_limited("rkw:{opts[mode]}", rate="5/s")
        def rate(self, **opts: str) -> str:
            return opts["mode"]

    Svc().run(mode="fast")
    assert seen == [["demo:rlock:kw:fast"]]
    assert (Svc().lim(mode="a"), Svc().rate(mode="b")) == ("a", "b")
    assert {k.decode() for k in db1.keys("demo:rlock:*kw:*")} >= {"demo:rlock:lkw:a",
                                                                 "demo:rlock:rkw:b"}
    with pytest.raises(ValueError, match=r"cannot build the lock name 'kw:\{opts\[mode\]\}' "
                                         r"for .*Svc.run\(\): KeyError: 'mode'"):
        Svc().run(speed=1)


def test_a_name_that_cannot_be_built_fails_the_same_either_way():
    def view(request, pk):
        pass

    for template, args, kwargs in [("r:{pk}", (object(),), {}),  # pk missing
                                   ("r:{pk.nope}", (object(), 1), {}),
                                   ("r:{request[0]}", (object(), 1), {})]:
        errors = []
        for way in ("name_builder", "name_for"):
            from django_rlock.decorators import LockSpec

            spec = LockSpec(template, 0, None, None, None, object(), None, None, False)
            sig = inspect.signature(view)
            build = (spec.name_builder(view, sig) if way == "name_builder"
                     else lambda a, k, spec=spec, sig=sig: spec.name_for(view, sig, a, k))
            with pytest.raises(ValueError, match="cannot build the lock name") as err:
                build(args, kwargs)
            errors.append(str(err.value))
        assert errors[0] == errors[1]


def test_a_call_that_does_not_fit_the_signature_is_refused_before_any_command(db1, r):
    """Bad input never takes a lock: a call that cannot bind (too many arguments, an unknown,
    doubled or missing one) raises the decorator's ValueError naming the lock's template and
    bind's reason, with no Redis command sent."""
    @locked("fit:{n}")
    def job(n: int, *, flag: bool = False) -> int:
        return n

    r.config_resetstat()
    for args, kwargs in (((1, 2), {}), ((1,), {"nope": 1}), ((1,), {"n": 2}), ((), {}),
                         ((), {"flag": True})):
        with pytest.raises(ValueError, match="cannot build the lock name 'fit:{n}'"):
            job(*args, **kwargs)
    assert script_calls(r) == 0
    assert not db1.keys("demo:rlock:fit*")
    assert job(n=3) == 3 and job(4, flag=True) == 4


def test_settings_changed_after_decorating_are_followed(settings, redis_server, db1):
    @locked("moved:{n}")
    def where(n: int) -> list:
        return sorted(k.decode() for k in db1.keys("*moved*"))

    assert where(1) == ["demo:rlock:moved:1"]
    settings.RLOCK = {"PREFIX": "p2:"}
    assert where(1) == ["p2:moved:1"]
    settings.RLOCK = {"CACHE": "builtin"}  # another database of the server: not in db1
    assert where(1) == []
    with redis_server.client(db=2) as db2:
        @locked("seen:{n}")
        def there(n: int) -> list:
            return [k.decode() for k in db2.keys("*seen*")]

        assert there(2) == ["site2:rlock:seen:2"]
    settings.RLOCK = {"BUSY_STATUS": 409}
    assert where(1) == ["demo:rlock:moved:1"]


def test_an_unknown_cache_alias_fails_when_decorating_naming_the_decorator(r):
    from django.core.exceptions import ImproperlyConfigured

    from django_rlock import limited, rate_limited

    for make, text in [(lambda: locked("a:{n}", cache="nope"), r"@locked\('a:\{n\}', cache='nope'\)"),
                       (lambda: locked("a:{n}", cache=["default", "nope"]),
                        r"@locked\('a:\{n\}', cache=\['default', 'nope'\]\)"),
                       (lambda: limited("l:{n}", permits=1, cache="nope"),
                        r"@limited\('l:\{n\}', cache='nope'\)"),
                       (lambda: rate_limited("r:{n}", cache="nope"),
                        r"@rate_limited\('r:\{n\}', cache='nope'\)")]:
        with pytest.raises(ImproperlyConfigured, match=text + ": the cache alias 'nope' is not in "
                                                       r"settings.CACHES \(set cache= to one of"):
            make()
    assert script_calls(r) == 0  # refused before any Redis command


def test_an_alias_gone_after_decorating_fails_at_the_call_until_it_is_back(settings,
                                                                           redis_server):
    from django.core.exceptions import ImproperlyConfigured

    from tests.django.conftest import caches_for

    settings.CACHES = {**caches_for(redis_server), "later": caches_for(redis_server)["default"]}

    @locked("a:{n}", cache="later")
    def job(n: int) -> int:
        return n

    assert job(1) == 1
    settings.CACHES = caches_for(redis_server)
    with pytest.raises(ImproperlyConfigured, match=r"@locked\('a:\{n\}', cache='later'\): the "
                                                   "cache alias 'later' is not in"):
        job(1)
    settings.CACHES = {**caches_for(redis_server), "later": caches_for(redis_server)["default"]}
    assert job(1) == 1


def test_an_alias_decorated_before_the_settings_load_is_checked_at_the_first_call():
    """Decorators run at import, maybe before ``django.setup()``: the check then waits for
    the first call (reading the settings at import would load them too early)."""
    code = ("from django_rlock import locked\n"
            "job = locked('a:{n}', cache='nope')(lambda n: n)\n"
            "from django.conf import settings\n"
            "settings.configure(CACHES={'default': {'BACKEND': "
            "'django.core.cache.backends.locmem.LocMemCache'}})\n"
            "import django; django.setup()\n"
            "try:\n    job(1)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.startswith("ImproperlyConfigured django-rlock: @locked('a:{n}', "
                                 "cache='nope'): the cache alias 'nope' is not in"), out.stderr


def test_dedupe_outside_any_task_warns_once_and_on_a_coroutine_fails_when_decorating(caplog, db1):
    """``dedupe=True`` refuses a Celery task's duplicate enqueues: on a plain function it
    does nothing, which its first call says (once); an ``async def`` is never a task."""

    @locked("d:{n}", dedupe=True)
    def plain(n: int) -> int:
        return n

    with caplog.at_level("WARNING", logger="django_rlock"):
        assert (plain(1), plain(2)) == (1, 2)
    [line] = [r.getMessage() for r in caplog.records if "dedupe=True" in r.getMessage()]
    assert line.startswith("django-rlock: @locked('d:{n}', dedupe=True) does nothing for "
                           "test_dedupe_outside_any_task_warns_once_and_on_a_coroutine_fails_"
                           "when_decorating.<locals>.plain(), called outside any Celery task")
    with pytest.raises(TypeError, match=r"dedupe=True\) on the coroutine function .*\.job\(\): "
                                        "de-duplication is for Celery tasks"):
        @locked("d:{n}", dedupe=True)
        async def job(n: int) -> int:
            return n


def test_a_view_call_is_never_looked_up_as_a_task(monkeypatch, db1):
    """A request first means a view: Celery's current-task lookup is skipped for it."""
    from django.test import RequestFactory

    from django_rlock import decorators

    calls: list = []
    hooks = decorators._task_hooks
    if hooks is not None:
        monkeypatch.setattr(decorators, "_task_hooks", hooks._replace(
            task_of=lambda args, wrapper: calls.append(args) or hooks.task_of(args, wrapper)))

    @locked("v:{pk}")
    def view(request, pk):
        return pk

    @locked("f:{n}")
    def func(n):
        return n

    assert view(RequestFactory().get("/"), pk=1) == 1
    assert calls == []
    assert func(2) == 2
    assert calls == ([(2,)] if hooks is not None else [])


def test_async_client_detection():
    import redis
    import redis.asyncio

    from django_rlock.decorators import is_async_client

    assert not is_async_client(redis.Redis())
    assert is_async_client(redis.asyncio.Redis())
    assert not is_async_client(object())
