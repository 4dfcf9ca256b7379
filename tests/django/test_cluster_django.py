"""Django on a Redis Cluster (issue #10): ``RLOCK = {"REDIS_URL": <a node>, "CLUSTER": True}``.

``get_lock`` and ``@locked`` take RLocks on the cluster, ``@limited`` and ``@rate_limited`` (sync
and async) run and turn busy calls away there, ``manage.py locks`` lists (and clears) them on
every master, and the checks explain a cluster setting without a node's URL.
"""

from __future__ import annotations

import asyncio
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_rlock import LockBusy, RateLimited, get_lock, get_semaphore, limited, locked, rate_limited
from django_rlock.checks import check_settings
from django_rlock.connection import get_client
from django_rlock.engine.clients import is_cluster
from tests.cluster.conftest import cluster, cluster_support  # noqa: F401 - the fixtures
from tests.cluster_topology import ClusterTopology


@limited("cview:{pk}", permits=1)
def cview(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ran")


@rate_limited("crate:{pk}", rate="1/m")
def crate(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ran")


go: dict[str, asyncio.Event] = {}


@limited("acview:{pk}", permits=1)
async def acview(request: HttpRequest, pk: int) -> HttpResponse:
    await asyncio.wait_for(go["acview"].wait(), 15)
    return HttpResponse("ran")


@rate_limited("acrate:{pk}", rate="1/m")
async def acrate(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ran")


urlpatterns = [
    path("cview/<int:pk>/", cview),
    path("crate/<int:pk>/", crate),
    path("acview/<int:pk>/", acview),
    path("acrate/<int:pk>/", acrate),
]


@pytest.fixture
def on_cluster(settings: Any, cluster: ClusterTopology) -> ClusterTopology:  # noqa: F811
    settings.RLOCK = {"REDIS_URL": f"redis://127.0.0.1:{cluster.masters()[0].port}/0",
                      "CLUSTER": True, "PREFIX": "dj:"}
    return cluster


def _run(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("locks", *args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def _names_over_every_master(topo: ClusterTopology, prefix: str) -> list[str]:
    names = [f"job-{i}" for i in range(24)]
    assert {topo.node_for_key(prefix + n).port for n in names} == {
        m.port for m in topo.masters()}
    return names


def test_get_lock_and_locked_run_on_the_cluster(on_cluster: ClusterTopology):
    assert check_settings() == []
    assert is_cluster(get_client()) and get_client() is get_client()
    lock = get_lock("report")
    with lock:
        master = on_cluster.node_for_key("dj:report")
        with on_cluster.node_client(master) as c:
            assert c.hexists("dj:report", lock._field())
        assert lock.client.connection_pool.connection_kwargs["port"] == master.port

    @locked("task:{n}")
    def work(n: int) -> bool:
        return get_lock(f"task:{n}").is_held_by_current_thread()

    assert work(7) is True
    assert not get_lock("task:7").is_locked()
    for kind in ("fair", "fenced", "read", "write"):
        with get_lock("report", kind=kind) as held:
            assert held.is_locked()

    @limited("slots", permits=2)
    def limited_work() -> int:
        return get_client().get_node_from_key("dj:slots").port

    assert limited_work() == on_cluster.node_for_key("dj:slots").port


def test_manage_py_locks_lists_and_clears_every_master(on_cluster: ClusterTopology):
    names = _names_over_every_master(on_cluster, "dj:")
    locks = [get_lock(n) for n in names]
    for lock in locks:
        lock.lock()
    try:
        listed = json.loads(_run("list", "--match", "job-*", format="json"))
        assert sorted(row["name"] for row in listed) == sorted(names)
        _run("clear", names[0], names[1], interactive=False)
        listed = json.loads(_run("list", "--match", "job-*", format="json"))
        assert sorted(row["name"] for row in listed) == sorted(names[2:])
    finally:
        for lock in locks:
            if lock.is_held_by_current_thread():
                lock.unlock()


def test_cluster_without_a_node_url_is_e003(settings: Any):
    settings.RLOCK = {"CLUSTER": True}
    errors = [m for m in check_settings() if m.id == "django_rlock.E003"]
    assert len(errors) == 1 and "REDIS_URL" in errors[0].msg and "CLUSTER" in errors[0].msg
    settings.RLOCK = {"CLUSTER": "yes", "REDIS_URL": "redis://127.0.0.1:1/0"}
    errors = [m for m in check_settings() if m.id == "django_rlock.E003"]
    assert len(errors) == 1 and "CLUSTER" in errors[0].msg


def test_several_node_urls_find_the_cluster_when_the_first_is_dead(settings: Any,
                                                                    cluster: ClusterTopology):  # noqa: F811
    """``REDIS_URL`` may list the cluster's nodes: a process that starts while the first is
    down (it died, its host is gone) finds the cluster through the next. With one URL such a
    process failed its first lock (``Redis Cluster cannot be connected``)."""
    import socket

    with socket.socket() as s:  # a port nobody listens on: the dead first node
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    live = cluster.masters()[1].port
    settings.RLOCK = {"REDIS_URL": [f"redis://127.0.0.1:{dead}/0", f"redis://127.0.0.1:{live}/0"],
                      "CLUSTER": True, "PREFIX": "dj:"}
    assert check_settings() == []
    with get_lock("seeded") as lock:
        master = cluster.node_for_key("dj:seeded")
        with cluster.node_client(master) as c:
            assert c.hexists("dj:seeded", lock.current_owner())
    settings.RLOCK = {"REDIS_URL": [f"redis://127.0.0.1:{live}/0"]}  # a list needs CLUSTER
    errors = [m for m in check_settings() if m.id == "django_rlock.E003"]
    assert len(errors) == 1 and "several URLs only with" in errors[0].msg


@pytest.mark.django_db
def test_the_admin_lists_shows_and_force_unlocks_on_the_cluster(on_cluster: ClusterTopology,
                                                                 admin_client: Any):
    from django.urls import reverse

    names = _names_over_every_master(on_cluster, "dj:")[:6]
    locks = [get_lock(n) for n in names]
    for lock in locks:
        lock.lock()
    try:
        page = admin_client.get(reverse("admin:django_rlock_lock_changelist")).content.decode()
        assert all(n in page for n in names)
        victim = names[-1]
        detail = admin_client.get(reverse("admin:django_rlock_lock_detail", args=[victim]))
        assert detail.status_code == 200 and victim in detail.content.decode()
        done = admin_client.post(reverse("admin:django_rlock_lock_force_unlock", args=[victim]),
                                 follow=True)
        assert f"Force-unlocked &#x27;{victim}&#x27;." in done.content.decode()
        assert not get_lock(victim).is_locked()
        assert all(get_lock(n).is_locked() for n in names[:-1])
    finally:
        for lock in locks:
            if lock.is_held_by_current_thread():
                lock.unlock()


def test_locked_async_functions_run_on_the_cluster(on_cluster: ClusterTopology):
    """``@locked`` on an async view or function with the settings' (sync) cluster client: its
    ``AsyncRLock`` gets an asyncio cluster client of the same nodes (it once failed every call
    with an AttributeError: a cluster client has no connection pool to twin)."""
    inside: list[int] = []
    worst: list[int] = []

    @locked("ajob:{n}", wait=5)
    async def work(n: int) -> int:
        inside.append(n)
        worst.append(len(inside))
        master = on_cluster.node_for_key(f"dj:ajob:{n}")
        with on_cluster.node_client(master) as c:
            held = c.exists(f"dj:ajob:{n}")
        await asyncio.sleep(0.05)
        inside.remove(n)
        return held

    async def main() -> list[int]:
        return await asyncio.gather(*(work(3) for _ in range(4)))

    assert asyncio.run(main()) == [1, 1, 1, 1]  # held on its slot's master each time
    assert max(worst) == 1  # and one at a time
    assert asyncio.run(main()) == [1, 1, 1, 1]  # a second event loop gets its own client
    assert not get_lock("ajob:3").is_locked()


@pytest.mark.urls(__name__)
def test_busy_limited_and_rate_limited_answer_429_on_the_cluster(on_cluster: ClusterTopology):
    """A busy ``@limited`` call on the cluster is turned away as on one server: a view gets 429
    with ``Retry-After``, a function ``LockBusy`` (the busy path once sent TIME in a cluster
    client's pipeline, which redis-py refuses: a 500 and a RedisClusterException)."""
    sem = get_semaphore("cview:1", permits=1)
    permit = sem.acquire()  # the one permit is taken

    @limited("cview:{n}", permits=1)
    def work(n: int) -> str:
        return "ran"

    try:
        busy = Client(raise_request_exception=False).get("/cview/1/")
        assert busy.status_code == 429 and 1 <= int(busy["Retry-After"]) <= 30
        with pytest.raises(LockBusy) as err:
            work(1)
        assert err.value.name == "cview:1" and 25 < err.value.ttl <= 30  # the watchdog's 30 s
    finally:
        sem.release(permit)
    assert Client().get("/cview/1/").status_code == 200 and work(1) == "ran"

    assert Client().get("/crate/1/").status_code == 200
    spent = Client(raise_request_exception=False).get("/crate/1/")
    assert spent.status_code == 429 and 50 <= int(spent["Retry-After"]) <= 60

    @rate_limited("cfn:{n}", rate="1/m")
    def once(n: int) -> str:
        return "ran"

    assert once(1) == "ran"
    with pytest.raises(RateLimited):
        once(1)


@pytest.mark.urls(__name__)
def test_async_limited_and_rate_limited_run_on_the_cluster(on_cluster: ClusterTopology):
    """``@limited`` / ``@rate_limited`` on async views and functions with the settings' (sync)
    cluster client (they once raised a TypeError on every call): permits are taken on the
    name's slot master, a second concurrent call is turned away or waits its turn."""
    inside: list[int] = []
    worst: list[int] = []

    @limited("ajobs:{n}", permits=1, wait=10)
    async def waits(n: int) -> int:
        inside.append(n)
        worst.append(len(inside))
        master = on_cluster.node_for_key(f"dj:ajobs:{n}")
        with on_cluster.node_client(master) as c:
            taken = c.zcard(f"{{dj:ajobs:{n}}}:timeout")
        await asyncio.sleep(0.05)
        inside.remove(n)
        return taken

    @limited("aone:{n}", permits=1)
    async def one(n: int, hold: asyncio.Event, entered: asyncio.Event) -> str:
        entered.set()
        await asyncio.wait_for(hold.wait(), 15)
        return "ran"

    @rate_limited("arate:{n}", rate="2/m")
    async def twice(n: int) -> str:
        return "ran"

    async def main() -> tuple[list[int], list[Any], list[Any], list[Any]]:
        waited = await asyncio.gather(*(waits(2) for _ in range(3)))
        hold, entered = asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(one(1, hold, entered))
        await asyncio.wait_for(entered.wait(), 15)  # it holds the one permit
        turned = await asyncio.gather(one(1, hold, asyncio.Event()), return_exceptions=True)
        hold.set()
        rates = await asyncio.gather(*(twice(1) for _ in range(3)), return_exceptions=True)
        go["acview"] = asyncio.Event()
        client = AsyncClient()
        views = [asyncio.ensure_future(client.get("/acview/1/")) for _ in range(2)]
        done, _ = await asyncio.wait(views, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        go["acview"].set()
        answers = [*await asyncio.gather(*views), await client.get("/acrate/1/"),
                   await client.get("/acrate/1/")]
        return waited, [await first, *turned], rates, answers

    waited, ones, rates, answers = asyncio.run(main())
    assert waited == [1, 1, 1] and max(worst) == 1  # on its slot's master, one at a time
    assert ones[0] == "ran" and isinstance(ones[1], LockBusy)
    assert rates.count("ran") == 2  # (in any order: they run concurrently)
    assert sum(isinstance(r, RateLimited) for r in rates) == 1
    codes = sorted(r.status_code for r in answers[:2])
    assert codes == [200, 429] and 1 <= int(next(
        r for r in answers[:2] if r.status_code == 429)["Retry-After"]) <= 30
    assert [r.status_code for r in answers[2:]] == [200, 429]
    assert 50 <= int(answers[3]["Retry-After"]) <= 60
    assert get_semaphore("ajobs:2").available_permits() == 1  # every permit given back


def test_async_limited_and_rate_limited_take_an_asyncio_cluster_client(on_cluster: ClusterTopology):
    """``client=`` an asyncio ``RedisCluster`` of one's own: the same, on its nodes."""
    import redis.asyncio

    port = on_cluster.masters()[0].port

    async def main() -> list[Any]:
        rc = redis.asyncio.RedisCluster(host="127.0.0.1", port=port)

        @limited("acl:{n}", permits=1, client=rc)
        async def one(n: int, hold: asyncio.Event, entered: asyncio.Event) -> str:
            entered.set()
            await asyncio.wait_for(hold.wait(), 15)
            return "ran"

        @rate_limited("aclr:{n}", rate="1/m", client=rc)
        async def once(n: int) -> str:
            return "ran"

        hold, entered = asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(one(1, hold, entered))
        await asyncio.wait_for(entered.wait(), 15)
        out = list(await asyncio.gather(one(1, hold, asyncio.Event()), return_exceptions=True))
        hold.set()
        out += [await first, *await asyncio.gather(once(1), once(1), return_exceptions=True)]
        await rc.aclose()
        return out

    busy, ran, *rates = asyncio.run(main())
    assert isinstance(busy, LockBusy) and ran == "ran"
    assert rates.count("ran") == 1 and sum(isinstance(r, RateLimited) for r in rates) == 1


def test_event_loops_of_their_own_leave_no_unclosed_cluster_client(on_cluster: ClusterTopology,
                                                                   caplog: Any):
    """Django runs each async view of a WSGI server in an event loop of its own: each loop's
    asyncio cluster client (its reads: ``is_locked``) is closed when the next loop comes,
    not left for the garbage collector to report (an asyncio ERROR per request)."""
    import gc
    import logging

    async def request(n: int) -> bool:
        lock = get_lock(f"wsgi:{n}", aio=True)
        async with lock:
            held = await lock.is_locked()  # a read through the loop's cluster client
        gc.collect()  # the clients of the loops before, with this loop running
        return held

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert all(asyncio.run(request(n)) for n in range(6))
    assert not [r for r in caplog.records if "nclosed" in r.getMessage()], caplog.text
