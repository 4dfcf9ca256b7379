"""Django settings of the beat tests' django-celery-beat variant: a SQLite database shared by
the three beat processes, the RLOCK cache on the test's own Redis."""

import os

SECRET_KEY = "beat-tests"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_rlock", "django_celery_beat"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["RLOCK_BEAT_DB"],
                         "OPTIONS": {"timeout": 30}}}
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                      "LOCATION": os.environ["RLOCK_BEAT_CACHE"], "KEY_PREFIX": "bt"}}
RLOCK = {"WATCHDOG_TIMEOUT": float(os.environ["RLOCK_BEAT_WATCHDOG"])}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
