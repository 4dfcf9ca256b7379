"""Celery tasks with their locks on a django-redis Sentinel cache (master, replica, sentinels).

The broker stays on the suite's server; the tasks' execution locks and ``dedupe``'s marks live
on the service's master, found through the sentinels, and nothing is left there afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.celery.conftest import assert_no_overlap, entries
from tests.django.test_sentinel_django import sentinel_caches
from tests.topology import SentinelTopology

pytestmark = pytest.mark.usefixtures("threads_worker")


@pytest.fixture(scope="module")
def topo() -> Iterator[SentinelTopology]:
    with SentinelTopology(replicas=1, sentinels=3) as t:
        yield t


@pytest.fixture
def on_sentinel(settings: Any, locks: Any, topo: SentinelTopology) -> SentinelTopology:
    settings.CACHES = sentinel_caches(topo)
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 1.0}
    return topo


def test_tasks_lock_and_dedupe_on_the_services_master(on_sentinel: SentinelTopology,
                                                      locks: Any, log: Any) -> None:
    from tests.celery.tasks import critical, deduped

    master = on_sentinel.master_for()
    master.config_resetstat()
    results = [critical.delay("s", 0.05) for _ in range(8)]
    assert [r.get(timeout=60) for r in results] == ["ran"] * 8
    intervals = entries(log, "interval", "s")
    assert len(intervals) == 8
    assert_no_overlap(intervals)
    assert master.info("commandstats")["cmdstat_evalsha"]["calls"] >= 8  # on the master
    assert not locks.exists("ct:rlock:crit:s")  # not on the suite's server

    first = deduped.delay(21, hold=1.0)
    assert deduped.delay(a=21, hold=1.0).id == first.id  # the mark, read on the master
    assert master.keys("shop:*dedupe:*")
    assert first.get(timeout=20) == 23
    assert not master.keys("shop:*dedupe:*") and not master.keys("shop:*crit:*")
    master.close()
