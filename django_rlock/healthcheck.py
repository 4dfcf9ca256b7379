"""A django-health-check check for the locks: ``django_rlock.healthcheck.Locks``.

    # urls.py (django-health-check 4.x, and 3.x's HealthCheckView)
    from health_check.views import HealthCheckView
    path("ht/", HealthCheckView.as_view(checks=[..., "django_rlock.healthcheck.Locks"]))

    # or, django-health-check 3.x's plugin registry (AppConfig.ready)
    from health_check.plugins import plugin_dir
    plugin_dir.register(Locks)

Unhealthy (``ServiceUnavailable``) on any problem ``django_rlock.health.status()`` reports;
the message lists them, without server addresses. Importing this module needs
django-health-check (``pip install django-health-check``); 4.x calls ``run()``, 3.x
``check_status()``, and both are the same check. Many projects still pin 3.x, whose base
class moved twice (``BaseHealthCheckBackend``, then ``backends.HealthCheck``), so the base is
whichever the installed release has.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from health_check.exceptions import ServiceUnavailable

from .health import status

try:  # 4.x
    from health_check.base import HealthCheck as _Base
except ImportError:  # pragma: no cover - django-health-check 3.x
    try:
        from health_check.backends import HealthCheck as _Base  # 3.20+
    except ImportError:
        from health_check.backends import BaseHealthCheckBackend as _Base

__all__ = ["Locks"]

_Check: Any = _Base


@dataclasses.dataclass
class Locks(_Check):  # type: ignore[misc]
    """``cache``: the alias whose locks are checked (default: ``RLOCK["CACHE"]``)."""

    cache: str | None = None
    # One probe waits PROBE_TIMEOUT (2 s) at most per step, and replicas SYNC_TIMEOUT.
    timeout = datetime.timedelta(seconds=10)

    def __post_init__(self) -> None:
        # 3.x before its dataclass base set ``errors`` in an ``__init__`` the dataclass's
        # replaces.
        if not hasattr(self, "errors"):
            self.errors: list[Any] = []

    def run(self) -> None:
        found = status(self.cache)
        if not found["ok"]:
            raise ServiceUnavailable("; ".join(found["problems"]))

    def check_status(self) -> None:
        """django-health-check 3.x's entry point: the same check."""
        self.run()

    def identifier(self) -> str:
        """3.x before ``__repr__`` named a check: the cache alias tells two apart."""
        return "Locks" if self.cache is None else f"Locks({self.cache})"
