"""The locks under test behind one tiny interface, and the two ways commands are counted.

Counting: Redis (6.2 included, verified by the benchmark itself) counts every command a Lua
script calls in ``INFO commandstats``, so the server's figure says how much work a lock costs
Redis, not how many commands its client sends. The client figure is taken at redis-py's
command packer, which every command of a connection (pipelines and pub/sub included) passes
through exactly once. EVALSHA is never called from a script, so its two counts must agree:
that is the cross-check.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.connection import HiredisRespSerializer, PythonRespSerializer
from redis.utils import HIREDIS_AVAILABLE

#: Library keys, in report order. "floor" is two EVALSHA of ``return 1``: the least any
#: lock+unlock pair over this client can cost.
FLOOR = "floor"
RLOCK = "django-rlock"
RLOCK_LEASE = "django-rlock (lease)"
REDIS_PY = "redis-py Lock"
PRL = "python-redis-lock"
FAIR = "django-rlock FairLock"
SEMAPHORE = "django-rlock Semaphore"
PERMITS = "django-rlock PermitExpirableSemaphore"
#: A client that is not django-rlock: Redisson's own scripts and pub/sub (bench/redisson.py).
FOREIGN = "Redisson-style client"

FLOOR_SCRIPT = "return 1"
#: Lease/expire for every peer: far longer than any hold, so nothing expires mid-hold.
LEASE_S = 30
#: Commands that set a connection up (handshake), not lock traffic.
HANDSHAKE = frozenset({"hello", "client", "auth", "select"})


def command_name(arg: Any) -> str:
    """The lower-case command of a packer call (redis-py may pass ``"CLIENT SETINFO"`` as one arg)."""
    if isinstance(arg, (bytes, bytearray, memoryview)):
        arg = bytes(arg).decode("ascii", "replace")
    return str(arg).split(" ", 1)[0].lower()


class CountingPacker:
    """Wraps redis-py's command packer and counts each command by name (thread-safe)."""

    def __init__(self) -> None:
        self._inner: Any = HiredisRespSerializer() if HIREDIS_AVAILABLE else None
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def bind_encoder(self, encode: Callable[[Any], bytes], cutoff: int) -> None:
        if self._inner is None:
            self._inner = PythonRespSerializer(cutoff, encode)

    def pack(self, *args: Any) -> Any:
        name = command_name(args[0])
        with self._lock:
            self.counts[name] += 1
        return self._inner.pack(*args)

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def counting_client(conn: str | dict[str, Any]) -> tuple[redis.Redis, CountingPacker]:
    """A client like ``redis.Redis(**conn)`` (a str: a unix socket's path) whose connections
    count what they send."""
    client = redis.Redis(**({"unix_socket_path": conn} if isinstance(conn, str) else conn))
    packer = CountingPacker()
    pool = client.connection_pool
    if not HIREDIS_AVAILABLE:
        enc = pool.get_encoder()
        packer.bind_encoder(enc.encode, 6000)
    pool.connection_kwargs["command_packer"] = packer
    return client, packer


def warm_pool(client: redis.Redis, n: int) -> None:
    """Open ``n`` pooled connections now, so no handshake lands inside a measurement."""
    pool = client.connection_pool
    conns = [pool.get_connection() for _ in range(n)]
    for c in conns:
        c.connect()
    for c in conns:
        pool.release(c)


def commandstats(client: redis.Redis) -> dict[str, int]:
    """``INFO commandstats`` as {command: calls} (script-inner calls included, see module doc)."""
    out: dict[str, int] = {}
    for key, val in client.info("commandstats").items():
        name = key.removeprefix("cmdstat_").split("|", 1)[0]  # Redis 7: "client|setinfo"
        out[name] = out.get(name, 0) + int(val["calls"])
    return out


def delta(after: dict[str, int], before: dict[str, int],
          exclude: frozenset[str] = frozenset()) -> dict[str, int]:
    out = {k: v - before.get(k, 0) for k, v in after.items() if k not in exclude}
    return {k: v for k, v in out.items() if v}


@dataclass
class Adapter:
    """``acquire()`` blocks (bounded by ``wait_s``) and raises if the lock was not obtained."""

    acquire: Callable[[], None]
    release: Callable[[], None]


def make_adapter(lib: str, client: redis.Redis, name: str, wait_s: float | None = 30.0) -> Adapter:
    """One lock object of ``lib`` on ``name``: one per thread (each peer keeps its token per object).

    ``wait_s=None``: each library's plain blocking call (``lock()``, ``acquire()``), used where
    nothing contends; otherwise a wait bounded by ``wait_s`` that raises when it runs out.
    """
    if lib == FLOOR:
        sha = client.script_load(FLOOR_SCRIPT)

        def call() -> None:
            client.evalsha(sha, 0)
        return Adapter(call, call)
    if lib in (RLOCK, RLOCK_LEASE):
        from django_rlock import RLock
        lk = RLock(client, name)
        lease = float(LEASE_S) if lib == RLOCK_LEASE else None

        def acquire_rlock() -> None:
            if wait_s is None:
                lk.lock(lease_time=lease)
            elif not lk.try_lock(wait_time=wait_s, lease_time=lease):
                raise TimeoutError(f"{lib}: not acquired in {wait_s}s")
        return Adapter(acquire_rlock, lk.unlock)
    if lib == REDIS_PY:
        rp = client.lock(name, timeout=LEASE_S, blocking_timeout=wait_s)

        def acquire_rp() -> None:
            if not rp.acquire():
                raise TimeoutError(f"{lib}: not acquired in {wait_s}s")
        return Adapter(acquire_rp, rp.release)
    if lib == PRL:
        import redis_lock
        pl = redis_lock.Lock(client, name, expire=LEASE_S, auto_renewal=False)
        # python-redis-lock wants whole seconds, at most the expire.
        timeout = None if wait_s is None else max(1, min(int(wait_s), LEASE_S))

        def acquire_pl() -> None:
            if not pl.acquire(blocking=True, timeout=timeout):
                raise TimeoutError(f"{lib}: not acquired in {timeout}s")
        return Adapter(acquire_pl, pl.release)
    if lib == FAIR:
        from django_rlock.engine.fair import FairLock
        fl = FairLock(client, name)

        def acquire_fair() -> None:
            if wait_s is None:
                fl.lock()
            elif not fl.try_lock(wait_time=wait_s):
                raise TimeoutError(f"{lib}: not acquired in {wait_s}s")
        return Adapter(acquire_fair, fl.unlock)
    if lib == SEMAPHORE:
        from django_rlock.engine.semaphore import Semaphore
        sem = Semaphore(client, name)
        sem.try_set_permits(1 if wait_s is not None else 1000)  # contended: a mutex

        def acquire_sem() -> None:
            if wait_s is None:
                sem.acquire()
            elif not sem.try_acquire(wait_time=wait_s):
                raise TimeoutError(f"{lib}: not acquired in {wait_s}s")
        return Adapter(acquire_sem, sem.release)
    if lib == PERMITS:
        from django_rlock.engine.semaphore import PermitExpirableSemaphore
        pes = PermitExpirableSemaphore(client, name)
        pes.try_set_permits(1 if wait_s is not None else 1000)
        held: list[str] = []

        def acquire_permit() -> None:
            pid = pes.acquire() if wait_s is None else pes.try_acquire(wait_time=wait_s)
            if pid is None:
                raise TimeoutError(f"{lib}: not acquired in {wait_s}s")
            held.append(pid)

        def release_permit() -> None:
            pes.release(held.pop())
        return Adapter(acquire_permit, release_permit)
    if lib == FOREIGN:
        from .redisson import RedissonStyleLock
        rs = RedissonStyleLock(client, name)
        budget = 30.0 if wait_s is None else wait_s

        def acquire_redisson() -> None:
            if not rs.try_lock(budget):
                raise TimeoutError(f"{lib}: not acquired in {budget}s")
        return Adapter(acquire_redisson, rs.unlock)
    raise ValueError(f"unknown library {lib!r}")
