"""Celery tasks with their locks on a Redis Cluster (``RLOCK = {"REDIS_URL": <node>, "CLUSTER": True}``).

The broker stays on the suite's server; every lock a task takes (``@locked``'s execution lock,
``dedupe``'s mark made when the task is sent) lives on the cluster, on its slot's master, and
nothing is left there once the tasks are done.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_rlock.connection import get_client
from django_rlock.engine.clients import is_cluster
from tests.celery.conftest import assert_no_overlap, entries, wait_for
from tests.cluster.conftest import cluster, cluster_support  # noqa: F401 - the fixtures
from tests.cluster_topology import ClusterTopology

pytestmark = pytest.mark.usefixtures("threads_worker")


@pytest.fixture
def on_cluster(settings: Any, locks: Any, cluster: ClusterTopology) -> ClusterTopology:  # noqa: F811
    settings.RLOCK = {"REDIS_URL": f"redis://127.0.0.1:{cluster.masters()[0].port}/0",
                      "CLUSTER": True, "PREFIX": "cc:", "WATCHDOG_TIMEOUT": 1.0}
    assert is_cluster(get_client())
    return cluster


def keys_on(topo: ClusterTopology, pattern: str) -> list[bytes]:
    found: list[bytes] = []
    for master in topo.masters():
        with topo.node_client(master) as c:
            found += c.keys(pattern)
    return found


def test_duplicates_never_overlap_and_leave_nothing(on_cluster: ClusterTopology, locks: Any,
                                                    log: Any) -> None:
    from tests.celery.tasks import critical

    master = on_cluster.node_for_key("cc:crit:k")
    with on_cluster.node_client(master) as c:
        c.config_resetstat()
    results = [critical.delay("k", 0.05) for _ in range(10)]
    assert [r.get(timeout=60) for r in results] == ["ran"] * 10
    intervals = entries(log, "interval", "k")
    assert len(intervals) == 10
    assert_no_overlap(intervals)
    with on_cluster.node_client(master) as c:  # taken and given back on the slot's master
        assert c.info("commandstats")["cmdstat_evalsha"]["calls"] >= 10  # (a hand-off spares some acquires)
    assert not keys_on(on_cluster, "cc:*crit:k*")
    assert not locks.exists("ct:rlock:crit:k")  # the cache's server was never used for it


def test_a_busy_task_is_skipped_while_another_holds_it_on_its_master(
        on_cluster: ClusterTopology, log: Any) -> None:
    from tests.celery.tasks import skipper

    first = skipper.delay("c", 1.5)
    wait_for(lambda: entries(log, "start", "c"))
    master = on_cluster.node_for_key("cc:skip:c")
    with on_cluster.node_client(master) as c:
        assert c.exists("cc:skip:c")  # held on the slot's master
    assert skipper.delay("c", 0).get(timeout=20) is None  # busy: skipped
    assert first.get(timeout=20) == "ran"
    assert len(entries(log, "start", "c")) == 1
    assert skipper.delay("c", 0).get(timeout=20) == "ran"


def test_dedupe_marks_live_on_the_cluster(on_cluster: ClusterTopology, log: Any) -> None:
    from tests.celery.tasks import deduped

    first = deduped.delay(11, hold=1.0)
    assert deduped.delay(a=11, hold=1.0).id == first.id  # the mark, read on the cluster
    assert [k for k in keys_on(on_cluster, "cc:dedupe:*")]
    assert first.get(timeout=20) == 13
    assert [e[0] for e in entries(log, "dd", "11")].count(first.id) == 1
    assert not keys_on(on_cluster, "cc:dedupe:*") and not keys_on(on_cluster, "cc:dd:*")
    again = deduped.delay(11, hold=0)
    assert again.id != first.id and again.get(timeout=20) == 13
