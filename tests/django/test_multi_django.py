"""get_lock / @locked over several cache aliases: a MultiLock, or with quorum=True a RedLock."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_rlock import LockBusy, MultiLock, RedLock, get_lock, locked


@pytest.fixture
def three(settings: Any, redis_server: Any) -> list[Any]:
    """Aliases a, b, c: django-redis caches on databases 7, 8, 9 of the suite's server."""
    for alias, db in (("a", 7), ("b", 8), ("c", 9)):
        settings.CACHES = {**settings.CACHES, alias: {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{redis_server.url}?db={db}", "KEY_PREFIX": alias}}
    clients = [redis_server.client(db=db) for db in (7, 8, 9)]
    for c in clients:
        c.flushdb()
    yield clients
    for c in clients:
        c.close()


def test_get_lock_over_several_caches(three, holders):
    multi = get_lock("job", cache=["a", "b", "c"])
    assert isinstance(multi, MultiLock) and not isinstance(multi, RedLock)
    with multi:
        assert [c.exists(f"{p}:rlock:job") for c, p in zip(three, "abc", strict=True)] == [1, 1, 1]
    assert not any(c.exists(f"{p}:rlock:job") for c, p in zip(three, "abc", strict=True))
    red = get_lock("job", cache=["a", "b", "c"], quorum=True)
    assert isinstance(red, RedLock) and red.quorum == 2
    holders().call(get_lock("job", cache="c").lock)  # one of three is taken
    assert red.try_lock() is True  # a majority is enough
    red.unlock()
    with pytest.raises(ValueError, match="quorum"):
        get_lock("job", quorum=True)
    with pytest.raises(ValueError, match="repeat"):
        get_lock("job", cache=["a", "a"])


def test_locked_over_several_caches(three, holders):
    @locked("report:{n}", cache=["a", "b", "c"])
    def report(n: int) -> str:
        return "ran"

    assert report(1) == "ran"
    holders().call(get_lock("report:2", cache="b").lock)
    with pytest.raises(LockBusy) as err:
        report(2)
    assert err.value.name == "report:2"

    @locked("report:{n}", cache=["a", "b", "c"], quorum=True)
    def majority(n: int) -> str:
        return "ran"

    assert majority(2) == "ran"  # two of three are free

    @locked("areport:{n}", cache=["a", "b", "c"], on_busy="raise")
    async def areport(n: int) -> str:
        return "ran"

    import asyncio

    assert asyncio.run(areport(1)) == "ran"
    holders().call(get_lock("areport:2", cache="a").lock)
    with pytest.raises(LockBusy) as aerr:
        asyncio.run(areport(2))
    assert aerr.value.name == "areport:2" and 29 < aerr.value.ttl <= 30

    @locked("areport:{n}", cache=["a", "b", "c"], quorum=True, on_busy="raise")
    async def amajority(n: int) -> str:
        return "ran"

    assert asyncio.run(amajority(2)) == "ran"  # two of three are free: a majority
    assert not three[1].exists("b:rlock:areport:2") and not three[2].exists("c:rlock:areport:2")
    with pytest.raises(ValueError, match="quorum"):
        locked("x", quorum=True)


def test_each_alias_lists_its_member(three, holders):
    holders().call(get_lock("listed", cache=["a", "b", "c"]).lock)
    for alias in "abc":
        out = StringIO()
        call_command("locks", "list", "--cache", alias, format="json", stdout=out)
        assert [i["name"] for i in json.loads(out.getvalue())] == ["listed"]

