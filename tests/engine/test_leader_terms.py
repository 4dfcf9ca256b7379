"""A leadership's end outside ``stop()``: a term given up by its user (``abandon``) and an
``AsyncLeader`` whose ``asyncio.run`` returns without ``stop()`` (a normal exit), on a real
Redis, the exit with real processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from django_rlock import AsyncLeader, Leader

ROOT = Path(__file__).parents[2]

# Campaigns (lease 10 s), prints "elected", and when told (a line on stdin) returns without
# stop(): asyncio.run's end cancels the campaign's task; a sync Leader is left to atexit.
CHILD = """
import asyncio, sys, time
import redis, redis.asyncio
from django_rlock import AsyncLeader, Leader
sock, group, mode = sys.argv[1:4]
def revoked(reason):
    print("revoked", reason, flush=True)
async def main():
    leader = AsyncLeader(redis.asyncio.Redis(unix_socket_path=sock), group,
                         watchdog_timeout=10, on_revoked=revoked)
    await leader.start()
    assert await leader.wait_elected(10)
    print("elected", leader.term, flush=True)
    loop = asyncio.get_running_loop()
    told = loop.create_future()
    def tell():
        loop.remove_reader(sys.stdin.fileno())
        told.set_result(None)
    loop.add_reader(sys.stdin.fileno(), tell)
    await told  # (no executor: its shutdown would give the loop time it does not have)
if mode == "async":
    asyncio.run(main())
else:
    leader = Leader(redis.Redis(unix_socket_path=sock), group, watchdog_timeout=10,
                    on_revoked=revoked).start()
    assert leader.wait_elected(10)
    print("elected", leader.term, flush=True)
    sys.stdin.readline()
print("exiting", flush=True)
"""


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_normal_exit_without_stop_hands_over_at_once(redis_server: Any, r: redis.Redis,
                                                      mode: str) -> None:
    """The leader's process returns without ``stop()``; a standby of another process (lease
    10 s) is elected within a second or so of the exit (3 s allowed on a loaded machine; a
    lease left to expire is 6.7-10 s), the old leader was told ``"stopped"``, and
    nothing warns of a lock left held by a task."""
    group = f"exit-{mode}"
    child = subprocess.Popen([sys.executable, "-c", CHILD, redis_server.socket, group, mode],
                             cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    standby = Leader(r, group, watchdog_timeout=10)
    try:
        assert child.stdout is not None and child.stdin is not None
        first = child.stdout.readline().split()
        assert first[0] == "elected", (first, child.stderr.read() if child.stderr else "")
        standby.start()
        assert not standby.wait_elected(0.3)
        child.stdin.write("\n")
        child.stdin.flush()
        t0 = time.monotonic()
        elected = standby.wait_elected(8)
        took = time.monotonic() - t0
        out, err = child.communicate(timeout=30)
        assert elected and took < 3.0, (took, out, err)  # (the lease: 10 s)
        assert standby.term is not None and standby.term > int(first[1])
        assert "revoked stopped" in out, (out, err)
        assert "finished without unlocking" not in err, err
        assert child.returncode == 0, err
    finally:
        standby.stop()
        if child.poll() is None:
            child.kill()
            child.wait()


def test_abandon_gives_a_refused_term_up_and_campaigns_again(redis_server: Any,
                                                             r: redis.Redis) -> None:
    """The token key alone deleted (the hash still renewed): the user whose fenced write was
    refused calls ``abandon(term)``; ``is_leader()`` is false at once, ``on_revoked("lost")``,
    and a new term is won with a token key again. A term that is not current is left alone."""
    seen: list[tuple[str, Any]] = []
    leader = Leader(r, "abandon", watchdog_timeout=3,
                    on_elected=lambda t: seen.append(("elected", t)),
                    on_revoked=lambda why: seen.append(("revoked", why)))
    with leader:
        assert leader.wait_elected(5)
        term = leader.term
        assert term is not None and not leader.abandon(term + 1)
        assert r.delete(leader.token_key) == 1
        assert leader.abandon(term)
        assert not leader.is_leader() and leader.term is None
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert leader.wait_elected(5)
        assert not leader.abandon(term)
        assert seen[:2] == [("elected", term), ("revoked", "lost")], seen
        assert leader.term == seen[2][1] != term
        assert int(r.get(leader.token_key)) == leader.term

    async def main() -> list[Any]:
        client = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        got: list[Any] = []
        a = AsyncLeader(client, "abandon-aio", watchdog_timeout=3, on_revoked=got.append)
        async with a:
            assert await a.wait_elected(5)
            old = a.term
            assert old is not None and a.abandon(old) and a.term is None
            for _ in range(500):
                if got and a.is_leader():
                    break
                await asyncio.sleep(0.01)
            got.append(a.term is not None and a.term != old)
        await client.aclose()
        return got

    assert asyncio.run(main()) == ["lost", True, "stopped"]
