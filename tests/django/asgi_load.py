"""Settings, views and ASGI application of the async-load and restart tests (a uvicorn
subprocess: ``tests/django/test_async_load.py``).

``/hot/<n>/`` takes one lock for every request (contention) and does a read-modify-write of a
Redis counter inside it, with a pause between the read and the write: any overlap of two
holders loses an update, so the final count is exact only if exclusion was. ``/cold/<n>/``
takes a lock of its own per request (no contention). ``/stats/`` says how many requests were
inside the hot lock at once, at worst.
"""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["RLOCK_TEST_REDIS"],
        "KEY_PREFIX": "load",
        "OPTIONS": ({"CONNECTION_POOL_KWARGS": {"max_connections": int(os.environ["RLOCK_TEST_POOL"])}}
                    if os.environ.get("RLOCK_TEST_POOL") else {}),
    }
}
RLOCK: dict[str, object] = {}
ROOT_URLCONF = "tests.django.asgi_load_views"
ALLOWED_HOSTS = ["*"]
DEBUG = False
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"django.request": {"handlers": ["console"], "level": "ERROR"}}}


async def application(scope, receive, send):  # type: ignore[no-untyped-def]
    """Django's ASGI handler, made on first use (after these settings are in place)."""
    from django.core.asgi import get_asgi_application

    global _app
    if _app is None:
        _app = get_asgi_application()
    await _app(scope, receive, send)


_app = None
