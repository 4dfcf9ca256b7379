"""Run by tests/engine/test_leader.py:
`python -m tests.engine._leader_proc SOCKET GROUP WATCHDOG_TIMEOUT OUT sync|async`.

Campaigns for GROUP and writes, one JSON line each (flushed, so a SIGKILL loses nothing
written), to OUT:

- ``{"s": [before, after, is_leader, term]}`` for every ``is_leader()`` call, made every 2 ms
  (``before``/``after``: CLOCK_MONOTONIC around the call; system-wide on Linux, so lines of
  different processes compare);
- ``{"ev": "elected"|"revoked", "arg": term|reason, "t": ..., "thread": ...}`` from the
  callbacks (``thread``: where they ran);
- ``{"ev": "stop", "t0": ..., "t1": ...}`` around ``stop()`` on SIGTERM, then exits 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio

from django_rlock import AsyncLeader, Leader


class Out:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
        self.lock = threading.Lock()

    def write(self, **rec: Any) -> None:
        with self.lock:
            self.f.write(json.dumps(rec) + "\n")


def callbacks(out: Out) -> dict[str, Any]:
    def elected(term: int) -> None:
        out.write(ev="elected", arg=term, t=time.monotonic(), thread=threading.current_thread().name)

    def revoked(reason: str) -> None:
        out.write(ev="revoked", arg=reason, t=time.monotonic(),
                  thread=threading.current_thread().name)

    return {"on_elected": elected, "on_revoked": revoked}


def sample(out: Out, leader: Any) -> None:
    before = time.monotonic()
    term = leader.term  # (a term that ends between the two reads: is_leader() says False)
    r = leader.is_leader()
    after = time.monotonic()
    out.write(s=[before, after, r and term is not None, term if r else None])


def run_sync(sock: str, group: str, wt: float, out: Out) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    leader = Leader(redis.Redis(unix_socket_path=sock), group, watchdog_timeout=wt,
                    **callbacks(out))
    leader.start()
    print("ready", flush=True)
    while not stop.is_set():
        sample(out, leader)
        time.sleep(0.002)
    t0 = time.monotonic()
    leader.stop()
    out.write(ev="stop", t0=t0, t1=time.monotonic())
    sample(out, leader)


async def run_async(sock: str, group: str, wt: float, out: Out) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    leader = AsyncLeader(redis.asyncio.Redis(unix_socket_path=sock), group, watchdog_timeout=wt,
                         **callbacks(out))
    await leader.start()
    print("ready", flush=True)
    while not stop.is_set():
        sample(out, leader)
        await asyncio.sleep(0.002)
    t0 = time.monotonic()
    await leader.stop()
    out.write(ev="stop", t0=t0, t1=time.monotonic())
    sample(out, leader)


def main(sock: str, group: str, wt: str, path: str, mode: str) -> None:
    out = Out(path)
    if mode == "async":
        asyncio.run(run_async(sock, group, float(wt), out))
    else:
        run_sync(sock, group, float(wt), out)


if __name__ == "__main__":
    main(*sys.argv[1:])
