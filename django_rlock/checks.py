"""System checks: a wrong RLOCK or cache setting fails at startup, not at the first lock."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .conf import DEFAULTS, get_config, user_settings, validate

REDIS_BACKENDS = ("django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The RLOCK dict and the cache it names. Imports backend classes; never connects."""
    try:
        user = user_settings()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="django_rlock.E003")]
    messages: list[CheckMessage] = []
    unknown = sorted(str(k) for k in user if k not in DEFAULTS)
    if unknown:
        messages.append(Warning(
            f"Unknown key(s) in settings.RLOCK: {', '.join(unknown)}",
            hint=f"Valid keys: {', '.join(DEFAULTS)}. A misspelt key is silently ignored.",
            id="django_rlock.W002"))
    config = get_config()
    messages.extend(Error(p, id="django_rlock.E003") for p in validate(config))
    if config["PROMETHEUS"] is True and importlib.util.find_spec("prometheus_client") is None:
        messages.append(Error(
            "RLOCK['PROMETHEUS'] is True but prometheus_client is not installed",
            hint="pip install 'django-rlock[prometheus]', or set RLOCK['PROMETHEUS'] = False.",
            id="django_rlock.E005"))
    if config["OTEL"] is True and importlib.util.find_spec("opentelemetry") is None:
        messages.append(Error(
            "RLOCK['OTEL'] is True but opentelemetry-api is not installed",
            hint="pip install 'django-rlock[otel]', or set RLOCK['OTEL'] = None (trace when "
                 "installed and a tracer provider is set) or False.",
            id="django_rlock.E011"))
    alias = config["CACHE"]
    if config["REDIS_URL"] is None and isinstance(alias, str):
        messages.extend(check_cache(alias))
    return messages


def check_cache(alias: str) -> list[CheckMessage]:
    if alias not in settings.CACHES:
        return [Error(
            f"RLOCK['CACHE'] is {alias!r}, which is not an alias in settings.CACHES",
            hint=f"Use one of: {', '.join(sorted(settings.CACHES))}.",
            id="django_rlock.E001")]
    params = settings.CACHES[alias]
    backend = params.get("BACKEND", "")
    try:
        cls = import_string(backend)
    except ImportError:
        cls = None
    if not _is_redis(cls):
        return [Error(
            f"The cache {alias!r} used by django-rlock has BACKEND {backend!r}, which is not Redis",
            hint="Use django_redis.cache.RedisCache or django.core.cache.backends.redis.RedisCache, "
                 "or point RLOCK['CACHE'] at a cache that does.",
            id="django_rlock.E002")]
    messages: list[CheckMessage] = []
    client_class = (params.get("OPTIONS") or {}).get("CLIENT_CLASS", "")
    if isinstance(client_class, str) and client_class.endswith("ShardClient"):
        messages.append(Error(
            f"The cache {alias!r} used by django-rlock uses django-redis's ShardClient",
            hint="A lock lives on one Redis server: use DefaultClient or SentinelClient.",
            id="django_rlock.E004"))
    if params.get("KEY_FUNCTION"):
        messages.append(Warning(
            f"The cache {alias!r} has a KEY_FUNCTION, which django-rlock ignores",
            hint="Lock keys are '<KEY_PREFIX>:rlock:<name>' (or RLOCK['PREFIX'] + name) so that "
                 "they can be listed with SCAN and shared with Redisson; the cache VERSION is "
                 "ignored too. Set RLOCK['PREFIX'] to choose the prefix.",
            id="django_rlock.W001"))
    return messages


def _is_redis(cls: Any) -> bool:
    for path in REDIS_BACKENDS:
        try:
            base = import_string(path)
        except ImportError:  # django-redis is optional
            continue
        if isinstance(cls, type) and issubclass(cls, base):
            return True
    return False


class _Guard(threading.local):
    """Per thread: is check_tasks already on this thread's stack?"""

    running = False


_guard = _Guard()


def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``@locked(dedupe=True)`` on a task without the ``LockedTask`` base: without it nothing
    refuses a duplicate at enqueue time, which a worker's log would only say at run time.

    Only with the Celery glue loaded; reads the current Celery app's tasks after importing
    its task modules (``autodiscover_tasks``), as a worker does. Never connects.

    Importing sends Celery's ``import_modules`` signal, and Celery's Django fixup answers that
    signal with ``run_checks()``, which calls this check again: the guard makes that inner call
    a no-op, else each call imports again until RecursionError (and a worker whose import
    fails that way registers no tasks). In a worker or beat (``loader.worker_initialized``)
    the check never imports: the worker is importing the task modules itself, the fixup runs
    the checks from inside that import and discards their result."""
    import sys

    if "django_rlock.celery" not in sys.modules or _guard.running:
        return []
    _guard.running = True
    try:
        return _dedupe_without_base()
    finally:
        _guard.running = False


def _dedupe_without_base() -> list[CheckMessage]:
    from celery import current_app

    from .celery import LockedTask

    try:
        loader = current_app.loader
        if not loader.worker_initialized:
            loader.import_default_modules()
        tasks = dict(current_app.tasks)
    except Exception as exc:  # a broken task module is Celery's to report, not ours
        return [Warning(f"django-rlock could not list the Celery tasks: {exc!r}",
                        id="django_rlock.W003")]
    messages: list[CheckMessage] = []
    for name, task in sorted(tasks.items()):
        spec = getattr(getattr(task, "run", None), "__rlock_spec__", None)
        if spec is not None and spec.dedupe and not isinstance(task, LockedTask):
            messages.append(Error(
                f"The Celery task {name!r} uses @locked({spec.label!r}, dedupe=True) but its "
                f"base is not LockedTask: duplicates would be enqueued",
                hint="@shared_task(bind=True, base=LockedTask) (from django_rlock.celery import "
                     "LockedTask).",
                obj=name, id="django_rlock.E006"))
    return messages
