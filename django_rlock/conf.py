"""The ``RLOCK`` setting: defaults and the one cached accessor.

Read lazily (never at import) and cached; the cache is dropped on ``setting_changed`` so
``override_settings(RLOCK=...)`` and ``override_settings(CACHES=...)`` take effect at once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypedDict

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver


class Config(TypedDict):
    CACHE: str
    REDIS_URL: str | list[str] | None
    CLUSTER: bool
    PREFIX: str | None
    WATCHDOG_TIMEOUT: float
    BUSY_STATUS: int
    ADMIN_PAGE_SIZE: int
    SYNC_REPLICAS: int | str | None
    SYNC_TIMEOUT: float
    PROMETHEUS: bool
    WAKE_LINES: int
    MAX_HOLD: float | None
    WARN_HELD_AFTER: float | None
    ASYNC_MAX_CONNECTIONS: int | None
    BUSY_RETRY_AFTER: str | float
    BUSY_EXPOSE_NAME: bool
    BUSY_JSON: bool
    UNAVAILABLE_STATUS: int | str
    UNAVAILABLE_RETRY_AFTER: float
    OTEL: bool | None


DEFAULTS: Config = {
    # Alias in CACHES whose Redis connection the locks use.
    "CACHE": "default",
    # A Redis URL (redis://, rediss://, unix://) the locks use instead of a cache's connection:
    # for a cache that is not Redis, or locks on a server of their own. Wins over CACHE.
    "REDIS_URL": None,
    # REDIS_URL names a node of a Redis Cluster (redis:// or rediss://), or a list of them
    # (a first client finds the cluster through any one that answers): the locks use a
    # redis-py RedisCluster that discovers the others.
    "CLUSTER": False,
    # Key prefix of lock hashes; None: "<KEY_PREFIX>:rlock:" (or "rlock:" without KEY_PREFIX).
    "PREFIX": None,
    # Lease of a lock held without lease_time, renewed every third of it while held.
    "WATCHDOG_TIMEOUT": 30.0,
    # HTTP status of a view whose lock is busy.
    "BUSY_STATUS": 423,
    # Rows per page in the admin's lock list.
    "ADMIN_PAGE_SIZE": 100,
    # Replicas an acquire WAITs for on a master that has some: "auto", an int, or 0/None (off).
    "SYNC_REPLICAS": "auto",
    # Seconds an acquire waits for its replicas before it is undone (LockNotSyncedError).
    "SYNC_TIMEOUT": 1.0,
    # Count lock events in prometheus_client's registry (pip install django-rlock[prometheus]).
    "PROMETHEUS": False,
    # Threads per process that may keep a subscription of their own (a "wake line"), where a
    # release in another process hands them the lock directly; 0: none (grants go through the
    # process's shared subscription).
    "WAKE_LINES": 32,
    # OpenTelemetry spans of lock waits and holds (pip install django-rlock[otel]): None traces
    # when a tracer provider is set as Django starts, True always (spans once one is set),
    # False never.
    "OTEL": None,
    # Seconds after which the watchdog stops renewing any hold of a lock made from these
    # settings (it expires then, and its holder is told it is lost); None: never.
    "MAX_HOLD": None,
    # Seconds after which a hold is logged (one WARNING, one lock_held_long signal) and marked
    # in the admin; None: never.
    "WARN_HELD_AFTER": None,
    # Connections of the asyncio pool async views lock on (one per event loop, shared by every
    # lock on the cache); None: the cache's CONNECTION_POOL_KWARGS max_connections (100 when
    # unbounded). A call finding them all in use waits for one within its budget.
    "ASYNC_MAX_CONNECTIONS": None,
    # Retry-After of a view turned away by a busy lock: "estimate" (the recent hold times of
    # the same template in this process, at most the holder's remaining lease), "ttl" (the
    # holder's remaining lease), or a number of seconds (at most that lease). Also the
    # countdown of a task's on_busy="retry".
    "BUSY_RETRY_AFTER": "estimate",
    # Busy (423/429) and unavailable (503) bodies name the lock (its Redis name) when True.
    "BUSY_EXPOSE_NAME": False,
    # Answer those bodies as JSON to a request whose Accept header asks for application/json.
    "BUSY_JSON": True,
    # HTTP status of a @locked/@limited/@rate_limited view whose Redis is unreachable, or
    # "raise" to let the redis ConnectionError/TimeoutError propagate (a 500).
    "UNAVAILABLE_STATUS": 503,
    # Retry-After (seconds) of that answer.
    "UNAVAILABLE_RETRY_AFTER": 5,
}


def user_settings() -> Mapping[str, Any]:
    """The project's ``RLOCK`` dict as written (empty when unset)."""
    value = getattr(settings, "RLOCK", None)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(f"settings.RLOCK must be a dict, not {type(value).__name__}")
    return value


@functools.cache
def get_config() -> Config:
    """``DEFAULTS`` overlaid with the known keys of ``settings.RLOCK``.

    Unknown keys are ignored here and reported by the ``django_rlock.W002`` check.
    """
    merged = dict(DEFAULTS)
    merged.update((k, v) for k, v in user_settings().items() if k in DEFAULTS)
    return merged  # type: ignore[return-value]


def validate(config: Mapping[str, Any]) -> list[str]:
    """Problems with the values of a merged config, one message each (used by the checks)."""
    problems = []
    cache = config["CACHE"]
    if not isinstance(cache, str) or not cache:
        problems.append(f"RLOCK['CACHE'] must be a cache alias (a non-empty str), got {cache!r}")
    url = config["REDIS_URL"]
    cluster = config["CLUSTER"]
    nodes = isinstance(url, (list, tuple))  # a cluster's seed nodes
    if url is not None and not nodes and (
            not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://"))):
        problems.append(f"RLOCK['REDIS_URL'] must be None or a redis://, rediss:// or unix:// "
                        f"URL, got {url!r}")
    if not isinstance(cluster, bool):
        problems.append(f"RLOCK['CLUSTER'] must be True or False, got {cluster!r}")
    elif nodes and not cluster:
        problems.append(f"RLOCK['REDIS_URL'] may list several URLs only with RLOCK['CLUSTER'] "
                        f"(the nodes of one cluster), got {url!r}")
    elif cluster and not (url and all(isinstance(u, str) and u.startswith(("redis://", "rediss://"))
                                      for u in (url if nodes else [url]))):
        problems.append(f"RLOCK['CLUSTER'] needs RLOCK['REDIS_URL'] to be the redis:// or "
                        f"rediss:// URL of a cluster node, or a list of them (no cache backend "
                        f"hands out a redis-py RedisCluster), got {url!r}")
    prefix = config["PREFIX"]
    if prefix is not None and not isinstance(prefix, str):
        problems.append(f"RLOCK['PREFIX'] must be a str or None, got {prefix!r}")
    wt = config["WATCHDOG_TIMEOUT"]
    if isinstance(wt, bool) or not isinstance(wt, (int, float)) or not 0 < wt < float("inf"):
        problems.append(f"RLOCK['WATCHDOG_TIMEOUT'] must be a number of seconds > 0, got {wt!r}")
    status = config["BUSY_STATUS"]
    if not is_error_status(status):
        problems.append(f"RLOCK['BUSY_STATUS'] must be a 4xx or 5xx HTTP status (int): a "
                        f"2xx/3xx would tell the client the call ran, got {status!r}")
    status = config["UNAVAILABLE_STATUS"]
    if status != "raise" and not is_error_status(status):
        problems.append(f"RLOCK['UNAVAILABLE_STATUS'] must be a 4xx or 5xx HTTP status (int) "
                        f"or 'raise', got {status!r}")
    after = config["BUSY_RETRY_AFTER"]
    if after not in ("estimate", "ttl") and not _positive(after):
        problems.append(f"RLOCK['BUSY_RETRY_AFTER'] must be 'estimate', 'ttl' or a number of "
                        f"seconds > 0, got {after!r}")
    if not _positive(config["UNAVAILABLE_RETRY_AFTER"]):
        problems.append(f"RLOCK['UNAVAILABLE_RETRY_AFTER'] must be a number of seconds > 0, "
                        f"got {config['UNAVAILABLE_RETRY_AFTER']!r}")
    for key in ("BUSY_EXPOSE_NAME", "BUSY_JSON"):
        if not isinstance(config[key], bool):  # type: ignore[literal-required]
            problems.append(f"RLOCK[{key!r}] must be True or False, got "
                            f"{config[key]!r}")  # type: ignore[literal-required]
    size = config["ADMIN_PAGE_SIZE"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        problems.append(f"RLOCK['ADMIN_PAGE_SIZE'] must be an int >= 1, got {size!r}")
    sync = config["SYNC_REPLICAS"]
    if not (sync is None or sync == "auto" or (
            isinstance(sync, int) and not isinstance(sync, bool) and sync >= 0)):
        problems.append(f"RLOCK['SYNC_REPLICAS'] must be 'auto', an int >= 0 or None, got {sync!r}")
    st = config["SYNC_TIMEOUT"]
    if isinstance(st, bool) or not isinstance(st, (int, float)) or not 0 < st < float("inf"):
        problems.append(f"RLOCK['SYNC_TIMEOUT'] must be a number of seconds > 0, got {st!r}")
    lines = config["WAKE_LINES"]
    if isinstance(lines, bool) or not isinstance(lines, int) or lines < 0:
        problems.append(f"RLOCK['WAKE_LINES'] must be an int >= 0, got {lines!r}")
    if config["OTEL"] not in (None, True, False):
        problems.append(f"RLOCK['OTEL'] must be None, True or False, got {config['OTEL']!r}")
    for key in ("MAX_HOLD", "WARN_HELD_AFTER"):
        v = config[key]  # type: ignore[literal-required]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not 0 < v < float("inf")):
            problems.append(f"RLOCK[{key!r}] must be None or a number of seconds > 0, got {v!r}")
    amc = config["ASYNC_MAX_CONNECTIONS"]
    if amc is not None and (isinstance(amc, bool) or not isinstance(amc, int) or amc < 1):
        problems.append(f"RLOCK['ASYNC_MAX_CONNECTIONS'] must be None or an int >= 1, got {amc!r}")
    if not isinstance(config["PROMETHEUS"], bool):
        problems.append(f"RLOCK['PROMETHEUS'] must be True or False, got {config['PROMETHEUS']!r}")
    return problems


def is_error_status(status: Any) -> bool:
    """A 4xx or 5xx HTTP status (an int): what a call that did not run may answer."""
    return isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599


def _positive(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0 < value < float("inf"))


def lock_options() -> dict[str, Any]:
    """The keyword arguments every lock made from the settings gets."""
    config = get_config()
    options = {"watchdog_timeout": float(config["WATCHDOG_TIMEOUT"]),
               "sync_replicas": config["SYNC_REPLICAS"],
               "sync_timeout": float(config["SYNC_TIMEOUT"])}
    # Only when set: a kind that has no holds to bound takes no such option.
    if config["MAX_HOLD"] is not None:
        options["max_hold"] = config["MAX_HOLD"]
    if config["WARN_HELD_AFTER"] is not None:
        options["warn_held_after"] = config["WARN_HELD_AFTER"]
    return options


def apply_wake_lines() -> None:
    """``RLOCK["WAKE_LINES"]`` into the engine (at startup and on ``setting_changed``); a bad
    value keeps the engine's default (check E003 reports it)."""
    from .engine import wakeline

    try:
        n = get_config()["WAKE_LINES"]
    except ImproperlyConfigured:
        return
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        wakeline.MAX_LINES = n
        wakeline.ENABLED = n > 0


def apply_async_pool() -> None:
    """``RLOCK["ASYNC_MAX_CONNECTIONS"]`` into the engine (asyncio twins made from now on); a
    bad value keeps the default (check E003 reports it)."""
    from .engine import aiopool

    try:
        n = get_config()["ASYNC_MAX_CONNECTIONS"]
    except ImproperlyConfigured:
        return
    ok = n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 1)
    aiopool.ASYNC_MAX_CONNECTIONS = n if ok else None


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in ("RLOCK", "CACHES"):
        get_config.cache_clear()
        apply_wake_lines()
        apply_async_pool()
