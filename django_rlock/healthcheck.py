"""A django-health-check (4.x) check for the locks: ``django_rlock.healthcheck.Locks``.

    # urls.py
    from health_check.views import HealthCheckView
    path("ht/", HealthCheckView.as_view(checks=[..., "django_rlock.healthcheck.Locks"]))

Unhealthy (``ServiceUnavailable``) on any problem ``django_rlock.health.status()`` reports;
the message lists them, without server addresses. Importing this module needs
django-health-check (``pip install django-health-check``).
"""

from __future__ import annotations

import dataclasses
import datetime

from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from .health import status


@dataclasses.dataclass
class Locks(HealthCheck):
    """``cache``: the alias whose locks are checked (default: ``RLOCK["CACHE"]``)."""

    cache: str | None = None
    # One probe waits PROBE_TIMEOUT (2 s) at most per step, and replicas SYNC_TIMEOUT.
    timeout = datetime.timedelta(seconds=10)

    def run(self) -> None:
        found = status(self.cache)
        if not found["ok"]:
            raise ServiceUnavailable("; ".join(found["problems"]))
