"""Run by test_stale_grants.py: ``python -m tests.failover._stale_proc ROLE CONFIG_JSON``.

Every role reaches Redis through the client ``cfg`` names (``sentinels`` + ``service``: a
redis-py ``Sentinel.master_for`` client; ``port``: a plain client of 127.0.0.1:port; ``socket``:
a unix socket), and appends what it did, one JSON object a line, to ``cfg["log"]``. Times are
``time.monotonic()``: CLOCK_MONOTONIC is one clock for every process on the machine, so the
test orders critical sections across processes.

holder: takes ``cfg["lock"]`` in watchdog mode (``cfg["watchdog"]``), prints its owner field,
    logs ``doubt`` (is_lost() first true) and ``told`` (on_lost); on a line on stdin, unlocks
    (logged) and exits.
looper: ``with lock:`` (``hold`` seconds inside, then ``pause`` seconds of other work) in a
    loop until the file ``cfg["stop"]`` exists, each critical section logged
    (``enter``/``exit``), errors (the failover window) logged and tried again after 50 ms.
driven: one command a line on stdin, one JSON reply a line on stdout: ``owner``; ``try W``
    (``try_lock(wait_time=W)``: true/false, or the error that ended the wait); ``with H``
    (``with lock:`` holding H seconds, the section logged); ``hold`` (``lock()``, logged
    ``enter``) and ``release`` (``unlock()``, logged ``exit``); ``exit``.
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
import time
from typing import Any

import redis

from django_rlock import RLock
from django_rlock.engine import identity


def _client(cfg: dict[str, Any]) -> redis.Redis:
    timeout = cfg.get("socket_timeout", 2)
    if "retries" in cfg:  # redis-py 8 retries a connect 10 times by default, ~5 s in all
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        retry = Retry(NoBackoff(), cfg["retries"])
        if "port" in cfg:
            return redis.Redis("127.0.0.1", cfg["port"], socket_timeout=timeout, retry=retry)
    if "sentinels" in cfg:
        from redis.sentinel import Sentinel
        sentinel = Sentinel([tuple(a) for a in cfg["sentinels"]], socket_timeout=timeout)
        return sentinel.master_for(cfg["service"], socket_timeout=timeout)
    if "port" in cfg:
        return redis.Redis("127.0.0.1", cfg["port"], socket_timeout=timeout)
    return redis.Redis(unix_socket_path=cfg["socket"], socket_timeout=timeout)


class _Log:
    def __init__(self, path: str, who: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - kept for the process's life
        self._who = who
        self._lock = threading.Lock()

    def __call__(self, event: str, **kw: Any) -> None:
        line = json.dumps({"who": self._who, "pid": os.getpid(), "event": event,
                           "t": time.monotonic(), **kw})
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()


def _lock(cfg: dict[str, Any], client: redis.Redis, **kw: Any) -> RLock:
    return RLock(client, cfg["lock"], watchdog_timeout=cfg.get("watchdog", 30.0), **kw)


def holder(cfg: dict[str, Any]) -> None:
    log = _Log(cfg["log"], cfg["tag"])
    client = _client(cfg)
    lock = _lock(cfg, client, on_lost=lambda name: log("told"))
    lock.lock()
    log("enter")
    print(json.dumps({"owner": identity.thread_owner()}), flush=True)
    doubt = False
    while not select.select([sys.stdin], [], [], 0.01)[0]:
        if not doubt and lock.is_lost():
            doubt = True
            log("doubt")
    sys.stdin.readline()
    try:
        lock.unlock()
        log("exit", unlock="ok")
    except Exception as exc:
        log("exit", unlock=f"{type(exc).__name__}: {exc}")
    print("done", flush=True)


def looper(cfg: dict[str, Any]) -> None:
    log = _Log(cfg["log"], cfg["tag"])
    client = _client(cfg)
    lock = _lock(cfg, client)
    hold = cfg.get("hold", 0.01)
    pause = cfg.get("pause", 0.0)
    print(json.dumps({"owner": identity.thread_owner()}), flush=True)
    while not os.path.exists(cfg["stop"]):
        try:
            with lock:
                log("enter")
                time.sleep(hold)
                log("exit")
            time.sleep(pause)  # other work between critical sections
        except Exception as exc:  # the failover window: tried again
            log("error", error=f"{type(exc).__name__}: {exc}"[:200])
            time.sleep(0.05)
    print("stopped", flush=True)


def driven(cfg: dict[str, Any]) -> None:
    log = _Log(cfg["log"], cfg["tag"])
    client = _client(cfg)
    lock = _lock(cfg, client)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        reply: dict[str, Any] = {"cmd": cmd}
        t0 = time.monotonic()
        try:
            if cmd == "owner":
                reply["owner"] = identity.thread_owner()
            elif cmd == "try":
                reply["ok"] = lock.try_lock(wait_time=float(arg))
                if reply["ok"]:
                    log("enter")
            elif cmd == "with":
                with lock:
                    log("enter")
                    time.sleep(float(arg or 0))
                    log("exit")
                reply["ok"] = True
            elif cmd == "hold":
                lock.lock()
                log("enter")
                reply["ok"] = True
            elif cmd == "release":
                log("exit")
                lock.unlock()
                reply["ok"] = True
            elif cmd == "exit":
                print(json.dumps(reply), flush=True)
                return
            else:
                reply["error"] = f"unknown command {cmd!r}"
        except Exception as exc:
            reply["error"] = f"{type(exc).__name__}: {exc}"[:300]
            log("error", error=reply["error"])
        reply["took"] = time.monotonic() - t0
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    {"holder": holder, "looper": looper, "driven": driven}[sys.argv[1]](json.loads(sys.argv[2]))
