"""Leader takeover: how long a group has no leader after its leader is SIGKILLed, and after it
stands down with ``stop()``.

    python bench/leader.py [--processes 3] [--rounds 5] [--lease 3]

``--processes`` replicas campaign for one group (``Leader``, ``watchdog_timeout=--lease``) on a
private redis-server. Each round SIGKILLs the leader and measures, on CLOCK_MONOTONIC (shared
by every process on Linux), from the kill to the successor's ``on_elected``; then SIGTERMs the
new leader, which calls ``stop()``, and measures from the start of ``stop()`` to the successor's
``on_elected``. A replacement replica is started after each. The figures are the gap the group
is without a leader (plus the successor's callback dispatch).
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.stats import median  # noqa: E402
from django_rlock import Leader  # noqa: E402
from django_rlock.testing import RedisServer  # noqa: E402

GROUP = "bench"


def child(sock: str, lease: str) -> None:
    """A replica: campaigns, prints ``elected <t>`` and, on SIGTERM, ``stop <t>``."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    leader = Leader(redis.Redis(unix_socket_path=sock), GROUP, watchdog_timeout=float(lease),
                    on_elected=lambda term: print(f"elected {time.monotonic()!r}", flush=True))
    leader.start()
    print("ready", flush=True)
    done.wait()
    t0 = time.monotonic()
    leader.stop()
    print(f"stop {t0!r}", flush=True)


class Replicas:
    def __init__(self, sock: str, lease: float) -> None:
        self.sock, self.lease = sock, lease
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.lines: queue.Queue[tuple[int, str, float]] = queue.Queue()
        self.early: list[tuple[int, str, float]] = []  # read while waiting for another

    def spawn(self) -> None:
        p = subprocess.Popen([sys.executable, __file__, "--child", self.sock, str(self.lease)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        self.procs[p.pid] = p

        def read() -> None:
            assert p.stdout is not None
            for line in p.stdout:
                what, _, t = line.strip().partition(" ")
                self.lines.put((p.pid, what, float(t)))

        threading.Thread(target=read, daemon=True).start()

    def next(self, what: str, timeout: float = 60.0) -> tuple[int, float]:
        for line in self.early:
            if line[1] == what:
                self.early.remove(line)
                return line[0], line[2]
        end = time.monotonic() + timeout
        while True:
            pid, w, t = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            if w == what:
                return pid, t
            self.early.append((pid, w, t))

    def close(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lease", type=float, default=3.0)
    ap.add_argument("--child", nargs=2, metavar=("SOCKET", "LEASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    server = RedisServer().start()
    reps = Replicas(server.socket, args.lease)
    kills: list[float] = []
    stops: list[float] = []
    try:
        for _ in range(args.processes):
            reps.spawn()
        leader, _ = reps.next("elected")
        for _ in range(args.rounds):
            time.sleep(args.lease / 2)  # mid-period: a renewal somewhere behind
            t_kill = time.monotonic()
            os.kill(leader, signal.SIGKILL)
            reps.procs.pop(leader).wait()
            leader, t = reps.next("elected")
            kills.append(t - t_kill)
            reps.spawn()
            time.sleep(0.2)
            reps.procs[leader].send_signal(signal.SIGTERM)
            old = leader
            leader, t = reps.next("elected")
            _, t0 = reps.next("stop")
            stops.append(t - t0)
            reps.procs.pop(old).wait()
            reps.spawn()
    finally:
        reps.close()
        server.stop()
    print(f"{args.processes} replicas, lease (watchdog_timeout) {args.lease:g} s, "
          f"{args.rounds} rounds")
    print(f"takeover after SIGKILL: median {median(kills):.3f} s, min {min(kills):.3f} s, "
          f"max {max(kills):.3f} s")
    print(f"hand-over after stop(): median {median(stops) * 1000:.2f} ms, "
          f"min {min(stops) * 1000:.2f} ms, max {max(stops) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
