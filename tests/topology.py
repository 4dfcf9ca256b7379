"""Throw-away Redis Sentinel topologies on loopback: a master, N replicas, S sentinels.

    with SentinelTopology(replicas=1, sentinels=3) as topo:
        client = topo.master_for()           # redis-py's Sentinel client for the service
        old = topo.master()
        topo.kill(old)                       # SIGKILL: no goodbye, like a crashed host
        new = topo.wait_for_failover(old)    # a replica promoted, clients can discover it

Sentinel speaks TCP only, so every process gets a loopback port picked at run time (bind port
0, read it, close it); a process that loses the race for its port exits at once and is started
again on another. Timings are short enough that a failover takes seconds instead of the
production default's half minute, and long enough not to flap on a loaded 2-core machine
(``DOWN_AFTER_MS``, ``FAILOVER_TIMEOUT_MS``). Everything is stopped and every temp dir removed
on exit, however the test ended.

A failover test must fail loudly on a split brain rather than pass by luck: ``roles()`` reads
ROLE from every live server, ``assert_one_master()`` raises ``SplitBrainError`` when two of
them say master (or the sentinels switched master more than expected), and
``split_brain_watch()`` polls that in the background for the length of a ``with`` block.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import redis
from redis.sentinel import MasterNotFoundError, Sentinel

from django_rlock.testing import RedisServer, free_port, redis_server_binary

T = TypeVar("T")

#: Sentinel's down-after: a master that has not answered for this long is subjectively down.
#: 1000 flapped on a loaded 2-core machine: a sentinel marked the replica it had just promoted
#: down and promoted another one (two masters for ~11 s). A server that does not answer a PING
#: for 3 s on loopback is not one a test should fail over from.
DOWN_AFTER_MS = 3000
#: Sentinel's failover-timeout: the promotion must be seen within it, and the same master is
#: not failed over again within twice it. Well above down-after, so a slow promotion under load
#: is waited for, not aborted and started again on another replica.
FAILOVER_TIMEOUT_MS = 10000


class SplitBrainError(AssertionError):
    """Two live servers said ``master`` at once, or the sentinels failed over more often than
    the test caused: the run proves nothing about locks and must fail, not pass by luck."""


#: Attempts at a free port before giving up (another process may grab it between our probe
#: and the server's bind).
PORT_ATTEMPTS = 5


def _until(cond: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str] = str
           ) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s {detail()}".rstrip())
        time.sleep(0.02)


def _on_free_port(start: Callable[[int], T]) -> T:
    """``start(port)`` on a fresh free port; again on another if the port was taken meanwhile."""
    last: Exception | None = None
    for _ in range(PORT_ATTEMPTS):
        try:
            return start(free_port())
        except RuntimeError as exc:  # the process exited: most likely "address already in use"
            last = exc
    raise RuntimeError(f"no free loopback port after {PORT_ATTEMPTS} attempts") from last


class SentinelProcess:
    """One ``redis-server <conf> --sentinel`` with its own directory, config and log."""

    def __init__(self, binary: str, directory: Path, port: int, service: str, master_port: int,
                 quorum: int, down_after_ms: int, failover_timeout_ms: int) -> None:
        self.binary = binary
        self.dir = directory
        self.port = port
        self.log = directory / "sentinel.log"
        self.conf = directory / "sentinel.conf"
        # Sentinel rewrites its config file as the topology changes: it must be its own, writable.
        self.conf.write_text("\n".join([
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {directory}",
            f"logfile {self.log}",
            f"sentinel monitor {service} 127.0.0.1 {master_port} {quorum}",
            f"sentinel down-after-milliseconds {service} {down_after_ms}",
            f"sentinel failover-timeout {service} {failover_timeout_ms}",
            f"sentinel parallel-syncs {service} 1",
            "",
        ]))
        self.proc: subprocess.Popen[bytes] | None = None

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis("127.0.0.1", self.port, socket_timeout=2, **kwargs)

    def start(self, timeout: float = 10.0) -> Self:
        self.proc = subprocess.Popen([self.binary, str(self.conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.client() as c:
                    c.ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"sentinel on port {self.port} did not start: "
                                       f"{self.tail()}") from None
                time.sleep(0.02)

    def tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Processes:
    """What every throw-away topology shares: its clients, server processes and temp dir,
    all gone on ``stop()`` (and on leaving the ``with`` block), however the test ended."""

    _clients: list[Any]
    servers: list[RedisServer]
    dir: Path

    def start(self, timeout: float = 30.0) -> Self:
        """Start every process (``_start``); a topology that fails half-way is stopped."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        self._clients.clear()
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class SentinelTopology(Processes):
    """A master, ``replicas`` replicas of it and ``sentinels`` sentinels watching it.

    ``servers[0]`` is the first master; which server is the master later is the sentinels'
    word (:meth:`master`). The service name is unique per topology: django-redis keeps its
    pools in a process-wide dict keyed by URL, and ``redis://<service>/0`` must not find a
    pool left over from another topology.
    """

    def __init__(self, replicas: int = 1, sentinels: int = 3, *, quorum: int = 2,
                 down_after_ms: int = DOWN_AFTER_MS,
                 failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
                 service: str | None = None, binary: str | None = None) -> None:
        self.binary = binary or redis_server_binary()
        self.n_replicas = replicas
        self.n_sentinels = sentinels
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.service = service or f"rlock-{uuid.uuid4().hex[:8]}"
        self.dir = Path(tempfile.mkdtemp(prefix="rlock-sentinel-"))
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelProcess] = []
        self._clients: list[Any] = []

    # -- lifecycle -----------------------------------------------------------------------
    def _start(self, timeout: float) -> None:
        master = self._server("master", [])
        for i in range(self.n_replicas):
            self._server(f"replica{i}", ["--replicaof", "127.0.0.1", str(master.port)])
        with master.client() as m:
            _until(lambda: self._online_replicas(m) == self.n_replicas, timeout,
                   f"{self.n_replicas} replica(s) in sync")
        for i in range(self.n_sentinels):
            d = self.dir / f"sentinel{i}"
            d.mkdir()
            self.sentinels.append(_on_free_port(lambda port, d=d: SentinelProcess(
                self.binary, d, port, self.service, master.port, self.quorum,
                self.down_after_ms, self.failover_timeout_ms).start()))
        # A failover needs a quorum of sentinels that know each other (hello messages, every
        # 2 s) and a replica they have seen: until then a dead master is never replaced.
        _until(self._ready, timeout, "sentinels aware of each other and of the replicas",
               lambda: self.sentinel_logs())

    def _server(self, name: str, args: list[str]) -> RedisServer:
        d = self.dir / name
        d.mkdir()

        def start(port: int) -> RedisServer:
            # Diskless sync waits 5 s by default (Redis 7) for more replicas to share the
            # transfer: a replica would not be in sync (nor a candidate) until then.
            return RedisServer(str(d), self.binary, port=port,
                               args=["--repl-diskless-sync-delay", "0", *args]).start()

        server = _on_free_port(start)
        self.servers.append(server)
        return server

    @staticmethod
    def _online_replicas(client: redis.Redis) -> int:
        info = client.info("replication")
        return sum(1 for k, v in info.items()
                   if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")

    def _ready(self) -> bool:
        for s in self.sentinels:
            with s.client() as c:
                state = c.sentinel_master(self.service)
                if (state["num-other-sentinels"] < self.n_sentinels - 1
                        or state["num-slaves"] < self.n_replicas
                        or state["is_sdown"] or state["is_odown"]):
                    return False
                reps = c.sentinel_slaves(self.service)
                if sum(1 for r in reps if not r["is_sdown"]
                       and r.get("master-link-status") == "ok") < self.n_replicas:
                    return False
        return True

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        super().stop()

    # -- clients ---------------------------------------------------------------------------
    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def sentinel(self, **kwargs: Any) -> Sentinel:
        """A redis-py ``Sentinel`` over our sentinels (closed with the topology)."""
        kwargs.setdefault("socket_timeout", 2)
        s = Sentinel(self.sentinel_addresses, **kwargs)
        self._clients.append(s)
        return s

    def master_for(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client of the service's master, following it through failovers."""
        kwargs.setdefault("socket_timeout", 2)
        client = self.sentinel().master_for(self.service, **kwargs)
        self._clients.append(client)
        return client

    # -- topology changes --------------------------------------------------------------
    def master_port(self) -> int:
        """The master's port as a client discovers it now (MasterNotFoundError: none yet)."""
        with Sentinel(self.sentinel_addresses, socket_timeout=2) as s:
            return int(s.discover_master(self.service)[1])

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def master(self) -> RedisServer:
        return self.server(self.master_port())

    def replicas(self) -> list[RedisServer]:
        master = self.master_port()
        return [s for s in self.servers if s.port != master and s.proc is not None]

    def kill(self, server: RedisServer) -> None:
        """SIGKILL ``server``: its clients see the connection drop, nothing is flushed."""
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        server.proc = None

    def wait_for_failover(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Block until clients discover a new master (not ``old``) that says it is one."""

        def promoted() -> RedisServer | None:
            try:
                port = self.master_port()
            except MasterNotFoundError:
                return None
            if port == old.port:
                return None
            new = self.server(port)
            with new.client() as c:
                return new if c.role()[0] in (b"master", "master") else None

        new = _until(promoted, timeout, "a replica promoted by the sentinels",
                     lambda: self.sentinel_logs())
        self.assert_one_master()
        return new

    # -- split brain -------------------------------------------------------------------
    def roles(self) -> dict[int, str]:
        """ROLE of every live server, by port (``"?"``: it did not answer within 1 s)."""
        out: dict[int, str] = {}
        for s in self.servers:
            if s.proc is None or s.proc.poll() is not None:
                continue
            try:
                with s.client(socket_timeout=1.0) as c:
                    role = c.role()[0]
                out[s.port] = role.decode() if isinstance(role, bytes) else str(role)
            except (redis.RedisError, OSError):
                out[s.port] = "?"
        return out

    def switches(self) -> int:
        """The most ``+switch-master`` events one sentinel logged: failovers it saw end."""
        counts = []
        for s in self.sentinels:
            try:
                counts.append(s.log.read_text(errors="replace").count("+switch-master"))
            except OSError:
                counts.append(0)
        return max(counts, default=0)

    def assert_one_master(self, failovers: int | None = None) -> None:
        """At most one live server says master; with ``failovers``, the sentinels switched
        master at most that many times (a flap is a second switch). Raises SplitBrainError."""
        roles = self.roles()
        masters = [port for port, role in roles.items() if role == "master"]
        if len(masters) > 1:
            raise SplitBrainError(f"split brain: {len(masters)} masters {roles}\n"
                                  f"{self.sentinel_logs()}")
        if failovers is not None and self.switches() > failovers:
            raise SplitBrainError(f"the sentinels failed over {self.switches()} times (expected "
                                  f"at most {failovers}): a flap; roles now {roles}\n"
                                  f"{self.sentinel_logs()}")

    @contextmanager
    def split_brain_watch(self, failovers: int = 1, every: float = 0.1) -> Iterator[list[str]]:
        """Poll ``roles()`` in the background for the block; on leaving it, raise
        SplitBrainError if two servers ever said master at once, or the sentinels switched
        master more than ``failovers`` times. Yields the list of what it saw go wrong."""
        seen: list[str] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(every):
                roles = self.roles()
                if sum(1 for r in roles.values() if r == "master") > 1:
                    seen.append(f"{time.monotonic():.2f}: {roles}")

        t = threading.Thread(target=watch, name="split-brain-watch", daemon=True)
        t.start()
        try:
            yield seen
        finally:
            stop.set()
            t.join(5)
        if seen:
            raise SplitBrainError(f"split brain seen {len(seen)} time(s), first {seen[0]}\n"
                                  f"{self.sentinel_logs()}")
        self.assert_one_master(failovers)

    def sentinel_logs(self, chars: int = 1200) -> str:
        """The tail of every sentinel's log, for a failure message."""
        return "\n".join(f"--- sentinel :{s.port}\n{s.tail(chars)}" for s in self.sentinels)
