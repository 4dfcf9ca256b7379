"""The Celery app of tests/celery/test_windows.py's workers, with this process's wall clock
skewed by ``RLOCK_TEST_CLOCK_SKEW`` seconds (``time.time`` wrapped before Celery or Django
import it): a host whose clock is off, against the same Redis server."""

import os
import time

_skew = float(os.environ.get("RLOCK_TEST_CLOCK_SKEW", "0"))
_real_time = time.time
time.time = lambda: _real_time() + _skew  # type: ignore[assignment]

import tests.celery.window_tasks  # noqa: E402,F401  (registers the task)
from tests.celery.app import app  # noqa: E402

__all__ = ["app"]
