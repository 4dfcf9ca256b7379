"""Settings of the PostgreSQL transaction scenarios (``tests/django/txn_run.py``, a subprocess).

testproject's settings with two databases on the test suite's own PostgreSQL (``default`` with
``ATOMIC_REQUESTS``, and ``other``) and the cache on its own redis-server.
"""

import os

from testproject.settings import *  # noqa: F403

_pg = {"ENGINE": "django.db.backends.postgresql", "USER": "postgres",
       "HOST": os.environ["RLOCK_TEST_PG_HOST"], "PORT": ""}
DATABASES = {
    "default": {**_pg, "NAME": "postgres", "ATOMIC_REQUESTS": True},
    "other": {**_pg, "NAME": "other"},
}
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["RLOCK_TEST_REDIS"],
        "KEY_PREFIX": "tx",
    }
}
RLOCK = {"WATCHDOG_TIMEOUT": 1.0}  # short, so a hold renewed by mistake would show at once
ROOT_URLCONF = "tests.django.txn_app"
ALLOWED_HOSTS = ["testserver"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
