"""Django tests run against the suite's own redis-server (``redis_server`` in tests/conftest.py).

CACHES is pointed at it for every test: ``default`` is django-redis on db 1, ``builtin`` is
Django's own RedisCache on db 2; both databases are emptied before each test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_rlock.engine import LockNotOwnedError, RLock, records
from django_rlock.engine.naming import index_key
from tests.redis_server import RedisServer

DJANGO_REDIS_DB = 1
BUILTIN_DB = 2


def caches_for(server: RedisServer, **default_extra: Any) -> dict[str, dict[str, Any]]:
    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{server.url}?db={DJANGO_REDIS_DB}",
            "KEY_PREFIX": "demo",
            **default_extra,
        },
        "builtin": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"{server.url}?db={BUILTIN_DB}",
            "KEY_PREFIX": "site2",
        },
    }


@pytest.fixture(autouse=True)
def rlock_caches(settings: Any, redis_server: RedisServer) -> Iterator[None]:
    for db in (DJANGO_REDIS_DB, BUILTIN_DB):
        with redis_server.client(db=db) as c:
            c.flushdb()
    records.forget()  # empty databases: this process's records are written again
    settings.CACHES = caches_for(redis_server)
    settings.RLOCK = {}
    yield


@pytest.fixture
def db1(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of its own on the django-redis cache's database, to look behind the API."""
    client = redis_server.client(db=DJANGO_REDIS_DB)
    yield client
    client.close()


@pytest.fixture
def hold(holders: Callable[[], Any]) -> Iterator[Callable[..., RLock]]:
    """``hold(lock, times=1, thread=None)``: take ``lock`` on a live thread of its own (a real
    holder), named ``thread`` if given (listings show the name).

    Threads stay alive until teardown (a finished thread's id may be reused by the next), and
    every hold is released there so the watchdog does not keep renewing into the next test.
    """
    taken: list[tuple[Any, RLock, int]] = []

    def take(lock: RLock, times: int = 1, thread: str | None = None) -> RLock:
        h = holders()
        if thread is not None:
            h.thread.name = thread
        for _ in range(times):
            h.call(lock.lock)
        taken.append((h, lock, times))
        return lock

    yield take
    for h, lock, times in taken:
        for _ in range(times):
            try:
                h.call(lock.unlock)
            except (LockNotOwnedError, redis.RedisError):
                break


def write_lock(client: redis.Redis, key: str, owner: str = "7f0c8a52-3c4e-4a8b-9d1e-2b6f5e4a9c31:1",
               count: int = 1, ttl_ms: int | None = 30_000, *, indexed: str | None = None,
               since: float | None = None, **info: Any) -> None:
    """A lock hash written directly (Redisson's layout), for listings that need no live holder.

    As written it is what another Redisson client (Java, Node) leaves: not in the index, so
    only a SCAN listing finds it. ``indexed=<prefix>`` also writes the index entry the acquire
    script would (``since``: epoch seconds, default now; ``info``: host, pid, process, thread,
    os_thread_id), so the default listing finds it too. ``client`` may be a pipeline.
    """
    client.hset(key, owner, count)
    if ttl_ms is not None:
        client.pexpire(key, ttl_ms)
    if indexed is not None:
        stamp = f"{time.time() if since is None else since:.6f}"
        client.hset(index_key(indexed), key, f"{stamp} {json.dumps({'owner': owner, **info})}")
