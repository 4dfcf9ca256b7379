"""(W) One process holding 10,000 watchdog-mode locks: what keeping them alive costs.

Runs in a freshly spawned process so that the only django-rlock thread alive is the one
watchdog (no pub/sub listener, no holds left over from other phases); its main thread just
sleeps while the locks are held, so the process's CPU time is the watchdog's.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import redis

from .server import RedisServer

WATCHDOG_THREAD = "django-rlock-watchdog"


@dataclass
class WResult:
    locks: int
    watchdog_timeout: float
    period: float
    acquire_s: float
    periods: float
    round_trips: float          # per period
    renewed: float              # keys per period
    server_evalsha: float       # per period, INFO commandstats
    process_cpu_ms: float       # per period
    thread_cpu_ms: float        # per period, the watchdog thread alone
    redis_cpu_ms: float         # per period, INFO cpu of the server
    redis_script_ms: float      # per period, EVALSHA usec in INFO commandstats
    watchdog_threads: int
    threads_total: int
    alive: int                  # keys still there with a TTL > 0 after the observation
    min_ttl_ms: int
    release_s: float
    left_after_release: int


def _server_sample(c: redis.Redis) -> tuple[int, float, float]:
    ev = c.info("commandstats").get("cmdstat_evalsha", {})
    cpu = c.info("cpu")
    return (int(ev.get("calls", 0)), float(ev.get("usec", 0)) / 1e3,
            (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e3)


def _thread_cpu(t: threading.Thread | None) -> float:
    """CPU seconds of one thread (Linux/POSIX thread CPU clock); NaN where unsupported."""
    if t is None or t.ident is None:
        return float("nan")
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    except (AttributeError, OSError):
        return float("nan")


def _child(socket_path: str, n: int, watchdog_timeout: float, settle: float, observe: float,
           out: Any) -> None:
    try:
        from django_rlock import RLock
        from django_rlock.engine.watchdog import watchdog

        client = redis.Redis(unix_socket_path=socket_path)
        stats = redis.Redis(unix_socket_path=socket_path)
        locks = [RLock(client, f"bench:w:{i}", watchdog_timeout=watchdog_timeout) for i in range(n)]
        t0 = time.perf_counter()
        for lk in locks:
            lk.lock()
        acquire_s = time.perf_counter() - t0
        period = watchdog_timeout / 3.0
        # Let the acquisition burst settle into the steady sweep schedule.
        time.sleep(settle * period)
        wd = watchdog()
        wd_threads = [t for t in threading.enumerate() if t.name == WATCHDOG_THREAD]
        wdt = wd_threads[0] if wd_threads else None
        rt0, rn0 = wd.round_trips, wd.renewed
        ev0, us0, rc0 = _server_sample(stats)
        cpu0, tc0, w0 = time.process_time(), _thread_cpu(wdt), time.monotonic()
        time.sleep(observe * period)
        cpu1, tc1, w1 = time.process_time(), _thread_cpu(wdt), time.monotonic()
        ev1, us1, rc1 = _server_sample(stats)
        rt1, rn1 = wd.round_trips, wd.renewed
        periods = (w1 - w0) / period
        n_wd = sum(1 for t in threading.enumerate() if t.name == WATCHDOG_THREAD)
        n_threads = threading.active_count()
        ttls: list[int] = []
        names = [lk.key for lk in locks]
        for i in range(0, n, 1000):
            pipe = client.pipeline(transaction=False)
            for name in names[i:i + 1000]:
                pipe.pttl(name)
            ttls.extend(int(x) for x in pipe.execute())
        t0 = time.perf_counter()
        for lk in locks:
            lk.unlock()
        release_s = time.perf_counter() - t0
        left = sum(int(client.exists(*names[i:i + 1000])) for i in range(0, n, 1000))
        out.put(("ok", WResult(
            n, watchdog_timeout, period, acquire_s, periods,
            (rt1 - rt0) / periods, (rn1 - rn0) / periods, (ev1 - ev0) / periods,
            (cpu1 - cpu0) * 1e3 / periods, (tc1 - tc0) * 1e3 / periods, (rc1 - rc0) / periods,
            (us1 - us0) / periods, n_wd, n_threads, sum(1 for t in ttls if t > 0),
            min(ttls) if ttls else -2, release_s, left)))
    except Exception:
        out.put(("error", traceback.format_exc()))


def run(server: RedisServer, n: int = 10_000, watchdog_timeout: float = 3.0, settle: float = 2.0,
        observe: float = 8.0) -> WResult:
    """``settle`` and ``observe`` are in watchdog periods (``watchdog_timeout / 3``)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(server.socket_path, n, watchdog_timeout, settle, observe, out),
                    daemon=True)
    p.start()
    budget = 120 + (settle + observe) * watchdog_timeout / 3.0
    try:
        deadline = time.monotonic() + budget
        while True:
            try:
                kind, payload = out.get(timeout=1.0)
                break
            except queue.Empty:
                if p.exitcode is not None or time.monotonic() > deadline:
                    raise RuntimeError("watchdog benchmark process died or hung") from None
        if kind != "ok":
            raise RuntimeError(f"watchdog benchmark failed:\n{payload}")
        return payload
    finally:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(5)
