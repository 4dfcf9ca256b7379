from __future__ import annotations

import importlib.util
import logging
import sys

from django.apps import AppConfig
from django.core import checks

logger = logging.getLogger("django_rlock")


class RLockConfig(AppConfig):
    name = "django_rlock"
    label = "django_rlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Registering checks and the signal bridge only: no Redis client is made here (CACHES
        # may still change).
        from .checks import check_settings, check_tasks
        from .conf import apply_async_pool, apply_wake_lines
        from .engine import events
        from .signals import forward

        checks.register(check_settings)
        checks.register(check_tasks)
        events.add_listener(forward)
        _load_celery_glue()
        _install_metrics()
        _install_tracing()
        apply_wake_lines()
        apply_async_pool()


def _install_metrics() -> None:
    """``RLOCK["PROMETHEUS"] = True``: count lock events (the E005 check reports a missing
    prometheus_client; a bad RLOCK is E003's to report)."""
    from django.core.exceptions import ImproperlyConfigured

    from .conf import get_config

    try:
        wanted = get_config()["PROMETHEUS"] is True
    except ImproperlyConfigured:
        return
    if wanted and importlib.util.find_spec("prometheus_client") is not None:
        from . import prometheus

        prometheus.install()


def _install_tracing() -> None:
    """``RLOCK["OTEL"]``: None traces lock waits and holds when opentelemetry-api is installed
    and a tracer provider is already set; True whenever it is installed; False never."""
    from django.core.exceptions import ImproperlyConfigured

    from .conf import get_config

    try:
        wanted = get_config()["OTEL"]
    except ImproperlyConfigured:
        return
    if wanted is False or importlib.util.find_spec("opentelemetry") is None:
        return
    if wanted is None and "opentelemetry.trace" not in sys.modules:
        # Nobody can have set a tracer provider without importing it: leave OpenTelemetry
        # unimported (its import made a process holding 100,000 locks lose renewals).
        return
    try:
        from . import tracing
    except ImportError as exc:  # a broken install: say so, never stop Django
        logger.warning("django-rlock: OpenTelemetry tracing not loaded: %s", exc)
        return
    if wanted or tracing.provider_set():
        tracing.install()


def _load_celery_glue() -> None:
    """With Celery installed, ``@locked`` tasks need ``django_rlock.celery``'s hooks (task
    detection, skip/retry, de-dup marks); ``django_rlock.decorators`` never imports it."""
    if importlib.util.find_spec("celery") is None:
        return
    try:
        import django_rlock.celery  # noqa: F401  (registers itself)
    except ImportError as exc:  # a broken Celery install: the project cannot be using it
        logger.debug("django-rlock: Celery support not loaded: %s", exc)
