"""Beat takeover: how long three replicas of ``celery beat`` (``LeaderScheduler``) send nothing
when the leader is SIGKILLed, and when it is sent SIGTERM (a rolling deploy, a scale-down).

    python bench/beat.py [--rounds 5] [--watchdog 3]

One private redis-server (broker and election); three beat processes of
``tests/celery/beat_app.py`` with one entry every second; a reader pops the broker's queue as
messages arrive. Each round SIGKILLs the leader, then (a replacement started, as Kubernetes
would) SIGTERMs the next one. Per fault: the time to the new leader's election (polled every
5 ms from ``Leader.leader()``), to its first message, and the ticks lost (scheduled ticks with
no message: at-most-once drops them, catch-up coalesces them into one send).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from django_rlock.engine import Leader  # noqa: E402
from django_rlock.testing import RedisServer  # noqa: E402

GROUP = "celery-beat:beattests"


class Reader(threading.Thread):
    def __init__(self, client: Any) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.got: list[tuple[float, int, str]] = []  # (monotonic, term, tick)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            item = self.client.brpop(["celery"], timeout=0.2)
            if item is not None:
                h = json.loads(item[1])["headers"]
                self.got.append((time.monotonic(), int(h["rlock_beat_term"]),
                                 h["rlock_beat_tick"]))


def spawn(env: dict[str, str], tmp: str, logs: list[Path]) -> subprocess.Popen[bytes]:
    log = Path(tmp) / f"beat{len(logs)}.log"
    logs.append(log)
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.celery.beat_app",
                             "beat", "-l", "info", "-S", "django_rlock.beat:LeaderScheduler"],
                            cwd=tmp, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def until(pred: Any, timeout: float, step: float = 0.005) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError


def fault(sig: int, watcher: Leader, reader: Reader, procs: dict[int, Any],
          timeout: float) -> dict[str, float]:
    old = until(watcher.leader, 60)
    term = old.term
    t0 = time.monotonic()
    os.kill(old.pid, sig)
    new = until(lambda: (i := watcher.leader()) is not None and i.term != term and i, timeout)
    elected = time.monotonic() - t0
    first = until(lambda: next((m for m in reader.got if m[1] == new.term), None), 30)
    procs.pop(old.pid).wait(30)
    before = [m for m in reader.got if m[1] == term][-1]
    # Ticks are on a 1 s grid: the ticks between the old leader's last and the new one's first.
    from datetime import datetime

    lost = round((datetime.fromisoformat(first[2]) - datetime.fromisoformat(before[2]))
                 .total_seconds()) - 1
    return {"elected": elected, "first": first[0] - t0, "gap": first[0] - before[0],
            "lost": float(lost)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--watchdog", type=float, default=3.0)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"SIGKILL": [], "SIGTERM": []}
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "RLOCK_BEAT_BROKER": f"redis+socket://{server.socket}?virtual_host=1",
               "RLOCK_BEAT_WATCHDOG": str(args.watchdog)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        logs: list[Path] = []
        procs = {p.pid: p for p in (spawn(env, tmp, logs) for _ in range(3))}
        watcher = Leader(server.client(db=1), GROUP, "rlock:")
        reader = Reader(server.client(db=1))
        reader.start()
        try:
            until(lambda: len(reader.got) >= 3, 60)
            for _ in range(args.rounds):
                for name, sig in (("SIGKILL", signal.SIGKILL), ("SIGTERM", signal.SIGTERM)):
                    results[name].append(fault(sig, watcher, reader, procs,
                                               args.watchdog + 30))
                    p = spawn(env, tmp, logs)
                    procs[p.pid] = p
                    time.sleep(2.5)  # the replacement is up and standing by
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait(30)
            reader.done.set()
    print(f"beat takeover, 3 replicas, watchdog_timeout {args.watchdog:g} s, "
          f"{args.rounds} rounds (median / max):")
    print("| fault | new leader elected | its first message | message gap | ticks coalesced |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        cells = []
        for key in ("elected", "first", "gap"):
            values = [r[key] for r in rows]
            cells.append(f"{statistics.median(values):.3f} / {max(values):.3f} s")
        lost = [r["lost"] for r in rows]
        cells.append(f"{statistics.median(lost):g} / {max(lost):g}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
