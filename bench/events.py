"""What lock events cost on the hot path: uncontended lock+unlock pairs, p50, vs the floor.

    python bench/events.py [--seconds 1.5] [--rounds 5]

Variants, interleaved in every round so machine noise lands on all alike: the floor (two
EVALSHA of ``return 1``), django-rlock with no listener, with the Django signal bridge and no
receiver (what every Django project has), and with the Prometheus exporter installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.server import RedisServer  # noqa: E402
from bench.stats import median, step_p50_us  # noqa: E402
from django_rlock import RLock  # noqa: E402
from django_rlock.engine import events  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from prometheus_client import CollectorRegistry

    from django_rlock import prometheus
    from django_rlock.signals import forward

    with RedisServer() as server:
        client = server.client()
        sha = client.script_load("return 1")
        lock = RLock(client, "bench:events", label="bench")

        def floor() -> None:
            client.evalsha(sha, 1, "bench:floor")
            client.evalsha(sha, 1, "bench:floor")

        def pair() -> None:
            lock.lock()
            lock.unlock()

        registry = CollectorRegistry()
        exporter = prometheus.install(registry)

        def none() -> None:
            pass

        def bridge() -> None:
            events.add_listener(forward)

        def metrics() -> None:
            events.add_listener(exporter)

        variants = {"floor": (floor, none), "no listener": (pair, none),
                    "signal bridge, no receiver": (pair, bridge), "prometheus": (pair, metrics)}
        ratios: dict[str, list[float]] = {k: [] for k in variants}
        p50s: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            base = None
            for name, (step, setup) in variants.items():
                events.listeners = ()
                setup()
                p50 = step_p50_us(step, args.seconds)
                base = p50 if base is None else base
                p50s[name].append(p50)
                ratios[name].append(p50 / base)
        events.listeners = ()
        print(f"redis-server {server.version}; {args.rounds} rounds x {args.seconds} s per variant")
        print(f"{'variant':28}  {'p50 us':>7}  {'p50 / floor':>11}")
        for name in variants:
            print(f"{name:28}  {median(p50s[name]):7.1f}  {median(ratios[name]):10.2f}x")


if __name__ == "__main__":
    main()
