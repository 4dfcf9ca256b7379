"""What the beat tests share: ``celery beat`` processes of ``tests.celery.beat_app`` on a Redis
of the test's own, and a reader of the broker's queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from django_rlock.testing import RedisServer

ROOT = Path(__file__).parents[2]
WATCHDOG = 3.0  # s: the beats' watchdog timeout (their lease)
BROKER_DB = 1
GROUP = "celery-beat:beattests"
SECOND = 1_000_000  # µs


@dataclass(frozen=True)
class Message:
    at: float  # monotonic arrival time at the reader
    wall: float  # time.time() at arrival
    term: int
    tick: int  # µs since the epoch
    raw_tick: str


def tick_us(value: str) -> int:
    when = datetime.fromisoformat(value)
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


class Reader:
    """Pops every message of the ``celery`` queue as it arrives."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.messages: list[Message] = []
        self.other: list[Any] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.client.brpop(["celery"], timeout=0.2)
            if got is None:
                continue
            at, wall = time.monotonic(), time.time()
            headers = json.loads(got[1])["headers"]
            if "rlock_beat_tick" not in headers:
                self.other.append(headers)
                continue
            self.messages.append(Message(at, wall, int(headers["rlock_beat_term"]),
                                         tick_us(headers["rlock_beat_tick"]),
                                         headers["rlock_beat_tick"]))

    def since(self, t: float) -> list[Message]:
        return [m for m in list(self.messages) if m.at > t]

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def beat_env(server: RedisServer, **extra: str) -> dict[str, str]:
    """The environment of a beat of ``beat_app`` on ``server`` (a ``PYTHONPATH`` given to the
    tests, e.g. CI's older Celery, stays first)."""
    path = [p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path),
           "RLOCK_BEAT_BROKER": f"redis+socket://{server.socket}?virtual_host={BROKER_DB}",
           "RLOCK_BEAT_WATCHDOG": str(WATCHDOG), **extra}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # pytest-django's: a plain Celery app has none
    return env


class Beats:
    """``n`` ``celery beat`` processes of ``tests.celery.beat_app``."""

    def __init__(self, scheduler: str, env: dict[str, str], tmp: Path, n: int = 3) -> None:
        self.logs = [tmp / f"beat{i}.log" for i in range(n)]
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.celery.beat_app", "beat", "-l", "info",
             "-S", scheduler], cwd=tmp, env=env, stdout=log.open("w"),
            stderr=subprocess.STDOUT, start_new_session=True) for log in self.logs]

    def by_pid(self, pid: int) -> subprocess.Popen[bytes]:
        return next(p for p in self.procs if p.pid == pid)

    def log_of(self, pid: int) -> str:
        return self.logs[self.procs.index(self.by_pid(pid))].read_text()

    def text(self) -> str:
        return "\n".join(f"--- beat{i}\n{log.read_text()}" for i, log in enumerate(self.logs))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
