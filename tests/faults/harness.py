"""The controller of the fault test: servers, workers, and a seeded schedule of faults.

``FaultRun(seed, seconds).run()`` starts two redis-servers of its own (unix sockets): the
*lock* server, which the faults hit, and the *store*, which none does (the data the locks
protect). It starts ``workers`` worker processes (``tests.faults.worker``), then injects one
fault every ``gap`` seconds, drawn from shuffled rounds of ``kinds`` (so every kind comes up
once per round; the default round has ``stop_long`` three times), each logged with monotonic times
to ``faults.jsonl``:

- ``kill``: SIGKILL a worker (its open sections end there) and start a replacement;
- ``stop_short`` / ``stop_long``: SIGSTOP a worker for 0.1-0.35 or 1.3-2.0 times the lease,
  then SIGCONT (a stop runs alongside later faults);
- ``kill_pubsub``: CLIENT KILL every ``rlock-pubsub:`` and ``rlock-wake:`` connection;
- ``kill_conns``: CLIENT KILL every worker's normal connection (named ``rlock-fault:<wid>``);
- ``pause_write`` / ``pause_all``: ``CLIENT PAUSE <ms> WRITE`` / ``ALL`` for 0.2-1.2 times
  the lease (logged from the call to its reply + ``ms``: a pause sent during a ``pause_all``
  runs when that one ends);
- ``restart``: stop the lock server and start it again, empty, on the same socket.

At the end every worker is continued and sent SIGTERM (its threads finish their section),
and the store's counters and logs are saved to ``store.json`` for the checker.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from django_rlock.testing import RedisServer
from tests.faults.worker import KINDS

FAULT_KINDS = ("kill", "stop_short", "stop_long", "kill_pubsub", "kill_conns", "pause_write",
               "pause_all", "restart")

#: One round of the schedule: every kind once, and two more long stops (the fault that finds
#: frozen holders and heirs needs a thread of the stopped worker holding or in line).
ROUND = (*FAULT_KINDS, "stop_long", "stop_long")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class WorkerProc:
    wid: str
    proc: subprocess.Popen[bytes]
    process_id: str = ""
    stopped_at: float | None = None
    resume_at: float = 0.0
    stop_kind: str = ""


@dataclass
class FaultRun:
    seed: int
    seconds: float
    workers: int = 3
    threads: int = 3
    loops: int = 1                       # event loops (threads) per worker, for async kinds
    tasks: int = 3                       # asyncio tasks per event loop
    lease: float = 2.0
    gap: tuple[float, float] = (0.4, 1.0)
    kinds: tuple[str, ...] = ROUND
    broken: str = ""                     # RLOCK_FAULTS_BREAK for the workers
    lock_kinds: tuple[str, ...] = KINDS  # what the workers' threads take
    directory: str | None = None
    warmup: float = 1.0
    log: Any = None                      # a callable for progress lines, or None
    procs: list[WorkerProc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dir = self.directory or tempfile.mkdtemp(prefix=f"rlock-faults-{self.seed}-")
        os.makedirs(self.dir, exist_ok=True)
        self.rng = random.Random(self.seed)
        self.n_started = 0
        self._faults = open(os.path.join(self.dir, "faults.jsonl"), "a", buffering=1)  # noqa: SIM115

    # -- logging --------------------------------------------------------------------------
    def fault(self, kind: str, at: float, until: float | None = None, **kw: Any) -> None:
        rec = {"kind": kind, "at": at, "until": at if until is None else until, **kw}
        self._faults.write(json.dumps(rec) + "\n")
        if self.log:
            self.log(f"{at - self.t0:7.2f}s {kind} {kw or ''}")

    # -- workers --------------------------------------------------------------------------
    def start_worker(self) -> WorkerProc:
        wid = f"w{self.n_started}"
        self.n_started += 1
        env = {**os.environ, "RLOCK_FAULTS_BREAK": self.broken, "PYTHONPATH": ROOT}
        err = open(os.path.join(self.dir, f"{wid}.stderr"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.worker", "--lock", self.lock_server.socket,
             "--store", self.store_server.socket, "--out", os.path.join(self.dir, f"{wid}.jsonl"),
             "--seed", str(self.seed), "--wid", wid, "--threads", str(self.threads),
             "--loops", str(self.loops), "--tasks", str(self.tasks),
             "--lease", str(self.lease), "--kinds", ",".join(self.lock_kinds)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err)
        err.close()
        w = WorkerProc(wid, proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline().decode().split() if ready else []
        if len(line) != 3 or line[0] != "ready":
            proc.kill()
            raise RuntimeError(f"worker {wid} did not start: {line}")
        w.process_id = line[2]
        self.fault("start", time.monotonic(), wid=wid, pid=proc.pid)
        self.procs.append(w)
        return w

    def running(self) -> list[WorkerProc]:
        return [w for w in self.procs if w.proc.poll() is None]

    # -- faults ---------------------------------------------------------------------------
    def resume_due(self, now: float, everyone: bool = False) -> None:
        for w in self.procs:
            if w.stopped_at is not None and (everyone or now >= w.resume_at):
                if w.proc.poll() is None:
                    os.kill(w.proc.pid, signal.SIGCONT)
                self.fault(w.stop_kind, w.stopped_at, time.monotonic(), wid=w.wid, pid=w.proc.pid)
                w.stopped_at = None

    def kill_clients(self, kind: str, prefixes: tuple[str, ...]) -> None:
        at = time.monotonic()
        n = 0
        try:
            for c in self.admin.client_list():
                if c.get("name", "").startswith(prefixes):
                    try:
                        self.admin.client_kill_filter(_id=c["id"])
                        n += 1
                    except redis.RedisError:
                        pass
        except redis.RedisError as exc:
            self.fault(kind + "_failed", at, time.monotonic(), err=type(exc).__name__)
            return
        self.fault(kind, at, time.monotonic(), n=n)

    def inject(self, kind: str) -> None:
        now = time.monotonic()
        free = [w for w in self.running() if w.stopped_at is None]
        if kind == "kill":
            if not free:
                return
            w = self.rng.choice(free)
            w.proc.kill()
            w.proc.wait()
            self.fault("kill", time.monotonic(), wid=w.wid, pid=w.proc.pid)
            self.start_worker()
        elif kind in ("stop_short", "stop_long"):
            if not free:
                return
            w = self.rng.choice(free)
            span = (0.1, 0.35) if kind == "stop_short" else (1.3, 2.0)
            w.stop_kind = kind
            w.stopped_at = time.monotonic()
            w.resume_at = w.stopped_at + self.rng.uniform(*span) * self.lease
            os.kill(w.proc.pid, signal.SIGSTOP)
        elif kind == "kill_pubsub":
            self.kill_clients(kind, ("rlock-pubsub:", "rlock-wake:"))
        elif kind == "kill_conns":
            self.kill_clients(kind, ("rlock-fault:",))
        elif kind in ("pause_write", "pause_all"):
            ms = int(self.rng.uniform(0.2, 1.2) * self.lease * 1000)
            try:
                self.admin.client_pause(ms, all=kind == "pause_all")
            except redis.RedisError as exc:
                self.fault(kind + "_failed", now, time.monotonic(), err=type(exc).__name__)
                return
            # It began when the server ran it, between the call and its reply: the reply may
            # come much later than the call, when an earlier ``pause_all`` held it up.
            answered = time.monotonic()
            self.fault(kind, now, answered + ms / 1000, answered=answered)
        elif kind == "restart":
            self.admin.close()
            self.lock_server.stop()
            down = time.monotonic()  # the old server has exited: no reply from it after this
            self.lock_server.start()
            self.fault("restart", now, time.monotonic(), down=down)
        else:
            raise ValueError(kind)

    def schedule(self) -> list[str]:
        rounds = -(-int(self.seconds / self.gap[0] + 1) // len(self.kinds))
        out: list[str] = []
        for _ in range(rounds):
            r = list(self.kinds)
            self.rng.shuffle(r)
            out += r
        return out

    # -- the run --------------------------------------------------------------------------
    def run(self) -> str:
        """Run, save the store, return the run directory."""
        for sub in ("lock", "store"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.lock_server = RedisServer(os.path.join(self.dir, "lock")).start()
        self.store_server = RedisServer(os.path.join(self.dir, "store")).start()
        self.admin = self.lock_server.client(socket_timeout=10)
        self.t0 = time.monotonic()
        try:
            for _ in range(self.workers):
                self.start_worker()
            self.t0 = time.monotonic()
            self.fault("run", self.t0, self.t0 + self.seconds, seed=self.seed, lease=self.lease,
                       workers=self.workers, threads=self.threads, loops=self.loops, tasks=self.tasks,
                       lock_kinds=list(self.lock_kinds), broken=self.broken)
            end = self.t0 + self.seconds
            plan = self.schedule()
            next_at = self.t0 + self.warmup
            while True:
                now = time.monotonic()
                self.resume_due(now)
                if now >= end:
                    break
                if now >= next_at and plan and now < end - self.lease:
                    self.inject(plan.pop(0))
                    next_at = time.monotonic() + self.rng.uniform(*self.gap)
                time.sleep(0.01)
            self.resume_due(time.monotonic(), everyone=True)
            self.finish()
        finally:
            for w in self.procs:
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
            self._faults.close()
            self.lock_server.stop()
            self.store_server.stop()
        return self.dir

    def finish(self) -> None:
        # A pause still on would hold every worker's last round trip: let it end first.
        try:
            self.admin.client_unpause()
        except redis.RedisError:
            pass
        for w in self.running():
            w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for w in self.procs:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
                self.fault("kill", time.monotonic(), wid=w.wid, pid=w.proc.pid, at_end=True)
        self.fault("end", time.monotonic())
        store = self.store_server.client(decode_responses=True)
        dump: dict[str, Any] = {}
        for key in store.keys("*"):
            kind = store.type(key)
            dump[key] = store.lrange(key, 0, -1) if kind == "list" else store.get(key)
        with open(os.path.join(self.dir, "store.json"), "w") as f:
            json.dump(dump, f)
        store.close()


def cleanup(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
