"""Every lock kind through ``get_lock(kind=...)`` and ``@locked(kind=...)``, on a real Redis."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_rlock import LockBusy, RLock, get_lock, locked
from django_rlock.factory import get_latch, get_semaphore

pytestmark = pytest.mark.urls(__name__)

KEY = "demo:rlock:"


# -- views ------------------------------------------------------------------------------------
inside: dict[str, int] = {}
worst: dict[str, int] = {}
gate = threading.Barrier(2, timeout=10)
_guard = threading.Lock()


def enter(name: str) -> None:
    with _guard:
        inside[name] = inside.get(name, 0) + 1
        worst[name] = max(worst.get(name, 0), inside[name])


def leave(name: str) -> None:
    with _guard:
        inside[name] -= 1


@locked("doc:{pk}", kind="read")
def read_doc(request: HttpRequest, pk: int) -> HttpResponse:
    enter(f"doc:{pk}")
    try:
        gate.wait()  # both readers are inside at once, or this times out
        return HttpResponse("read")
    finally:
        leave(f"doc:{pk}")


@locked("doc:{pk}", kind="write")
def write_doc(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("written")


@locked("job:{pk}", kind="fenced")
def fenced_job(request: HttpRequest, pk: int, fence_token: int | None = None) -> HttpResponse:
    lock = get_lock(f"job:{pk}", kind="fenced")
    return JsonResponse({"token": fence_token, "last": lock.get_token(),
                         "held": lock.is_held_by_current_thread()})


@locked("ajob:{pk}", kind="fenced")
async def afenced_job(request: HttpRequest, pk: int, fence_token: int | None = None) -> HttpResponse:
    return JsonResponse({"token": fence_token})


@locked("adoc:{pk}", kind="read")
async def aread_doc(request: HttpRequest, pk: int) -> HttpResponse:
    enter(f"adoc:{pk}")
    await asyncio.sleep(0.2)
    leave(f"adoc:{pk}")
    return HttpResponse("read")


@locked("adoc:{pk}", kind="write")
async def awrite_doc(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("written")


@locked("queue:{pk}", kind="fair")
def fair_view(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("fair")


urlpatterns = [
    path("read/<int:pk>/", read_doc),
    path("write/<int:pk>/", write_doc),
    path("fenced/<int:pk>/", fenced_job),
    path("afenced/<int:pk>/", afenced_job),
    path("aread/<int:pk>/", aread_doc),
    path("awrite/<int:pk>/", awrite_doc),
    path("fair/<int:pk>/", fair_view),
]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    inside.clear()
    worst.clear()
    gate.reset()
    yield


def in_thread(url: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(Client().get(url)))
    t.start()
    return t, out


# -- get_lock(kind=...) -----------------------------------------------------------------------
def test_get_lock_builds_each_kind_at_the_cache_prefix(db1, holders):
    from django_rlock.engine.fenced import FencedLock
    from django_rlock.engine.rwlock import ReadLock, WriteLock

    plain = get_lock("k")
    assert type(plain) is RLock and plain.key == KEY + "k"
    fenced = get_lock("k2", kind="fenced", label="k2-label")
    assert isinstance(fenced, FencedLock) and fenced.key == KEY + "k2"
    assert fenced.label == "k2-label" and fenced.watchdog_timeout == 30.0
    token = fenced.lock_and_get_token()
    assert db1.get("redisson_lock_token:{" + KEY + "k2}") == str(token).encode()
    fenced.unlock()
    read, write = get_lock("rw", kind="read"), get_lock("rw", kind="write")
    assert isinstance(read, ReadLock) and isinstance(write, WriteLock)
    assert read.key == write.key == KEY + "rw"
    # Two readers on two threads together; a writer elsewhere is refused meanwhile.
    a, b = holders(), holders()
    a.call(read.lock)
    b.call(get_lock("rw", kind="read").lock)
    assert db1.hget(KEY + "rw", "mode") == b"read"
    assert not get_lock("rw", kind="write").try_lock()
    a.call(read.unlock)
    b.call(read.unlock)
    assert write.try_lock() and db1.hget(KEY + "rw", "mode") == b"write"
    write.unlock()


def test_get_lock_kind_uses_the_other_cache_and_settings(settings, redis_server):
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 7.0, "SYNC_REPLICAS": None}
    lock = get_lock("x", kind="write", cache="builtin")
    assert lock.key == "site2:rlock:x" and lock.watchdog_timeout == 7.0
    assert lock.sync_replicas is None
    with lock:
        with redis_server.client(db=2) as c:
            assert c.hget("site2:rlock:x", "mode") == b"write"


def test_get_lock_fair(db1, holders):
    from django_rlock.engine.fair import FairLock

    lock = get_lock("f", kind="fair")
    assert isinstance(lock, FairLock) and lock.key == KEY + "f"
    holders().call(lock.lock)
    assert not get_lock("f", kind="fair").try_lock()


@pytest.mark.parametrize("kind", ["Fair", "readwrite", "", 3, "semaphore"])
def test_bad_kind_is_refused_before_any_redis_command(settings, kind):
    # A dead server: anything sent would fail with a connection error, not this ValueError.
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:1/0"}}
    with pytest.raises(ValueError, match=r"kind must be None, 'fair'.*\(lock 'n'\)"):
        get_lock("n", kind=kind)
    with pytest.raises(ValueError, match="kind must be"):
        locked("n", kind=kind)


def test_kind_with_several_caches_is_refused():
    with pytest.raises(ValueError, match="kind='fenced' cannot span several caches"):
        get_lock("n", kind="fenced", cache=["default", "builtin"])
    with pytest.raises(ValueError, match="kind='read' cannot span several caches"):
        locked("n", kind="read", cache=["default", "builtin"])
    get_lock("n", cache=["default", "builtin"])  # kind None: a MultiLock, as before


def test_one_server_factories_refuse_a_list_of_caches_naming_the_object(settings):
    # A dead server: anything sent would fail with a connection error, not this TypeError
    # (it was "unhashable type: 'list'", naming nothing).
    from django_rlock import get_rate_limiter

    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:1/0"}}
    for make, what in ((get_semaphore, "semaphore 's'"), (get_latch, "latch 's'"),
                       (get_rate_limiter, "rate limiter 's'")):
        with pytest.raises(TypeError, match=rf"cache must be a cache alias \(str\) or None, "
                                            rf"not list \({what}\)"):
            make("s", cache=["default"])
        with pytest.raises(TypeError, match=rf"not int \({what}\)"):
            make("s", cache=5)


def test_a_force_unlocked_hold_is_reported_in_plain_words(caplog, db1):
    lock = get_lock("fu")
    lock.lock()
    assert get_lock("fu").force_unlock() is True
    said = [r.getMessage() for r in caplog.records if "was lost" in r.getMessage()]
    assert len(said) == 1 and "lock 'fu' (key 'demo:rlock:fu') was lost (force-unlocked) " \
                              "while held by " in said[0], said
    assert lock.is_lost()


# -- @locked(kind=...) on views -----------------------------------------------------------------
def test_read_views_run_together_and_a_write_view_is_turned_away(db1):
    first, out1 = in_thread("/read/1/")
    second, out2 = in_thread("/read/1/")  # both pass the barrier only if both are inside
    first.join(15)
    second.join(15)
    assert [o[0].status_code for o in (out1, out2)] == [200, 200]
    assert worst == {"doc:1": 2}
    assert not db1.exists(KEY + "doc:1")


def test_write_view_busy_while_read_held_gets_423_with_retry_after(holders):
    holders().call(get_lock("doc:2", kind="read").lock)
    busy = Client().get("/write/2/")
    assert busy.status_code == 423 and busy["Retry-After"] == "30"
    assert b"is busy" in busy.content and b"doc:2" not in busy.content
    # And the other way round: a writer keeps readers out.
    holders().call(get_lock("doc:3", kind="write").lock)
    refused = Client().get("/read/3/")  # refused at once, never reaches the barrier
    assert refused.status_code == 423


def test_fenced_view_receives_a_growing_token(db1):
    tokens = [Client().get("/fenced/5/").json() for _ in range(3)]
    got = [t["token"] for t in tokens]
    assert got[0] < got[1] < got[2]  # growing (from the server clock: not 1, 2, 3)
    assert all(t["held"] for t in tokens)
    # get_token() reads the last token handed out (by anyone): this acquire's.
    assert [t["last"] for t in tokens] == got
    assert not db1.exists(KEY + "job:5")


def test_fenced_token_is_the_decorators_even_if_the_caller_passes_one(db1):
    @locked("direct", kind="fenced")
    def direct(fence_token: int | None = None) -> int | None:
        return fence_token

    first = direct()
    second = direct(fence_token=99)  # supplied by the decorator, never by the caller
    assert 99 < first < second
    assert int(db1.get("redisson_lock_token:{" + KEY + "direct}")) == second


def test_fenced_function_without_the_parameter_runs_and_one_without_default_is_refused():
    @locked("plain", kind="fenced")
    def plain(x: int) -> int:
        return x

    assert plain(3) == 3
    with pytest.raises(ValueError, match="give it a default"):
        @locked("nodefault", kind="fenced")
        def nodefault(fence_token: int) -> None: ...


def test_fenced_busy_is_lock_busy_for_plain_functions(holders):
    @locked("fb", kind="fenced")
    def fb(fence_token: int | None = None) -> int | None:
        return fence_token

    holders().call(get_lock("fb", kind="fenced").lock)
    with pytest.raises(LockBusy) as err:
        fb()
    assert err.value.name == "fb" and 29 < err.value.ttl <= 30


def test_async_views_of_each_kind(db1, holders):
    async def run() -> list[Any]:
        client = AsyncClient()
        reads = await asyncio.gather(*(client.get("/aread/1/") for _ in range(4)))
        tokens = [(await client.get("/afenced/1/")).json()["token"] for _ in range(2)]
        return [reads, tokens]

    reads, tokens = asyncio.run(run())
    assert [r.status_code for r in reads] == [200] * 4
    assert worst["adoc:1"] >= 2  # readers overlapped (each sleeps 0.2 s)
    assert None not in tokens and tokens[0] < tokens[1]
    holders().call(get_lock("adoc:2", kind="read").lock)
    busy = asyncio.run(AsyncClient().get("/awrite/2/"))
    assert busy.status_code == 423 and busy["Retry-After"] == "30"
    assert not db1.exists(KEY + "adoc:1") and not db1.exists(KEY + "ajob:1")


def test_fair_view_and_function(db1, holders):
    assert Client().get("/fair/1/").status_code == 200
    holders().call(get_lock("queue:2", kind="fair").lock)
    assert Client().get("/fair/2/").status_code == 423

    @locked("fq:{n}", kind="fair", wait=10)
    def fq(n: int) -> str:
        return "ran"

    lock = get_lock("fq:1", kind="fair")
    h = holders()
    h.call(lambda: lock.lock(lease_time=0.5))
    assert fq(1) == "ran"  # waited its turn


def test_locked_kinds_with_a_plain_client(redis_server):
    with redis_server.client(db=7) as c:
        c.flushdb()

        @locked("pc:{n}", kind="write", client=c, prefix="p:")
        def w(n: int) -> bytes:
            return c.hget(f"p:pc:{n}", "mode")

        assert w(1) == b"write" and not c.exists("p:pc:1")

        @locked("pf", kind="fenced", client=c)
        def f(fence_token: int | None = None) -> int | None:
            return fence_token

        first, second = f(), f()
        assert first is not None and second is not None and first < second


@pytest.mark.django_db(transaction=True)
def test_kinds_keep_until_commit(db1):
    @locked("tw:{n}", kind="write")
    def w(n: int) -> None: ...

    @locked("tf:{n}", kind="fenced")
    def f(n: int, fence_token: int | None = None) -> int | None:
        return fence_token

    with transaction.atomic():
        w(1)
        assert f(1) == int(db1.get("redisson_lock_token:{" + KEY + "tf:1}"))
        assert db1.hget(KEY + "tw:1", "mode") == b"write" and db1.exists(KEY + "tf:1")
    assert not db1.exists(KEY + "tw:1") and not db1.exists(KEY + "tf:1")


# -- get_semaphore / get_latch ------------------------------------------------------------------
def test_get_semaphore_sets_permits_once(db1):
    from django_rlock.engine.semaphore import PermitExpirableSemaphore

    sem = get_semaphore("exports", permits=3)
    assert isinstance(sem, PermitExpirableSemaphore) and sem.key == KEY + "exports"
    assert sem.available_permits() == 3
    permit = sem.acquire()
    assert get_semaphore("exports", permits=5).available_permits() == 2  # kept its own
    assert get_semaphore("exports").available_permits() == 2
    sem.release(permit)
    assert sem.available_permits() == 3


def test_get_semaphore_bad_permits_before_any_command(settings):
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:1/0"}}
    with pytest.raises(ValueError, match=r"permits must be >= 1, got 0 \(semaphore 's'\)"):
        get_semaphore("s", permits=0)
    with pytest.raises(TypeError, match="permits must be an int"):
        get_semaphore("s", permits=2.0)
    with pytest.raises(ValueError, match="lock name must not be empty"):
        get_latch("")


def test_get_latch(db1):
    from django_rlock.engine.latch import CountDownLatch

    latch = get_latch("workers")
    assert isinstance(latch, CountDownLatch) and latch.key == KEY + "workers"
    assert latch.try_set_count(2)
    latch.count_down()
    assert get_latch("workers").get_count() == 1
    latch.count_down()
    assert latch.wait(timeout=5) is True


def test_kinds_and_limited_with_a_plain_client_need_no_django():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, redis\n"
            "from django_rlock.decorators import locked\n"
            "from django_rlock.limits import limited\n"
            "c = redis.Redis(unix_socket_path='/nonexistent')\n"
            "locked('a:{n}', kind='write', client=c)(lambda n: n)\n"
            "limited('b:{n}', permits=2, client=c)(lambda n: n)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery')))\n")
    root = Path(__file__).parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
