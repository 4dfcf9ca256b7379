from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_rlock.engine import records
from django_rlock.engine.scripts import (
    ACQUIRE_SCRIPT,
    FORCE_UNLOCK_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
)
from django_rlock.engine.watchdog import watchdog
from tests.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    records.forget()  # an empty server: this process's record is written again (invariant 43)
    for script in (ACQUIRE_SCRIPT, RELEASE_SCRIPT, RENEW_SCRIPT, FORCE_UNLOCK_SCRIPT):
        client.script_load(script.source)  # so first use is not counted as NOSCRIPT + EVAL
    client.config_resetstat()
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _no_index_sweep_left_over() -> None:
    """The index sweep (``engine/sweep.py``) runs a round 10 s after a process's first acquire
    on a server and prefix, then every 10 s: rounds for earlier tests' servers and prefixes are
    dropped, so a test's command counts see only its own (a test shorter than 10 s, none)."""
    watchdog().sweeper.forget()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of the test's own, for tests that restart or pause it."""
    server = RedisServer().start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


class Holder:
    """Runs calls on one live thread, so the thread id (the owner) stays unique.

    Python reuses thread ids: a lock "held" by a finished thread looks owned by the next.
    """

    def __init__(self) -> None:
        self._calls: list[tuple[Callable[[], Any], list[Any], threading.Event]] = []
        self._cv = threading.Condition()
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._calls and not self._stop:
                    self._cv.wait()
                if self._stop and not self._calls:
                    return
                fn, out, done = self._calls.pop(0)
            try:
                out.append(("ok", fn()))
            except BaseException as exc:
                out.append(("err", exc))
            done.set()

    def submit(self, fn: Callable[[], Any]) -> Callable[[float], Any]:
        """Start ``fn`` on the holder thread; returns ``result(timeout)``."""
        out: list[Any] = []
        done = threading.Event()
        with self._cv:
            self._calls.append((fn, out, done))
            self._cv.notify()

        def result(timeout: float = 30.0) -> Any:
            if not done.wait(timeout):
                raise TimeoutError("holder call did not finish")
            kind, value = out[0]
            if kind == "err":
                raise value
            return value

        return result

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        return self.submit(fn)(timeout)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.thread.join(10)


@pytest.fixture
def holders() -> Iterator[Callable[[], Holder]]:
    made: list[Holder] = []

    def make() -> Holder:
        h = Holder()
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def inner_commands(client: redis.Redis) -> dict[str, int]:
    """Commands run since the last ``CONFIG RESETSTAT``, by name, without the client's and the
    test's own (scripts, WAIT, the replica probe...): what the scripts ran inside."""
    own = {"evalsha", "eval", "info", "wait", "config", "hello", "ping", "client"}
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}
    return {k: n for k, n in calls.items() if k.split("|")[0] not in own}  # (6.2: no "|sub")


def script_calls(client: redis.Redis) -> int:
    """EVAL + EVALSHA commands the clients sent (script-inner commands are not counted here)."""
    stats = client.info("commandstats")
    return sum(stats.get(k, {}).get("calls", 0) for k in ("cmdstat_evalsha", "cmdstat_eval"))
