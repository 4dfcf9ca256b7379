"""One worker process of the fault test: ``python -m tests.faults.worker ARGS``.

A few threads loop until SIGTERM: each picks a lock kind and a lock by its seeded RNG, tries
to take it (a random budget), and in the critical section does what a careful user does:

- exclusive kinds (``rlock``, ``fenced``, ``write``, ``fair``: a ``FairLock``): a
  read-modify-write of the lock's counter in the *store* (GET, sleep a few ms, SET read+1;
  the SET also appends ``<sid> <read>`` to the lock's write log, in one MULTI), skipped if
  ``is_lost()`` is true just before it;
- ``fenced``: also a fenced write of its token to the store (a script that accepts a token
  only above the largest seen, and logs every attempt);
- ``read`` and ``sem`` (a ``PermitExpirableSemaphore`` of ``SEM_PERMITS``, renewed by the
  watchdog): only hold for a few ms.

``--loops`` more threads each run an event loop with ``--tasks`` asyncio tasks that do the
same with the async kinds (``aio``: ``AsyncRLock``, ``afair``: ``AsyncFairLock``), when
``--kinds`` names any (``tests.faults.aioworker``).

The store is a second redis-server that no fault touches: the shared resource the locks
protect, as a database would be. The lock server is the one the controller kills, pauses and
restarts.

Every section appends two JSON lines to the history file, each flushed: ``E`` (entered:
monotonic ``t_try`` and ``enter``, the token) right after the acquire returned, and ``X``
(``exit`` before the release, ``lost_before`` the write, ``lost_at_exit``, the release's
outcome). A SIGKILLed worker leaves at most its open sections as ``E`` lines alone.
CLOCK_MONOTONIC is system-wide on Linux, so the times compare across processes.

``RLOCK_FAULTS_BREAK`` swaps in a deliberately broken lock, to show the checker fails it:
``naive`` (the ``rlock``, ``fair``, ``aio`` and ``afair`` kinds become SET NX PX + DEL, no
owner check, no renewal, never lost) or ``ignore-lost`` (every kind reports ``is_lost()``
false and writes anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from typing import Any

import redis

from django_rlock.engine import (
    FairLock,
    FencedLock,
    PermitExpirableSemaphore,
    ReadWriteLock,
    RLock,
    identity,
)
from django_rlock.engine.watchdog import watchdog

#: What threads take (``SYNC_KINDS``) and what asyncio tasks take (``ASYNC_KINDS``: an
#: ``AsyncRLock``, an ``AsyncFairLock``), each task on an event loop of its own thread.
SYNC_KINDS = ("rlock", "fenced", "read", "write", "sem", "fair")
ASYNC_KINDS = ("aio", "afair")
KINDS = SYNC_KINDS + ASYNC_KINDS
#: The kinds whose section is a read-modify-write of the store (the others only hold).
EXCLUSIVE = ("rlock", "fenced", "write", "fair", "aio", "afair")
#: Locks per kind (contention: few of them). ``aio``'s last one is ``rlock:0``, and
#: ``afair`` takes ``fair``'s: threads and tasks in one line.
NAMES = {"rlock": 2, "fenced": 2, "rw": 1, "sem": 1, "fair": 2, "aio": 3, "afair": 2}
SEM_PERMITS = 2
BUDGETS = (0.0, 0.05, 0.3, 1.0, 2.5, 6.0)

#: The store's fenced write: accepted only above the largest token seen; every attempt logged
#: as "<sid> <token> <max before> <accepted>".
FENCE_LUA = """
local max = tonumber(redis.call('get', KEYS[1]) or '0')
local tok = tonumber(ARGV[1])
local ok = 0
if tok > max then redis.call('set', KEYS[1], tok); ok = 1 end
redis.call('rpush', KEYS[2], ARGV[2] .. ' ' .. tok .. ' ' .. max .. ' ' .. ok)
return {ok, max}
"""

BREAK = os.environ.get("RLOCK_FAULTS_BREAK", "")


def where(exc: BaseException) -> str:
    """Where an error came from: its innermost frames, for reading a run's histories."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    return " < ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames))


def lock_name(kind: str, i: int) -> str:
    """The lock a section is on (read and write share their ``rw`` lock; ``aio``'s last lock
    is ``rlock:0``: AsyncRLocks and RLocks on one name; ``afair`` shares ``fair``'s)."""
    if kind == "aio" and i == NAMES["aio"] - 1:
        return "rlock:0"
    base = {"read": "rw", "write": "rw", "afair": "fair"}.get(kind, kind)
    return f"{base}:{i}"


def pick(rng: random.Random, kinds: tuple[str, ...]) -> tuple[str, int, float]:
    """A section's kind, lock number and wait budget (threads and tasks alike)."""
    kind = rng.choice(kinds)
    i = rng.randrange(NAMES["rw" if kind in ("read", "write") else kind])
    return kind, i, rng.choice(BUDGETS)


class NaiveLock:
    """The deliberately broken lock (``RLOCK_FAULTS_BREAK=naive``): SET NX PX with a fixed
    lease, unlock a plain DEL, no watchdog, never told it lost anything."""

    def __init__(self, client: redis.Redis, name: str, lease: float) -> None:
        self.client, self.key, self.lease_ms = client, "naive:" + name, int(lease * 1000)
        self.mine = ""

    def try_lock(self, wait_time: float = 0.0) -> bool:
        deadline = time.monotonic() + wait_time
        self.mine = f"{os.getpid()}:{threading.get_ident()}:{time.monotonic()}"
        while True:
            if self.client.set(self.key, self.mine, nx=True, px=self.lease_ms):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    def unlock(self) -> None:
        self.client.delete(self.key)

    def is_lost(self) -> bool:
        return False

    def is_held_by_current_thread(self) -> bool:  # (what the checker asks; unlock never does)
        return self.client.get(self.key) == self.mine.encode()


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.wid = args.wid
        # Normal connections carry the worker's name, so the controller can kill them;
        # the engine names its pub/sub and wake-line connections after identity.process_id().
        self.client = redis.Redis(unix_socket_path=args.lock, client_name=f"rlock-fault:{self.wid}")
        self.store = redis.Redis(unix_socket_path=args.store)
        self.fence = self.store.register_script(FENCE_LUA)
        self.out = open(args.out, "a", buffering=1)  # noqa: SIM115 - closed in run()
        self.out_mu = threading.Lock()
        self.stop = threading.Event()
        self.locks: dict[tuple[int, str, int], Any] = {}
        kinds = args.kinds.split(",")
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise SystemExit(f"unknown lock kinds {sorted(unknown)}; known: {KINDS}")
        self.kinds = tuple(k for k in kinds if k in SYNC_KINDS)
        self.async_kinds = tuple(k for k in kinds if k in ASYNC_KINDS)

    def write(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self.out_mu:
            self.out.write(line)
            self.out.flush()

    # -- the lock objects (one per thread, kind and name: owners are threads anyway) -------
    def lock_for(self, ti: int, kind: str, i: int) -> Any:
        k = (ti, kind, i)
        if k not in self.locks:
            name, wt = lock_name(kind, i), self.args.lease
            if kind in ("rlock", "fair") and BREAK == "naive":
                self.locks[k] = NaiveLock(self.client, name, wt)
            elif kind == "rlock":
                self.locks[k] = RLock(self.client, name, watchdog_timeout=wt)
            elif kind == "fair":
                self.locks[k] = FairLock(self.client, name, watchdog_timeout=wt)
            elif kind == "fenced":
                self.locks[k] = FencedLock(self.client, name, watchdog_timeout=wt)
            elif kind == "read":
                self.locks[k] = ReadWriteLock(self.client, name, watchdog_timeout=wt).read_lock()
            elif kind == "write":
                self.locks[k] = ReadWriteLock(self.client, name, watchdog_timeout=wt).write_lock()
            else:
                self.locks[k] = PermitExpirableSemaphore(self.client, name, watchdog_timeout=wt)
        return self.locks[k]

    @staticmethod
    def lost(kind: str, lock: Any, permit: str | None) -> bool:
        if BREAK == "ignore-lost":
            return False
        if kind == "sem":
            return watchdog().is_lost(lock._hold_key(permit))
        return bool(lock.is_lost())

    def held(self, kind: str, lock: Any, permit: str | None) -> bool | None:
        """Whether the lock server has this owner's field (permit); None if it could not say."""
        try:
            if kind == "sem":
                return self.client.zscore(lock.timeout_key, bytes.fromhex(permit)) is not None
            return bool(lock.is_held_by_current_thread())
        except Exception:
            return None

    # -- one section ----------------------------------------------------------------------
    def section(self, ti: int, seq: int, rng: random.Random) -> None:
        kind, i, budget = pick(rng, self.kinds)
        name = lock_name(kind, i)
        lock = self.lock_for(ti, kind, i)
        sid = f"{self.wid}.{ti}.{seq}"
        t_try = time.monotonic()
        token = permit = None
        try:
            if kind == "fenced":
                token = lock.try_lock_and_get_token(wait_time=budget)
                got = token is not None
            elif kind == "sem":
                lock.try_set_permits(SEM_PERMITS)  # a restarted server has no count
                permit = lock.try_acquire(wait_time=budget)
                got = permit is not None
            else:
                got = lock.try_lock(wait_time=budget)
        except Exception as exc:
            self.write({"t": "A", "sid": sid, "kind": kind, "lock": name, "t_try": t_try,
                        "budget": budget, "at": time.monotonic(), "err": type(exc).__name__,
                        "where": where(exc)})
            time.sleep(0.02)
            return
        if not got:
            rec = {"t": "F", "sid": sid, "kind": kind, "lock": name, "t_try": t_try,
                   "budget": budget, "at": time.monotonic()}
            if kind != "sem":
                # Told it did not get the lock: its field must not be there (a waiter whose
                # withdrawal failed, or a grant nobody took, would leave a phantom hold).
                rec["held"] = self.held(kind, lock, None)
                if rec["held"]:
                    try:  # give it back, so the run goes on (Redis is the authority)
                        lock.unlock()
                        rec["cleanup"] = True
                    except Exception as exc:
                        rec["cleanup"] = type(exc).__name__
            self.write(rec)
            return
        enter = time.monotonic()
        self.write({"t": "E", "sid": sid, "pid": os.getpid(), "wid": self.wid, "thread": ti,
                    "kind": kind, "lock": name, "t_try": t_try, "budget": budget, "enter": enter,
                    "token": token})
        rec: dict[str, Any] = {"t": "X", "sid": sid}
        try:
            if kind in EXCLUSIVE:
                key = "c:" + name
                value = int(self.store.get(key) or 0)
                time.sleep(rng.uniform(0.001, 0.01))
                rec["lost_before"] = lost = self.lost(kind, lock, permit)
                if not lost:
                    with self.store.pipeline(transaction=True) as p:
                        p.set(key, value + 1)
                        p.rpush("log:" + name, f"{sid} {value}")
                        p.execute()
                    rec["wrote"] = value
                    rec["t_write"] = time.monotonic()
                    if kind == "fenced":
                        ok, top = self.fence(keys=("fmax:" + name, "flog:" + name), args=(token, sid))
                        rec["fenced"] = [int(ok), int(top)]
            else:
                time.sleep(rng.uniform(0.001, 0.01))
                rec["lost_before"] = self.lost(kind, lock, permit)
            if rng.random() < 0.1:
                time.sleep(rng.uniform(0.05, 0.3))  # now and then a longer hold
        except Exception as exc:
            rec["err"] = type(exc).__name__
        # What the server says (then what the holder believes): held False and lost False
        # means the holder believes in a hold that is not there.
        rec["held"] = self.held(kind, lock, permit)
        rec["lost_at_exit"] = self.lost(kind, lock, permit)
        rec["exit"] = time.monotonic()
        # Written before the release, which may block (a paused server, a connection being
        # made again): a worker killed meanwhile has still said what it did and was told.
        self.write(rec)
        done: dict[str, Any] = {"t": "R", "sid": sid}
        try:
            if kind == "sem":
                done["released"] = lock.try_release(permit)
            else:
                lock.unlock()
                done["released"] = True
        except Exception as exc:
            done["released"], done["where"] = type(exc).__name__, where(exc)
        self.write(done)

    def loop(self, ti: int) -> None:
        rng = random.Random(f"{self.args.seed}:{self.wid}:{ti}")
        seq = 0
        while not self.stop.is_set():
            seq += 1
            try:
                self.section(ti, seq, rng)
            except Exception as exc:  # never let a thread die: the run would quietly shrink
                self.write({"t": "B", "sid": f"{self.wid}.{ti}.{seq}", "err": repr(exc)})
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 0.005))

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        threads = [threading.Thread(target=self.loop, args=(ti,), name=f"fault-{ti}")
                   for ti in range(self.args.threads if self.kinds else 0)]
        if self.async_kinds:
            from tests.faults.aioworker import loop_thread  # (it imports this module)
            threads += [threading.Thread(target=loop_thread, args=(self, li), name=f"fault-aio-{li}")
                        for li in range(self.args.loops)]
        for t in threads:
            t.start()
        print(f"ready {os.getpid()} {identity.process_id()}", flush=True)
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.1)
        self.out.close()
        print("done", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", required=True, help="the lock server's unix socket")
    ap.add_argument("--store", required=True, help="the store server's unix socket")
    ap.add_argument("--out", required=True, help="history file (JSON lines, appended)")
    ap.add_argument("--seed", required=True)
    ap.add_argument("--wid", required=True, help="worker id (unique per run)")
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--loops", type=int, default=1, help="threads running an event loop each")
    ap.add_argument("--tasks", type=int, default=3, help="asyncio tasks per event loop")
    ap.add_argument("--kinds", default=",".join(KINDS), help="the lock kinds the threads use")
    ap.add_argument("--lease", type=float, default=2.0, help="watchdog_timeout (seconds)")
    Worker(ap.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
