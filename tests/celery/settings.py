"""Settings for Celery workers started by the tests: testproject's, pointed at the test Redis."""

import os

from testproject.settings import *  # noqa: F403

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["RLOCK_TEST_CACHE"],
        "KEY_PREFIX": "ct",
    }
}
RLOCK = {"WATCHDOG_TIMEOUT": float(os.environ.get("RLOCK_TEST_WATCHDOG", "1.0"))}
