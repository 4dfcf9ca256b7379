"""Settings, connection reuse, the prefix rule and the system checks."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test.utils import override_settings

from django_rlock import get_lock
from django_rlock.checks import check_settings
from django_rlock.conf import DEFAULTS, get_config
from django_rlock.connection import get_client, get_prefix
from tests.django.conftest import BUILTIN_DB, DJANGO_REDIS_DB, caches_for
from tests.redis_server import RedisServer


def dbs_with(server: RedisServer, key: str) -> list[int]:
    found = []
    for db in range(4):
        with server.client(db=db) as c:
            if c.exists(key):
                found.append(db)
    return found


# -- settings -------------------------------------------------------------------------------
def test_defaults_and_overrides(settings: Any) -> None:
    assert get_config() == DEFAULTS
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 5, "ADMIN_PAGE_SIZE": 7}
    config = get_config()
    assert config["WATCHDOG_TIMEOUT"] == 5 and config["ADMIN_PAGE_SIZE"] == 7
    assert config["BUSY_STATUS"] == 423 and config["CACHE"] == "default"


def test_config_is_cached_until_setting_changed(settings: Any) -> None:
    assert get_config() is get_config()
    first = get_config()
    with override_settings(RLOCK={"BUSY_STATUS": 409}):
        assert get_config()["BUSY_STATUS"] == 409
    assert get_config()["BUSY_STATUS"] == 423
    assert get_config() is not first  # reset again on leaving the override


def test_watchdog_timeout_reaches_the_lock(settings: Any, db1: redis.Redis) -> None:
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 4.0}
    lock = get_lock("short")
    assert lock.watchdog_timeout == 4.0
    lock.lock()
    try:
        assert 3000 < db1.pttl("demo:rlock:short") <= 4000
    finally:
        lock.unlock()


# -- connection reuse -------------------------------------------------------------------------
def test_django_redis_shares_the_cache_client_and_db(redis_server: RedisServer) -> None:
    client = get_client()
    cache_client = caches["default"].client.get_client(write=True)
    assert client is cache_client
    assert client.connection_pool is cache_client.connection_pool
    lock = get_lock("orders:42")
    with lock:
        assert lock.key == "demo:rlock:orders:42"
        assert dbs_with(redis_server, lock.key) == [DJANGO_REDIS_DB]
    assert dbs_with(redis_server, lock.key) == []


def test_builtin_redis_cache(settings: Any, redis_server: RedisServer) -> None:
    settings.RLOCK = {"CACHE": "builtin"}
    client = get_client()
    assert client.connection_pool.connection_kwargs["db"] == BUILTIN_DB
    # The same pool as the cache itself (per thread), not a private one.
    assert client.connection_pool is caches["builtin"]._cache._get_connection_pool(True)
    lock = get_lock("report")
    with lock:
        assert lock.key == "site2:rlock:report"
        assert dbs_with(redis_server, "site2:rlock:report") == [BUILTIN_DB]
    # Explicit alias wins over RLOCK['CACHE'].
    assert get_lock("x", cache="default").key == "demo:rlock:x"


def test_override_settings_switches_server(redis_server: RedisServer, own_server: RedisServer) -> None:
    """Nothing is cached: a new CACHES takes effect on the next call."""
    with override_settings(CACHES=caches_for(own_server)):
        with get_lock("moved"):
            assert own_server.client(db=DJANGO_REDIS_DB).exists("demo:rlock:moved")
            assert dbs_with(redis_server, "demo:rlock:moved") == []
    with get_lock("moved"):
        assert dbs_with(redis_server, "demo:rlock:moved") == [DJANGO_REDIS_DB]


def test_not_redis_backend_is_improperly_configured(settings: Any) -> None:
    settings.CACHES = {**settings.CACHES,
                       "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with pytest.raises(ImproperlyConfigured, match=r"'locmem' uses .*LocMemCache.*not Redis"):
        get_client("locmem")
    settings.RLOCK = {"CACHE": "locmem"}
    with pytest.raises(ImproperlyConfigured, match="locmem"):
        get_lock("x")


def test_unknown_alias_is_improperly_configured() -> None:
    with pytest.raises(ImproperlyConfigured, match="'nope' is not in settings.CACHES"):
        get_client("nope")


def test_shard_client_is_refused(settings: Any, redis_server: RedisServer) -> None:
    settings.CACHES = {"default": {**caches_for(redis_server)["default"],
                                   "LOCATION": [f"{redis_server.url}?db=1", f"{redis_server.url}?db=3"],
                                   "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"}}}
    with pytest.raises(ImproperlyConfigured, match="ShardClient"):
        get_client()
    assert [m.id for m in check_settings()] == ["django_rlock.E004"]


# -- prefix ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "rlock", "expected"), [
    ({}, {}, "demo:rlock:"),
    ({"KEY_PREFIX": ""}, {}, "rlock:"),
    ({"KEY_PREFIX": "shop"}, {}, "shop:rlock:"),
    ({"VERSION": 7}, {}, "demo:rlock:"),  # the cache VERSION never reaches lock keys
    ({"KEY_FUNCTION": "tests.django.test_connection.hashing_key"}, {}, "demo:rlock:"),
    ({}, {"PREFIX": ""}, ""),  # Redisson's own layout: the bare name
    ({}, {"PREFIX": "locks/"}, "locks/"),
])
def test_prefix_rule(settings: Any, redis_server: RedisServer, extra: dict[str, Any],
                     rlock: dict[str, Any], expected: str) -> None:
    settings.CACHES = caches_for(redis_server, **extra)
    settings.RLOCK = rlock
    assert get_prefix() == expected
    lock = get_lock("job")
    assert lock.key == expected + "job"
    with lock:
        assert dbs_with(redis_server, expected + "job") == [DJANGO_REDIS_DB]


def hashing_key(key: str, key_prefix: str, version: int) -> str:
    raise AssertionError("django-rlock must never call a KEY_FUNCTION")


def test_version_and_cache_keys_do_not_collide(settings: Any, db1: redis.Redis) -> None:
    settings.CACHES["default"]["VERSION"] = 3
    caches["default"].set("rlock:job", "cached value")
    with get_lock("job"):
        keys = sorted(k.decode() for k in db1.scan_iter())
        # The lock, the cache value, the index of the lock prefix (outside it) and the
        # process record (under no prefix: invariant 43).
        assert keys[:3] == ["demo:3:rlock:job", "demo:rlock:job", "rlock-index:demo:rlock:"]
        assert len(keys) == 4 and keys[3].startswith("rlock-process:{")


# -- system checks --------------------------------------------------------------------------
def ids() -> list[str]:
    return sorted(m.id for m in check_settings())


def test_checks_pass_for_the_test_settings() -> None:
    assert ids() == []
    assert not [m for m in run_checks() if m.id.startswith("django_rlock.")]


def test_check_e001_unknown_alias(settings: Any) -> None:
    settings.RLOCK = {"CACHE": "locks"}
    messages = [m for m in run_checks() if m.id.startswith("django_rlock.")]
    assert [m.id for m in messages] == ["django_rlock.E001"]
    assert "'locks'" in messages[0].msg


def test_check_e002_not_redis(settings: Any) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert ids() == ["django_rlock.E002"]
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                                   "LOCATION": "t"}}
    assert ids() == ["django_rlock.E002"]


def test_check_w001_key_function(settings: Any, redis_server: RedisServer) -> None:
    settings.CACHES = caches_for(redis_server, KEY_FUNCTION="tests.django.test_connection.hashing_key")
    messages = check_settings()
    assert [m.id for m in messages] == ["django_rlock.W001"]
    assert "KEY_FUNCTION" in messages[0].msg


def test_check_w002_unknown_keys_and_e003_bad_values(settings: Any) -> None:
    settings.RLOCK = {"WATCHDOG_TIMOUT": 10, "CACHE": "default"}
    messages = check_settings()
    assert [m.id for m in messages] == ["django_rlock.W002"]
    assert "WATCHDOG_TIMOUT" in messages[0].msg
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 0, "BUSY_STATUS": "423", "ADMIN_PAGE_SIZE": 0, "PREFIX": 1}
    assert ids() == ["django_rlock.E003"] * 4
    settings.RLOCK = ["not", "a", "dict"]
    assert ids() == ["django_rlock.E003"]


def test_sync_and_metrics_settings_reach_every_lock_and_bad_values_are_e003(settings: Any) -> None:
    from django_rlock.decorators import LockSpec

    settings.RLOCK = {"SYNC_REPLICAS": 2, "SYNC_TIMEOUT": 2.5}
    lock = get_lock("synced")
    assert (lock.sync_replicas, lock.sync_timeout) == (2, 2.5)
    spec = LockSpec("t:{n}", 0, None, None, None, None, None, None, False)
    assert spec.sync_lock("t:1").sync_replicas == 2 and spec.sync_lock("t:1").label == "t:{n}"
    settings.RLOCK = {"SYNC_REPLICAS": None}
    assert get_lock("off").sync_replicas is None
    settings.RLOCK = {"SYNC_REPLICAS": "all", "SYNC_TIMEOUT": 0, "PROMETHEUS": "yes"}
    problems = [m.msg for m in check_settings() if m.id == "django_rlock.E003"]
    assert len(problems) == 3 and any("SYNC_REPLICAS" in p for p in problems)


def test_redis_url_serves_locks_when_the_cache_is_not_redis(settings: Any,
                                                           own_server: RedisServer) -> None:
    """RLOCK['REDIS_URL']: locks on a Redis of their own (here the cache is LocMem): get_lock,
    the listing and the checks use it; an explicit cache alias still means that cache."""
    from django_rlock.inspection import list_locks

    settings.CACHES = {**settings.CACHES,
                       "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.RLOCK = {"REDIS_URL": f"unix://{own_server.socket}?db=2"}
    assert check_settings() == []
    lock = get_lock("by-url")
    lock.lock()
    try:
        with own_server.client(db=2) as c:
            assert c.exists("rlock:by-url")  # its own prefix: no cache KEY_PREFIX applies
        assert get_prefix() == "rlock:" and get_client() is get_client()
        assert [i.name for i in list_locks()] == ["by-url"]
    finally:
        lock.unlock()
    settings.RLOCK = {"REDIS_URL": "http://example.com"}
    errors = [m for m in check_settings() if m.id == "django_rlock.E003"]
    assert len(errors) == 1 and "REDIS_URL" in errors[0].msg


def test_wake_lines_follow_the_setting(settings: Any) -> None:
    from django_rlock.engine import wakeline

    assert (wakeline.MAX_LINES, wakeline.ENABLED) == (32, True)  # the default
    settings.RLOCK = {"WAKE_LINES": 4}
    assert (wakeline.MAX_LINES, wakeline.ENABLED) == (4, True)
    settings.RLOCK = {"WAKE_LINES": 0}
    assert wakeline.ENABLED is False
    settings.RLOCK = {"WAKE_LINES": -1}
    errors = [m for m in check_settings() if m.id == "django_rlock.E003"]
    assert len(errors) == 1 and "WAKE_LINES" in errors[0].msg
    assert wakeline.ENABLED is False  # a bad value changes nothing
    settings.RLOCK = {}
    assert (wakeline.MAX_LINES, wakeline.ENABLED) == (32, True)
