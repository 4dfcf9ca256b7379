"""The django-rlock demo: the example project on a real Redis, with its dev server and a
Celery worker.

    make demo          # or: python demo/run_demo.py

Uses ``$REDIS_URL`` if set; otherwise starts a private redis-server (see ``engine_demo``) on a
unix socket. Then it migrates the SQLite database, creates the superuser ``demo`` / ``demo``,
runs ``manage.py runserver`` and ``celery -A testproject worker`` (prefork, 2 children), and
prints what to try. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine_demo import DemoError, EmbeddedRedis, Signals, on_signal

ROOT = Path(__file__).resolve().parents[1]
USER, PASSWORD = "demo", "demo"


def free_port(preferred: int = 8000) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise DemoError("no free TCP port on 127.0.0.1")


def project_env(redis_url: str) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONUNBUFFERED": "1"}
    if redis_url.startswith("unix://"):
        path = redis_url[len("unix://"):].split("?", 1)[0]
        env["REDIS_URL"] = f"unix://{path}?db=0"
        broker = f"redis+socket://{path}?virtual_host=1"
    else:
        env["REDIS_URL"] = redis_url
        broker = redis_url.rsplit("/", 1)[0] + "/1" if redis_url.count("/") >= 3 else redis_url
    env.setdefault("CELERY_BROKER_URL", broker)
    env.setdefault("CELERY_RESULT_BACKEND", env["CELERY_BROKER_URL"])
    return env


def manage(env: dict[str, str], *args: str, check: bool = True) -> int:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          check=check, stdin=subprocess.DEVNULL).returncode


def start(env: dict[str, str], argv: list[str]) -> subprocess.Popen[bytes]:
    # Its own session: Ctrl-C reaches only this script, which stops the children in order.
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    # SIGTERM to the process alone: Celery's warm shutdown lets its pool finish the tasks in
    # flight and stops its children itself (the whole group at once killed them mid-task:
    # a WorkerLostError traceback). What is left after 20 s goes with its group.
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise DemoError(f"the dev server did not answer at {url}") from None
            time.sleep(0.2)


def instructions(base: str, env: dict[str, str]) -> str:
    manage = f"REDIS_URL='{env['REDIS_URL']}' {sys.executable} manage.py"
    return f"""
django-rlock demo is running
  site   {base}/demo/
  admin  {base}/admin/django_rlock/lock/   (user {USER!r}, password {PASSWORD!r})

Try, in another terminal:
  # two concurrent requests for one report: one 200, one 423 Locked with Retry-After
  curl -s -i '{base}/demo/report/1/?seconds=5' & sleep 0.5; curl -s -i '{base}/demo/report/1/'; wait
  # a different report is a different lock: both run
  curl -s '{base}/demo/report/1/?seconds=3' & curl -s '{base}/demo/report/2/?seconds=3'; wait
  # the async view: concurrent requests are distinct owners even on one event loop
  curl -s '{base}/demo/async-report/1/?seconds=3' & curl -s -i '{base}/demo/async-report/1/'; wait
  # a duplicate Celery task is skipped while the first one runs (see the worker log)
  curl -s '{base}/demo/sync/7/'
  # the live locks, while something holds one
  curl -s '{base}/demo/report/3/?seconds=20' & sleep 1; {manage} locks list

Press Ctrl-C to stop the server, the worker and Redis.
"""


def main() -> int:
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server: EmbeddedRedis | None = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        redis_url = os.environ.get("REDIS_URL")
        if not redis_url:
            server = EmbeddedRedis()
            version = server.start()
            redis_url = server.url
            print(f"started redis-server {version} at {redis_url}")
        env = project_env(redis_url)
        manage(env, "migrate", "--noinput", "-v", "0")
        manage({**env, "DJANGO_SUPERUSER_USERNAME": USER, "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
                "DJANGO_SUPERUSER_EMAIL": "demo@example.com"},
               "createsuperuser", "--noinput", check=False)  # fails harmlessly if it exists
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        procs.append(start(env, [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                                 "--noreload"]))
        procs.append(start(env, [sys.executable, "-m", "celery", "-A", "testproject", "worker",
                                 "-P", "prefork", "-c", "2", "-l", "info"]))
        wait_for_http(f"{base}/demo/")
        print(instructions(base, env), flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("a demo process exited; stopping the rest", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0 if Signals.received == signal.SIGINT else 143  # Ctrl-C is how a demo ends
    except (DemoError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        Signals.armed = False
        for proc in reversed(procs):
            stop(proc)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
