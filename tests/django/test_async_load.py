"""Async views under load on a real uvicorn worker, and across a Redis restart (issue #23).

500 requests at once to an async ``@locked`` view on one uvicorn worker used to answer
``500 MaxConnectionsError`` for most of them: the asyncio twin of the cache's client had
redis-py's non-blocking pool. Now every request is answered 200, with and without
contention, and exclusion is exact (a read-modify-write inside the lock loses no update).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from django_rlock.testing import free_port
from tests.redis_server import RedisServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUESTS = 500


async def _get(uds: str, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_unix_connection(uds)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return int(data.split(b" ", 2)[1]), data


class Uvicorn:
    """One uvicorn worker serving ``tests.django.asgi_load`` on a unix socket."""

    def __init__(self, url: str, pool: int | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlock-uvicorn-")
        self.uds = os.path.join(self.dir, "http.sock")
        env = {**os.environ, "RLOCK_TEST_REDIS": url,
               "DJANGO_SETTINGS_MODULE": "tests.django.asgi_load"}
        if pool is not None:
            env["RLOCK_TEST_POOL"] = str(pool)
        self.log = open(os.path.join(self.dir, "log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.django.asgi_load:application", "--uds",
             self.uds, "--workers", "1", "--lifespan", "off", "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.uds):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start: {self.tail()}")
            time.sleep(0.05)

    def tail(self) -> str:
        self.log.flush()
        with open(os.path.join(self.dir, "log"), "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def burst(self, path: str, n: int = REQUESTS) -> tuple[Counter[int], list[bytes]]:
        async def main() -> list[tuple[int, bytes]]:
            return await asyncio.gather(*(_get(self.uds, path.format(i=i)) for i in range(n)))

        answers = asyncio.run(main())
        return Counter(code for code, _ in answers), [b for code, b in answers if code != 200]

    def stats(self) -> dict[str, Any]:
        code, body = asyncio.run(_get(self.uds, "/stats/"))
        assert code == 200
        return json.loads(body.split(b"\r\n\r\n", 1)[1])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def uvicorn(own_server: RedisServer) -> Iterator[Any]:
    started: list[Uvicorn] = []

    def start(pool: int | None = None, url: str | None = None) -> Uvicorn:
        started.append(Uvicorn(url or own_server.url, pool))
        return started[-1]

    yield start
    for u in started:
        u.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pool", [None, 10], ids=["default-pool", "pool-of-10"])
def test_500_concurrent_async_requests_on_one_uvicorn_worker(uvicorn, own_server, pool):
    server = uvicorn(pool)
    redis = own_server.client()
    # Without contention: a lock of its own per request.
    codes, bad = server.burst("/cold/{i}/")
    assert codes == {200: REQUESTS}, (codes, bad[:1], server.tail())
    # With contention: every request on one lock, a read-modify-write inside it.
    codes, bad = server.burst("/hot/{i}/")
    assert codes == {200: REQUESTS}, (codes, bad[:1], server.tail())
    assert int(redis.get("load:count")) == REQUESTS  # no lost update: exclusion was exact
    stats = server.stats()
    assert stats["worst"] == 1
    assert stats["async_pool"] == (100 if pool is None else pool)
    assert redis.keys("load:rlock:*") == []
    redis.close()


def test_async_views_answer_after_a_redis_restart(uvicorn):
    """Redis SIGKILLed under a uvicorn worker that has pooled connections to it, then back
    (empty) on the same port: every request after it is back is answered 200. The asyncio
    path used to write the first scripts to the dead pooled connections (500s, "Connection
    closed by server"); the sync path always polled a connection before using it."""
    server = RedisServer(port=free_port()).start()
    try:
        web = uvicorn(url=f"redis://127.0.0.1:{server.port}/0")
        codes, bad = web.burst("/cold/{i}/", 50)
        assert codes == {200: 50}, (codes, bad[:1], web.tail())
        assert server.proc is not None
        server.proc.kill()  # no goodbye
        server.proc.wait()
        server.proc = None
        time.sleep(0.5)
        server.start()
        for _ in range(3):
            codes, bad = web.burst("/cold/{i}/", 50)
            assert codes == {200: 50}, (codes, bad[:1], web.tail())
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def test_the_async_pool_size_setting_reaches_the_twins_and_is_checked(settings):
    from django_rlock.checks import check_settings
    from django_rlock.connection import get_client
    from django_rlock.engine import aiopool
    from django_rlock.engine.clients import async_twin

    async def cap(cache: str | None = None) -> int:
        return async_twin(get_client(cache)).connection_pool.max_connections

    settings.RLOCK = {"ASYNC_MAX_CONNECTIONS": 7}
    assert aiopool.ASYNC_MAX_CONNECTIONS == 7 and asyncio.run(cap()) == 7
    # (django-redis keeps one pool per URL for the process: a URL of this test's own.)
    url = settings.CACHES["default"]["LOCATION"] + f"&client_name=pool-{uuid.uuid4().hex}"
    settings.CACHES = {**settings.CACHES, "default": {
        **settings.CACHES["default"], "LOCATION": url,
        "OPTIONS": {"CONNECTION_POOL_KWARGS": {"max_connections": 9}}}}
    assert asyncio.run(cap()) == 7  # the setting wins over the cache's pool
    settings.RLOCK = {}
    assert aiopool.ASYNC_MAX_CONNECTIONS is None and asyncio.run(cap()) == 9
    settings.CACHES = {**settings.CACHES, "builtin": {**settings.CACHES["builtin"],
                                                      "OPTIONS": {"max_connections": 6}}}
    assert asyncio.run(cap("builtin")) == 6  # Django's RedisCache: its OPTIONS
    for bad in (0, -1, True, "10", 2.5):
        settings.RLOCK = {"ASYNC_MAX_CONNECTIONS": bad}
        errors = [m.msg for m in check_settings() if m.id == "django_rlock.E003"]
        assert errors == [f"RLOCK['ASYNC_MAX_CONNECTIONS'] must be None or an int >= 1, got {bad!r}"]
        assert aiopool.ASYNC_MAX_CONNECTIONS is None  # a bad value keeps the default
