"""One force-unlock meaning per kind: the kind's ``force_unlock()``, ``manage.py locks clear``
and the admin leave Redis in the same state (docs/django.md, "What a force-unlock removes").

Each way runs on the same state, built afresh by the same holder thread (so owners match),
and the whole database is compared afterwards (TTLs aside). Also: ``get_lock`` and
``@locked`` build the ``non_reentrant`` kind, which only the registry declares.
"""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.urls import reverse

from django_rlock import LockReentryError, get_lock, locked
from django_rlock.engine import NonReentrantLock
from django_rlock.engine.naming import prefix_name
from tests.django.conftest import DJANGO_REDIS_DB

PREFIX = "demo:rlock:"
FAR = 10 ** 13  # a queue entry's timeout (ms) in the year 2286: never pruned by the scripts


def snapshot(client: redis.Redis) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for key in sorted(client.keys("*")):
        if key.startswith(b"rlock-process:"):
            continue  # the process's own record (invariant 43), not the lock's state
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"list":
            out[key] = client.lrange(key, 0, -1)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = client.get(key)
    return out


def fair_with_a_queue(name: str, holder: Any, db: redis.Redis) -> None:
    holder.call(lambda: get_lock(name, kind="fair").lock())
    key = PREFIX + name
    queue = prefix_name("redisson_lock_queue", key)
    timeouts = prefix_name("redisson_lock_timeout", key)
    for i, owner in enumerate(("a1b2c3d4-0000-4000-8000-000000000001:7",
                               "a1b2c3d4-0000-4000-8000-000000000002:9")):
        db.rpush(queue, owner)
        db.zadd(timeouts, {owner: FAR + i})


def read_held(name: str, holder: Any, db: redis.Redis) -> None:
    holder.call(lambda: get_lock(name, kind="read").lock())
    holder.call(lambda: get_lock(name, kind="read").lock())  # two read holds: two timeouts


def write_held(name: str, holder: Any, db: redis.Redis) -> None:
    holder.call(lambda: get_lock(name, kind="write").lock())


def by_engine(name: str, kind: str) -> None:
    assert get_lock(name, kind=kind).force_unlock() is True


def by_command(name: str, kind: str) -> None:
    out = StringIO()
    call_command("locks", "clear", name, "--no-input", stdout=out, stderr=StringIO())
    assert "Force-unlocked 1 lock(s)" in out.getvalue()


def by_admin(client: Any) -> Callable[[str, str], None]:
    def run(name: str, kind: str) -> None:
        url = reverse("admin:django_rlock_lock_force_unlock", args=[name])
        assert client.post(url).status_code == 302
    return run


@pytest.mark.parametrize("build, kind", [(fair_with_a_queue, "fair"), (read_held, "read"),
                                         (write_held, "write")],
                         ids=["fair-with-a-queue", "rw-read-held", "rw-write-held"])
def test_the_engine_the_command_and_the_admin_leave_the_same_state(
        build: Callable[..., None], kind: str, holders: Callable[[], Any], admin_client: Any,
        redis_server: Any) -> None:
    db = redis_server.client(db=DJANGO_REDIS_DB)
    holder = holders()
    name = f"force:{kind}"
    states = []
    for way in (by_engine, by_command, by_admin(admin_client)):
        db.flushdb()
        build(name, holder, db)
        before = snapshot(db)
        assert PREFIX.encode() + name.encode() in before
        way(name, kind)
        states.append(snapshot(db))
    db.close()
    assert states[0] == states[1] == states[2]
    assert (PREFIX + name).encode() not in states[0]  # the lock itself is gone in each


def test_get_lock_and_locked_build_the_registry_s_non_reentrant_kind(holders: Any) -> None:
    lock = get_lock("nr:django", kind="non_reentrant")
    assert isinstance(lock, NonReentrantLock)
    calls: list[int] = []

    @locked("nr:{n}", kind="non_reentrant")
    def job(n: int) -> int:
        calls.append(n)
        with pytest.raises(LockReentryError):
            get_lock(f"nr:{n}", kind="non_reentrant").lock()  # the same thread, again
        return n

    assert job(3) == 3 and calls == [3]
    with pytest.raises(ValueError, match="non_reentrant"):
        get_lock("nr:bad", kind="nonreentrant")
