"""A private PostgreSQL for the transaction tests: initdb in a temp dir, a unix socket only.

No TCP port (``listen_addresses=''``), no fsync, stopped and deleted afterwards. PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` user (made by
Debian's package; else ``nobody``; ``$RLOCK_TEST_PG_USER`` names another) and the temp dir is
given to it.
The binaries come from ``$PG_BIN``, else ``pg_config --bindir``, else the newest
``/usr/lib/postgresql/<version>/bin``, else ``initdb`` on ``PATH``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self


def postgres_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None when PostgreSQL is absent."""
    candidates: list[str] = []
    if os.environ.get("PG_BIN"):
        candidates.append(os.environ["PG_BIN"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            candidates.append(subprocess.run([pg_config, "--bindir"], capture_output=True,
                                             text=True, timeout=10).stdout.strip())
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted(versions, key=lambda p: int(Path(p).parent.name) if Path(p).parent.name
                         .isdigit() else 0, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(os.path.realpath(initdb)).parent))
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "postgres").is_file():
            return Path(c)
    return None


def _server_user() -> pwd.struct_passwd:
    """Whom the server runs as when we are root: ``$RLOCK_TEST_PG_USER``, ``postgres``, ``nobody``."""
    wanted = os.environ.get("RLOCK_TEST_PG_USER")
    for name in ([wanted] if wanted else ["postgres", "nobody"]):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError(f"no user to run PostgreSQL as (tried {wanted or 'postgres, nobody'})")


class PostgresServer:
    """``with PostgresServer() as pg:`` a throw-away cluster; ``pg.settings()`` for DATABASES."""

    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir or postgres_bindir()
        if found is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb, postgres) found")
        self.bindir = found
        self.dir = tempfile.mkdtemp(prefix="rlock-pg-")
        self.data = os.path.join(self.dir, "data")
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = _server_user()
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    @property
    def socket_dir(self) -> str:
        return self.dir

    def settings(self, name: str = "postgres", **extra: Any) -> dict[str, Any]:
        """A ``DATABASES`` entry for this server (psycopg, over the unix socket)."""
        return {"ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": "postgres",
                "HOST": self.dir, "PORT": "", **extra}

    def _run(self, *args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, timeout=120, cwd=self.dir,
                       **self._user)

    def start(self, timeout: float = 30.0) -> Self:
        self._run(str(self.bindir / "initdb"), "-D", self.data, "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--no-sync", "--no-instructions")
        log = open(os.path.join(self.dir, "postgres.log"), "wb")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", self.data, "-c", "listen_addresses=",
             "-c", f"unix_socket_directories={self.dir}", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=40", "-c", "shared_buffers=16MB"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, **self._user)
        log.close()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not start: {self.log()}")
            time.sleep(0.05)
        return self

    def _ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(host=self.dir, user="postgres", dbname="postgres",
                                 connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return Path(self.dir, "postgres.log").read_text(errors="replace")[-4000:]
        return ""

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)  # "fast" shutdown: ends the sessions
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
