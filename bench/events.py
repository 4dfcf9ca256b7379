"""What lock events cost on the hot path: uncontended lock+unlock pairs, p50, vs the floor.

    python bench/events.py [--seconds 1.5] [--rounds 5]

Two measurements, because they answer different questions:

- Round trips: lock+unlock pairs on a private redis-server, p50 per variant. The variants
  take turns in slices of 50 pairs throughout a round (``--seconds`` per variant), so load
  that comes and goes on the machine lands on all alike; the floor is two EVALSHA of
  ``return 1``, and "+us" is the median over rounds of each round's p50 minus that round's
  "no listener" p50. This is what an application sees: the listeners' code runs cold between
  two round trips, so it costs several times its in-process figure.
- In process: the two events a pair emits (``acquired``, ``released``), exactly as the lock
  emits them, timed back to back without Redis (best of 5 x 100k): the cost itself, to the
  tenth of a microsecond.

Variants: no listener; the Django signal bridge with no receiver (what every Django project
has); the Prometheus exporter alone (no Django; with its live gauges); and both (Django with
RLOCK["PROMETHEUS"]). With opentelemetry-api / django-debug-toolbar installed, also: the tracing
listener with no tracer provider set (RLOCK["OTEL"] = True before one is), the tracing listener
with an SDK provider and no exporter (two spans' worth of work per pair: the hold span), and the
toolbar's listener outside an instrumented request (every lock of a process where the panel
was once enabled), each beside the signal bridge as in a Django project.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.server import RedisServer  # noqa: E402
from bench.stats import median  # noqa: E402
from django_rlock import RLock  # noqa: E402
from django_rlock.engine import events  # noqa: E402


def emit_pair_us(n: int = 100_000, repeat: int = 5) -> float:
    """Microseconds for one pair's events, as ``lock.py`` sends them (best of ``repeat``)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter_ns()
        for _ in range(n):
            if events.listeners:
                events.emit("acquired", name="bench:1", key="bench:1", label="bench:{n}",
                            owner="o:1", wait=0.0003, lease=None)
            if events.listeners:
                events.emit("released", name="bench:1", key="bench:1", label="bench:{n}",
                            owner="o:1", held=0.0002, reason="unlock")
        best = min(best, (time.perf_counter_ns() - t) / n / 1000.0)
    return best


def interleaved_p50_us(steps: dict[str, Callable[[], object]],
                       listeners: dict[str, tuple[Callable[..., object], ...]],
                       seconds: float, slice_: int = 50) -> dict[str, float]:
    """p50 of each step, the steps taking turns ``slice_`` calls at a time for
    ``seconds`` x len(steps), each under its variant's listeners."""
    lat: dict[str, list[int]] = {k: [] for k in steps}
    for step in steps.values():
        for _ in range(100):  # warm-up
            step()
    gc.collect()
    end = time.perf_counter() + seconds * len(steps)
    while time.perf_counter() < end:
        for name, step in steps.items():
            events.listeners = listeners.get(name, ())
            for _ in range(slice_):
                t = time.perf_counter_ns()
                step()
                lat[name].append(time.perf_counter_ns() - t)
    events.listeners = ()
    out = {}
    for name, values in lat.items():
        values.sort()
        out[name] = values[len(values) // 2] / 1000.0
    return out


def optional_listeners(forward: Callable[..., object]) -> dict[str, tuple[Callable[..., object], ...]]:
    """The tracing and toolbar listeners, when their packages are installed."""
    out: dict[str, tuple[Callable[..., object], ...]] = {}
    try:
        from opentelemetry.sdk.trace import TracerProvider

        from django_rlock import tracing
    except ImportError:
        pass
    else:
        out["bridge + tracing, no provider"] = (forward, tracing.LockTracer())
        out["bridge + tracing, SDK provider"] = (forward, tracing.LockTracer(TracerProvider()))
    try:
        import debug_toolbar  # noqa: F401
    except ImportError:
        return out
    from django.conf import settings

    if not settings.configured:
        settings.configure()
    from django_rlock import toolbar

    out["bridge + toolbar, no request"] = (forward, toolbar.listen)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from prometheus_client import CollectorRegistry

    from django_rlock import prometheus
    from django_rlock.signals import forward

    exporter = prometheus.install(CollectorRegistry())
    events.listeners = ()
    listeners: dict[str, tuple[Callable[..., object], ...]] = {
        "no listener": (), "signal bridge, no receiver": (forward,),
        "prometheus": (exporter,), "signal bridge + prometheus": (forward, exporter)}
    listeners.update(optional_listeners(forward))

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

        steps = {"floor": floor, **dict.fromkeys(listeners, pair)}
        p50s: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.rounds):
            for name, p50 in interleaved_p50_us(steps, listeners, args.seconds).items():
                p50s[name].append(p50)
        version = server.version

    in_process = {}
    for name, chosen in listeners.items():
        events.listeners = chosen
        in_process[name] = emit_pair_us()
    events.listeners = ()

    rounds = range(args.rounds)
    print(f"redis-server {version}; {args.rounds} rounds x {args.seconds} s per variant")
    print(f"{'variant':28}  {'p50 us':>7}  {'/ floor':>7}  {'+us':>6}  {'in process us':>13}")
    for name in p50s:
        ratio = median([p50s[name][i] / p50s["floor"][i] for i in rounds])
        line = f"{name:28}  {median(p50s[name]):7.1f}  {ratio:6.2f}x"
        if name != "floor":
            delta = median([p50s[name][i] - p50s["no listener"][i] for i in rounds])
            line += f"  {delta:+6.1f}  {in_process[name]:13.2f}"
        print(line)


if __name__ == "__main__":
    main()
