"""Runs the fencing scenarios on PostgreSQL; prints their results as JSON on the last line.

``python -m tests.django._fencing_pg`` with ``RLOCK_TEST_PG_HOST`` (the socket directory of
the PostgreSQL that tests/django/test_fencing.py started) and ``RLOCK_TEST_REDIS_SOCKET``.
A subprocess, because the test session's Django is configured for SQLite.
"""

from __future__ import annotations

import json
import os
import traceback
from typing import Any

import django
from django.conf import settings

settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "postgres",
                           "USER": "postgres", "HOST": os.environ["RLOCK_TEST_PG_HOST"],
                           "PORT": ""}},
    INSTALLED_APPS=[], USE_TZ=True,
    LOGGING={"version": 1, "disable_existing_loggers": False},
)
django.setup()

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

from tests.django import fencing_app  # noqa: E402


def main() -> None:
    sock = os.environ["RLOCK_TEST_REDIS_SOCKET"]
    client = redis.Redis(unix_socket_path=sock, db=5)
    client.flushdb()
    runs: dict[str, Any] = {
        "stale_writer": lambda: fencing_app.stale_writer(client, "pg:"),
        "stale_writer_async": lambda: fencing_app.stale_writer_async(
            client, lambda: redis.asyncio.Redis(unix_socket_path=sock, db=5), "pg:"),
        "racing_stale_first": lambda: fencing_app.racing_writers(client, "pg:", True),
        "racing_newer_first": lambda: fencing_app.racing_writers(client, "pg:", False),
    }
    results: dict[str, Any] = {}
    for key, run in runs.items():
        try:
            results[key] = run()
        except Exception:
            results[key] = {"error": traceback.format_exc()}
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
