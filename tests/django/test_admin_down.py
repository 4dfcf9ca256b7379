"""Every admin page for locks answers, with "Could not read the locks from Redis", while the
locks' Redis is down or was stopped between two pages (issue #23): never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_rlock import get_lock
from tests.django.test_admin import CHANGELIST, detail_url, unlock_url
from tests.redis_server import RedisServer

MESSAGE = "Could not read the locks from Redis"


@pytest.fixture
def on_own(settings: Any, own_server: RedisServer) -> RedisServer:
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": own_server.url, "KEY_PREFIX": "adm"}}
    return own_server


def pages(name: str) -> list[tuple[str, str, dict[str, str]]]:
    return [("get", reverse(CHANGELIST), {}), ("get", reverse(CHANGELIST), {"q": "x", "scan": "1"}),
            ("get", detail_url(name), {}), ("get", detail_url(name) + "?scan=1", {}),
            ("get", unlock_url(name), {}), ("post", unlock_url(name), {})]


def test_every_page_says_redis_is_unreachable_instead_of_a_500(admin_client: Client, on_own,
                                                               holders):
    lock = get_lock("held")
    h = holders()
    h.call(lock.lock)
    assert admin_client.get(detail_url("held")).status_code == 200  # up: the page works
    on_own.stop()
    try:
        for method, url, data in pages("held"):
            response = getattr(admin_client, method)(url, data)
            html = response.content.decode()
            assert response.status_code == 200, (method, url, response.status_code)
            assert MESSAGE in html, (method, url)
            assert 'data-name="held"' not in html  # no stale row pretends to be live
            assert "<code>adm:rlock:</code>" in html  # still says where it looked
    finally:
        on_own.start()
    h.call(lambda: None)  # the holder's lock is gone with the restart: nothing to release
