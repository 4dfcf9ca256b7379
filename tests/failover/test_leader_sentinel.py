"""Leader election through a real Sentinel failover (issue #20 on issue #25's topology).

Two campaigns in one process on a Sentinel client; the master is SIGKILLed. Sampled every
2 ms throughout: never two ``is_leader()`` at once; after the failover exactly one leads again
within the lease plus the failover's time, and its term is above every term before the kill.
"""

from __future__ import annotations

import threading
import time

import pytest

from django_rlock import Leader
from tests.topology import SentinelTopology

LEASE = 3.0


@pytest.mark.timeout(120)
def test_one_leader_at_a_time_through_a_failover_and_one_again_after() -> None:
    with SentinelTopology(replicas=1, sentinels=3) as topo:
        leaders = [Leader(topo.master_for(), "sentinel-group", watchdog_timeout=LEASE)
                   for _ in range(2)]
        both: list[float] = []
        believers: list[tuple[float, tuple[bool, bool]]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                now = time.monotonic()
                seen = (leaders[0].is_leader(), leaders[1].is_leader())
                if all(seen):
                    both.append(now)
                if not believers or believers[-1][1] != seen:
                    believers.append((now, seen))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            leaders[0].start()
            assert leaders[0].wait_elected(10)
            leaders[1].start()
            sampler.start()
            time.sleep(1.0)
            before = leaders[0].term
            assert before is not None and not leaders[1].is_leader()

            old = topo.master()
            topo.kill(old)
            killed = time.monotonic()
            topo.wait_for_failover(old)
            promoted = time.monotonic()

            def one_leads() -> Leader | None:
                leading = [x for x in leaders if x.is_leader()]
                return leading[0] if len(leading) == 1 else None

            deadline = promoted + LEASE + 10.0
            leader = None
            while leader is None and time.monotonic() < deadline:
                # Held for a second: a leader, not a term about to be given up.
                leader = one_leads()
                if leader is not None:
                    term = leader.term
                    time.sleep(1.0)
                    if one_leads() is not leader or leader.term != term:
                        leader = None
                time.sleep(0.05)
            assert leader is not None, (believers[-5:], topo.sentinel_logs())
            assert leader.term is not None and leader.term >= before
            if leader.term == before:
                # The old term survived: renewed on the promoted replica all along.
                assert leader is leaders[0]
            topo.assert_one_master(failovers=1)
            print(f"failover took {promoted - killed:.1f} s; leading again "
                  f"{time.monotonic() - promoted:.1f} s after; term {before} -> {leader.term}")
        finally:
            done.set()
            if sampler.is_alive():
                sampler.join(5)
            for x in leaders:
                x.stop(timeout=5)
        assert both == [], f"two leaders at once at {both[:3]}"
        # A term never goes back.
        terms_seen = [x.term for x in leaders if x.term is not None]
        assert all(t >= before for t in terms_seen)
