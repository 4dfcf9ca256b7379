"""Run as a subprocess by the hand-off tests: `python -m tests.engine._handoff_proc MODE ...`."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time

import redis
import redis.asyncio as aredis

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import identity, pubsub, wakeline
from django_rlock.engine.naming import wake_channel

if os.environ.get("RLOCK_TEST_GRANT_LEASE"):
    # The stress test scales the grant lease down, so it can kill many waiters in a short run.
    pubsub.GRANT_LEASE = float(os.environ["RLOCK_TEST_GRANT_LEASE"])
    pubsub.GRANT_WATCH = pubsub.GRANT_LEASE + 0.1


def wait_hold(sock: str, name: str, lease: str = "", watchdog_timeout: str = "30",
              line: str = "") -> None:
    """Wait for the lock (it registers in line), say when it is held, unlock on "unlock".
    ``line``: wait as a thread that has waited before (its own wake line is open)."""
    client = redis.Redis(unix_socket_path=sock)
    lock = RLock(client, name, watchdog_timeout=float(watchdog_timeout))
    said = "waiting"
    if line:
        assert wakeline.open_line(client, identity.thread_owner()) is not None
        said += " " + wake_channel(identity.thread_owner())
    print(said, flush=True)
    t0 = time.monotonic()
    lock.lock(lease_time=float(lease) if lease else None)
    print(f"locked {time.monotonic() - t0:.3f}", flush=True)
    for line in sys.stdin:
        if line.strip() == "unlock":
            lock.unlock()
            print("unlocked", flush=True)
            return


def await_hold(sock: str, name: str) -> None:
    """An asyncio task of a process that has waited for the lock before (its subscription to
    the lock's channels stands, so its token ends in PROCESS_TOKEN_MARK): wait for the lock,
    say so, unlock on "unlock". Says "waiting <process uuid>" as it gets in line."""

    async def main() -> None:
        client = aredis.Redis(unix_socket_path=sock)
        lock = AsyncRLock(client, name)
        # A first wait that gives up: the process subscribes to the lock's channels (and
        # they linger), and notes the lock as contended.
        assert not await lock.try_lock(wait_time=0.2)
        print(f"waiting {identity.process_id()}", flush=True)  # (in line just after)
        t0 = time.monotonic()
        await lock.lock()
        print(f"locked {time.monotonic() - t0:.3f}", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if line.strip() == "unlock":
            await lock.unlock()
            print("unlocked", flush=True)

    asyncio.run(main())


def loop(sock: str, name: str, seconds: str, threads: str, tasks: str) -> None:
    """Threads and asyncio tasks contending for the lock for ``seconds``; each holds ~1 ms and
    bumps a counter with GET then SET (racy without the lock). Some async waits are cancelled
    on purpose. Prints acquisitions and the longest wait."""
    client = redis.Redis(unix_socket_path=sock)
    end = time.monotonic() + float(seconds)
    done: list[int] = []
    waits: list[float] = []
    mu = threading.Lock()

    def work() -> None:
        lock = RLock(client, name)
        n = 0
        while time.monotonic() < end:
            t0 = time.monotonic()
            if not lock.try_lock(wait_time=20):
                continue
            w = time.monotonic() - t0
            value = int(client.get("counter:" + name) or 0)
            time.sleep(0.001)
            client.set("counter:" + name, value + 1)
            lock.unlock()
            n += 1
            with mu:
                waits.append(w)
        with mu:
            done.append(n)

    async def amain() -> None:
        ac = aredis.Redis(unix_socket_path=sock)

        async def task() -> int:
            lock = AsyncRLock(ac, name)
            n = 0
            while time.monotonic() < end:
                t0 = time.monotonic()
                # A third of the waits are cancelled (in line, or just granted): nothing they
                # were given may stay held. (In this task: a lock belongs to its task.)
                limit = random.uniform(0, 0.02) if random.random() < 0.3 else None
                try:
                    async with asyncio.timeout(limit):
                        got = await lock.try_lock(wait_time=20)
                except TimeoutError:
                    continue
                if not got:
                    continue
                w = time.monotonic() - t0
                value = int(await ac.get("counter:" + name) or 0)
                await asyncio.sleep(0.001)
                await ac.set("counter:" + name, value + 1)
                await lock.unlock()
                n += 1
                with mu:
                    waits.append(w)
            return n

        counts = await asyncio.gather(*(task() for _ in range(int(tasks))))
        with mu:
            done.extend(counts)
        await ac.aclose()

    workers = [threading.Thread(target=work) for _ in range(int(threads))]
    if int(tasks):
        workers.append(threading.Thread(target=lambda: asyncio.run(amain())))
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    print(f"done {sum(done)} {max(waits, default=0.0):.3f}", flush=True)


def try_report(sock: str, name: str, wait: str, line: str = "") -> None:
    """One ``try_lock(wait)``; print what the caller is told and what Redis says, then hold
    until "unlock" if it got the lock. ``line``: a thread that has waited before (wake line)."""
    client = redis.Redis(unix_socket_path=sock)
    lock = RLock(client, name)
    if line:
        assert wakeline.open_line(client, identity.thread_owner()) is not None
    print("waiting " + identity.thread_owner(), flush=True)
    t0 = time.monotonic()
    got = lock.try_lock(wait_time=float(wait))
    print("result " + json.dumps({
        "got": got, "elapsed": time.monotonic() - t0, "lost": lock.is_lost(),
        "held": lock.is_held_by_current_thread(),
        "fields": sorted(f.decode() for f in client.hkeys(name))}), flush=True)
    if got:
        for text in sys.stdin:
            if text.strip() == "unlock":
                lock.unlock()
                print("unlocked", flush=True)
                return


def atry_report(sock: str, name: str, wait: str) -> None:
    """``try_report`` for an asyncio task (an AsyncRLock: grants come through the process's
    shared subscription)."""

    async def main() -> None:
        client = aredis.Redis(unix_socket_path=sock)
        lock = AsyncRLock(client, name)
        print("waiting " + identity.task_owner(), flush=True)
        t0 = time.monotonic()
        got = await lock.try_lock(wait_time=float(wait))
        print("result " + json.dumps({
            "got": got, "elapsed": time.monotonic() - t0, "lost": lock.is_lost(),
            "held": await lock.is_held_by_current_task(),
            "fields": sorted(f.decode() for f in await client.hkeys(name))}), flush=True)
        if got:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            await lock.unlock()
            print("unlocked", flush=True)

    asyncio.run(main())


if __name__ == "__main__":
    {"wait_hold": wait_hold, "loop": loop, "try_report": try_report,
     "atry_report": atry_report, "await_hold": await_hold}[sys.argv[1]](*sys.argv[2:])
