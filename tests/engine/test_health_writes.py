"""The health status's write probe (``engine.health``) on a real server, on every server CI runs
(Redis 7, 6.2, Valkey): a server that answers PING but holds writes (``CLIENT PAUSE ... WRITE``)
or refuses them (a replica, ``min-replicas-to-write`` unmet) is unhealthy, though this process
holds nothing; the probe writes nothing."""

from __future__ import annotations

import time

import pytest

from django_rlock.engine import health
from django_rlock.testing import RedisServer


def _status(server: RedisServer) -> dict:
    c = server.client()
    try:
        return health.status(c, prefix="hw:")
    finally:
        c.close()


def test_a_write_pause_makes_the_status_unhealthy_within_the_probe_timeout(own_server):
    admin = own_server.client()
    assert _status(own_server)["ok"]
    assert _status(own_server)["redis"][0]["writes"] == {"ok": True}
    admin.execute_command("CLIENT", "PAUSE", 8000, "WRITE")
    t = time.monotonic()
    paused = _status(own_server)
    took = time.monotonic() - t
    (server,) = paused["redis"]
    assert server["reachable"] and not server["writes"]["ok"], server  # PING answers
    assert not paused["ok"]
    assert paused["problems"][0].startswith("Redis holds or refuses writes (TimeoutError)")
    assert health.PROBE_TIMEOUT - 0.1 <= took < health.PROBE_TIMEOUT + 4  # bounded, not 8 s
    admin.execute_command("CLIENT", "UNPAUSE")
    assert _status(own_server)["ok"]
    assert admin.dbsize() == 0  # the probe left nothing behind
    admin.close()


@pytest.mark.parametrize(("setting", "error"), [
    (("REPLICAOF", "127.0.0.1", "1"), "ReadOnlyError"),
    (("CONFIG", "SET", "min-replicas-to-write", "1"), "NOREPLICAS"),
])
def test_a_server_that_refuses_writes_is_unhealthy(own_server, setting, error):
    admin = own_server.client()
    admin.execute_command(*setting)
    found = _status(own_server)
    (server,) = found["redis"]
    assert server["reachable"] and not found["ok"], found
    assert error in server["writes"]["error"]
    assert found["problems"][0].startswith("Redis holds or refuses writes (")
    if setting[0] == "REPLICAOF":
        admin.execute_command("REPLICAOF", "NO", "ONE")
    else:
        admin.config_set("min-replicas-to-write", 0)
    assert _status(own_server)["ok"]
    admin.close()


def test_the_probe_is_one_pexpire_that_changes_nothing(own_server):
    admin = own_server.client()
    admin.config_resetstat()
    _status(own_server)
    calls = {k: v["calls"] for k, v in admin.info("commandstats").items()}
    assert calls.get("cmdstat_pexpire") == 1
    assert admin.info("stats")["expired_keys"] == 0 and admin.dbsize() == 0
    admin.close()
