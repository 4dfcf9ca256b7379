"""The cross-process hand-off: a waiter's failed attempt puts it in line in Redis, and the
final release grants the lock to the first live waiter in line, whichever process it is in.

Waiters in other processes are real processes (``_handoff_proc``), killed with SIGKILL where
the test is about a waiter that dies.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from redis.crc import key_slot

from django_rlock import AsyncRLock, RLock
from django_rlock.engine import pubsub
from django_rlock.engine.listing import Locks
from django_rlock.engine.naming import grant_channel, handoff_queue, handoff_waiters, lock_channel
from django_rlock.engine.scripts import RELEASE_SCRIPT, call_once
from tests.conftest import script_calls

ROOT = Path(__file__).resolve().parents[2]

# Redisson's own acquire and release (RedissonLock.tryLockInnerAsync / unlockInnerAsync), as
# a Java or Node client sends them: what a foreign waiter on our locks runs.
REDISSON_ACQUIRE = """
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
"""
REDISSON_RELEASE = """
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then
  return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if (counter > 0) then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
"""


class Proc:
    def __init__(self, *args: str, grant_lease: float | None = None) -> None:
        env = dict(os.environ)
        if grant_lease is not None:
            env["RLOCK_TEST_GRANT_LEASE"] = str(grant_lease)
        self.p = subprocess.Popen([sys.executable, "-m", "tests.engine._handoff_proc", *args],
                                  cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        assert self.p.stdout is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready, _, _ = select.select([self.p.stdout], [], [], max(0.0, end - time.monotonic()))
            if ready:
                line = self.p.stdout.readline()
                if not line:
                    break
                if line.startswith(prefix):
                    return line.strip()
        raise AssertionError(f"no {prefix!r} from the process within {timeout:g} s")

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def kill(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(10)

    def close(self) -> None:
        self.kill()
        for f in (self.p.stdin, self.p.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def procs():
    made: list[Proc] = []

    def make(*args: str, grant_lease: float | None = None) -> Proc:
        p = Proc(*args, grant_lease=grant_lease)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def until(cond, timeout: float = 10.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"{what} not met within {timeout:g} s"
        time.sleep(0.01)


def held_with_a_waiter_in_line(r, redis_server, holders, procs, name: str, *args: str):
    """A thread of ours holds ``name``; a waiter process is in line for it. (lock, holder, it)"""
    lock = RLock(r, name)
    holder = holders()
    holder.call(lock.lock)
    waiter = procs("wait_hold", redis_server.socket, name, *args)
    waiter.expect("waiting")
    until(lambda: in_line(r, name) == 1, what="the waiter in line")
    return lock, holder, waiter


def in_line(r: redis.Redis, name: str) -> int:
    """Waiters with an entry (tokens are "<owner>#<n>"; "=<owner>" and "!turn" are records)."""
    return sum(1 for f in r.hkeys(handoff_waiters(name)) if b"#" in f and not f.startswith(b"="))


def test_every_name_of_the_hand_off_is_in_the_locks_slot_and_never_shared():
    for key in ("plain", "a{tag}b", "{whole}", "çà:é"):
        slot = key_slot(key.encode())
        for name in (handoff_queue(key), handoff_waiters(key), grant_channel(key)):
            assert key_slot(name.encode()) == slot, (key, name)
    # K and {K} share Redisson's channel (and so the grant channel), never a line.
    assert handoff_queue("k") != handoff_queue("{k}")
    assert handoff_waiters("k") != handoff_waiters("{k}")


def test_a_waiter_in_another_process_is_granted_the_lock_without_a_command(r, redis_server,
                                                                           holders, procs):
    lock, holder, waiter = held_with_a_waiter_in_line(r, redis_server, holders, procs, "xg")
    # The line is the lock's, not a lock: a listing that walks every key skips it.
    assert r.exists(handoff_queue("xg"), handoff_waiters("xg")) == 2
    assert Locks(r, "").names(scan=True) == ["xg"]
    time.sleep(0.3)  # its subscription is confirmed (it parks on it)
    r.config_resetstat()
    holder.call(lock.unlock)
    waiter.expect("locked")
    assert script_calls(r) == 1  # the release; the heir sent nothing to take the lock
    (field,) = r.hkeys("xg")
    assert not field.decode().startswith(holder.call(lambda: lock._field()).split(":")[0])
    assert r.pttl("xg") <= pubsub.GRANT_LEASE * 1000  # granted with the short lease
    # Its watchdog renews it early: by twice the grant lease it has its own lease again.
    time.sleep(pubsub.GRANT_LEASE * 0.9)
    assert r.pttl("xg") > pubsub.GRANT_LEASE * 1000
    assert r.hkeys("xg") == [field]
    waiter.send("unlock")
    waiter.expect("unlocked")
    assert not r.exists("xg")


def test_a_lease_mode_heir_has_its_whole_lease_when_it_returns(r, redis_server, holders, procs):
    lock, holder, waiter = held_with_a_waiter_in_line(r, redis_server, holders, procs, "xl", "10")
    time.sleep(0.3)
    holder.call(lock.unlock)
    waiter.expect("locked")
    assert 8_000 < r.pttl("xl") <= 10_000


def test_a_grant_leaves_nothing_in_redis_without_an_expiry(r, redis_server, holders, procs):
    """The heir's grant record ("=<owner>") is what is left of the line once the heir was
    its last waiter. It lives with the line's expiry: a heir that never releases (a lease
    that runs out, a crash) once left the record in a hash without one, forever, per name."""
    lock, holder, waiter = held_with_a_waiter_in_line(r, redis_server, holders, procs, "xe", "5")
    time.sleep(0.3)
    holder.call(lock.unlock)
    waiter.expect("locked")
    left = r.hkeys(handoff_waiters("xe"))
    assert len(left) == 1 and left[0].startswith(b"=")  # the heir's grant record
    assert r.pttl(handoff_waiters("xe")) > 0
    waiter.kill()  # its hold is left to expire: nobody deletes the record
    for key in r.keys("*xe*"):
        assert r.pttl(key) > 0, key


def test_a_sigkilled_waiter_in_line_costs_at_most_the_grant_lease(r, redis_server, holders, procs):
    """The dead waiter is first in line: the release grants it the lock, which then expires
    unannounced after the short grant lease, and the next waiter, told of the grant, checks
    just after. Without the grant lease it would be the holder's 30 s TTL."""
    lock, holder, dead = held_with_a_waiter_in_line(r, redis_server, holders, procs, "xd")
    time.sleep(0.3)
    dead.kill()
    nxt = holders().submit(lambda: (RLock(r, "xd").try_lock(wait_time=20), time.monotonic()))
    until(lambda: in_line(r, "xd") == 2, what="the second waiter in line")
    time.sleep(0.3)
    t0 = time.monotonic()
    holder.call(lock.unlock)
    ok, when = nxt(30)
    assert ok
    assert pubsub.GRANT_LEASE * 0.8 < when - t0 < pubsub.GRANT_WATCH + 4.0, when - t0


def test_a_waiter_that_gives_up_takes_its_place_in_line_back(r, holders):
    lock = RLock(r, "xw")
    holder = holders()
    holder.call(lock.lock)
    assert holders().call(lambda: RLock(r, "xw").try_lock(wait_time=0.5)) is False
    assert in_line(r, "xw") == 0
    holder.call(lock.unlock)
    assert not r.exists("xw")  # freed: not granted to a waiter that left


def test_a_grant_that_raced_with_giving_up_is_given_back_at_once(r, holders):
    """The waiter's budget ran out as the release granted it the lock: its withdrawal is then
    its own release, and the lock goes to the next in line at once, not after the lease."""
    lock = RLock(r, "xr")
    holder, quitter = holders(), holders()
    holder.call(lock.lock)
    quitting = RLock(r, "xr")

    def register() -> tuple[str, str]:
        field = quitting._field()
        k = (quitting._server, quitting.key, field)
        token = quitting._new_token(field)
        assert quitting._attempt(k, None, time.monotonic(), reg=(token, None)) > 0
        return field, token

    field, token = quitter.call(register)  # in line, and never listening: it is giving up
    nxt = holders().submit(lambda: (RLock(r, "xr").try_lock(wait_time=20), time.monotonic()))
    until(lambda: in_line(r, "xr") == 2, what="the second waiter in line")
    time.sleep(0.3)
    holder.call(lock.unlock)
    until(lambda: r.hkeys("xr") == [field.encode()], what="the grant to the quitter")
    t0 = time.monotonic()
    reply = call_once(r, RELEASE_SCRIPT, quitting._release_keys,
                      quitting._withdraw_args(field, token))
    assert reply is not None  # it held the lock, and released it
    quitting._withdrawn(reply)
    ok, when = nxt(10)
    assert ok and when - t0 < 1.0


def test_a_foreign_waiter_is_never_bypassed_and_wakes_ours(r, holders):
    """A Redisson client waits with a plain SUBSCRIBE on the lock's channel: a release that
    sees it frees the lock with "0" (never grants it past it), and it can take the lock. Its
    own release's "0" wakes our waiters at once."""
    lock = RLock(r, "xf")
    holder = holders()
    holder.call(lock.lock)
    ours = holders().submit(lambda: RLock(r, "xf").try_lock(wait_time=20))
    until(lambda: in_line(r, "xf") == 1, what="our waiter in line")
    foreign = r.pubsub()
    foreign.subscribe(lock_channel("xf"))
    assert foreign.get_message(timeout=2)["type"] == "subscribe"
    holder.call(lock.unlock)
    msg = foreign.get_message(timeout=5)
    assert msg is not None and msg["data"] == b"0"  # freed and announced, not granted past it
    assert ours(10) is True  # (ours won the race this time: it was woken by the same "0")
    # The foreign client takes it once free, and its release wakes our next waiter.
    assert RLock(r, "xf").force_unlock()
    a_foreign_release_wakes_our_waiter(
        r, "xf", lambda: holders().submit(lambda: RLock(r, "xf").try_lock(wait_time=20)))
    foreign.close()


def a_foreign_release_wakes_our_waiter(r, name: str, wait) -> None:
    """A Redisson client takes ``name``; ``wait()`` starts a waiter of ours (returns its
    result getter). The client's release (del + "0") wakes it long before its 30 s lease
    would run out."""
    acquire, release = r.register_script(REDISSON_ACQUIRE), r.register_script(REDISSON_RELEASE)
    assert acquire(keys=[name], args=[30_000, "java-uuid:1"]) is None
    got = wait()
    until(lambda: in_line(r, name) == 1, what="our waiter in line")
    time.sleep(0.3)
    t0 = time.monotonic()
    assert release(keys=[name, lock_channel(name)], args=["0", 30_000, "java-uuid:1"]) == 1
    assert got(10) is True
    assert time.monotonic() - t0 < 2.0


def test_cancelled_async_waiters_leave_their_place_in_line(r, redis_server, holders):
    lock = RLock(r, "xa")
    holder = holders()
    holder.call(lock.lock)

    async def main() -> tuple[int, bool, float]:
        ac = aredis.Redis(unix_socket_path=redis_server.socket)
        waits = [asyncio.ensure_future(AsyncRLock(ac, "xa").try_lock(wait_time=20))
                 for _ in range(5)]
        await asyncio.sleep(0.5)
        for w in waits[:4]:
            w.cancel()
        await asyncio.gather(*waits[:4], return_exceptions=True)
        end = time.monotonic() + 5
        while in_line(r, "xa") > 1 and time.monotonic() < end:
            await asyncio.sleep(0.02)
        left = in_line(r, "xa")
        t0 = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, lambda: holder.call(lock.unlock))
        got = await waits[4]
        took = time.monotonic() - t0
        await ac.aclose()
        return left, got, took

    left, got, took = asyncio.run(main())
    assert left == 1
    assert got is True and took < 2.0


def test_stress_with_sigkilled_and_cancelled_waiters_keeps_exclusion(r, redis_server, procs):
    """Three processes (2 threads and 2 asyncio tasks each, a third of the async waits
    cancelled) contend for one lock while waiters in other processes are SIGKILLed in line
    or holding it. Exclusion holds (a racy GET/SET counter), each dead waiter costs about a
    grant lease (scaled down to 0.5 s here), and the lock ends free."""
    r.delete("counter:xs")
    seconds, lease = 10.0, 0.5
    loops = [procs("loop", redis_server.socket, "xs", str(seconds), "2", "2", grant_lease=lease)
             for _ in range(3)]
    end = time.monotonic() + seconds - 2.0
    killed = 0
    while time.monotonic() < end:
        # (One that dies holding the lock costs its watchdog timeout: kept short here.)
        # Every other one waits on a wake line of its own (a grant to it finds nobody there
        # once it is dead), the others on their process's shared subscription.
        victim = procs("wait_hold", redis_server.socket, "xs", "", "1.5",
                       *(("line",) if killed % 2 else ()), grant_lease=lease)
        victim.expect("waiting")
        time.sleep(0.05 + 0.1 * (killed % 3))  # in line, granted, or holding it
        victim.kill()
        killed += 1
        time.sleep(1.0)
    results = [p.expect("done", timeout=seconds + 40.0).split() for p in loops]
    total = sum(int(x[1]) for x in results)
    longest = max(float(x[2]) for x in results)
    assert killed >= 4
    assert total > 100, (total, longest, killed)
    assert int(r.get("counter:xs")) == total  # no overlap lost an update
    # Dead heirs one after another cost a grant lease and a re-check (a housekeeping tick) each.
    assert longest < 15.0, longest
    until(lambda: not r.exists("xs"), timeout=10, what="the lock free at the end")


def test_with_a_foreign_waiter_releases_alternate_between_freeing_and_granting(r, holders):
    """Neither side starves the other: while a Redisson client waits, every other release of
    ours frees the lock with "0" (its turn) and the others grant it to our line."""
    foreign = r.pubsub()
    foreign.subscribe(lock_channel("xt"))
    assert foreign.get_message(timeout=2)["type"] == "subscribe"
    locks = [RLock(r, "xt") for _ in range(4)]
    threads = [holders() for _ in range(4)]
    threads[0].call(locks[0].lock)
    heard = []
    for i in range(3):
        nxt = threads[i + 1].submit(lambda i=i: locks[i + 1].try_lock(wait_time=20))
        until(lambda: in_line(r, "xt") == 1, what="the next waiter in line")
        time.sleep(0.3)
        threads[i].call(locks[i].unlock)
        assert nxt(10) is True  # freed (nobody else takes it) or granted: ours either way
        msg = foreign.get_message(timeout=0.5)
        heard.append(msg is not None and msg["data"] == b"0")
    assert heard == [True, False, True]
    threads[3].call(locks[3].unlock)
    foreign.close()


def _acquire_keys_seen(m, name: str) -> int:
    """How many keys the first EVALSHA on ``name`` that MONITOR ``m`` saw named."""
    while True:
        cmd = m.next_command()["command"].split()
        if cmd[0] == "EVALSHA" and name in cmd[3].strip('"'):
            return int(cmd[2])


def test_first_attempts_register_only_on_locks_this_process_found_held(r, redis_server, holders):
    """An uncontended acquire sends the plain acquire (two keys, no wait token: the hot path);
    once this process has found the lock held, every first attempt on it carries the
    registration (so a contended lock keeps its one-attempt hand-off)."""
    name = f"first-attempt-{os.getpid()}-{time.monotonic_ns()}"  # unseen by this process
    lock = RLock(r, name)

    def first_attempt_keys() -> int:
        with redis_server.client().monitor() as m:
            lock.lock()
            lock.unlock()
            return _acquire_keys_seen(m, name)

    assert first_attempt_keys() == 2  # the lock and the index
    holder = holders()
    holder.call(RLock(r, name).lock)
    assert holders().call(lambda: RLock(r, name).try_lock(wait_time=0.2)) is False
    holder.call(RLock(r, name).unlock)
    assert not r.exists(handoff_waiters(name))  # the waiter withdrew
    assert first_attempt_keys() == 4  # lock, index, queue, waiters


def test_async_first_attempts_register_only_on_locks_this_process_found_held(r, redis_server):
    name = f"afirst-attempt-{os.getpid()}-{time.monotonic_ns()}"

    async def main() -> list[int]:
        ar = aredis.Redis(unix_socket_path=redis_server.socket)
        lock = AsyncRLock(ar, name)
        seen: list[int] = []

        async def first_attempt_keys() -> None:
            with redis_server.client().monitor() as m:
                await lock.lock()
                await lock.unlock()
                seen.append(_acquire_keys_seen(m, name))

        await first_attempt_keys()
        holding, done = asyncio.Event(), asyncio.Event()

        async def holder() -> None:  # another task: another owner
            await AsyncRLock(ar, name).lock()
            holding.set()
            await done.wait()
            await AsyncRLock(ar, name).unlock()

        task = asyncio.create_task(holder())
        await holding.wait()
        assert await AsyncRLock(ar, name).try_lock(wait_time=0.2) is False
        done.set()
        await task
        assert not r.exists(handoff_waiters(name))  # the waiter withdrew
        await first_attempt_keys()
        await ar.aclose()
        return seen

    assert asyncio.run(main()) == [2, 4]  # plain (lock, index); then with the queue keys


def test_a_line_made_again_on_a_foreign_waiters_turn_keeps_the_lines_expiry(r):
    """A release on a Redisson client's turn frees the lock and puts the token it popped back
    at the head of the line; when that token was the whole line, the LPOP deleted the list and
    the LPUSH makes it again: it must get the waiters hash's expiry back, or a line nobody
    pops again (withdrawals only HDEL) would stay forever (found in review)."""
    key = "turned"
    foreign = r.pubsub()
    foreign.subscribe(lock_channel(key))  # a Redisson client: the lock channel only
    assert foreign.get_message(timeout=2)["type"] == "subscribe"
    now_ms = int(r.time()[0] * 1000)
    token = "other-process:7#1"
    r.hset(key, "own-process:1", 1)
    r.pexpire(key, 30_000)
    r.rpush(handoff_queue(key), token)
    r.hset(handoff_waiters(key), token, f"{now_ms + 10_000} 3000 x")
    r.pexpire(handoff_queue(key), 20_000)
    r.pexpire(handoff_waiters(key), 20_000)
    keys = (key, lock_channel(key), "rlock-index:", handoff_queue(key), handoff_waiters(key),
            grant_channel(key))
    reply = call_once(r, RELEASE_SCRIPT, keys, ("own-process:1", 30_000, "0", "", 0, 0, "", "",
                                                "own-process"))
    assert reply == 2  # freed with "0" for the foreign client (its turn), one subscriber heard
    assert r.lrange(handoff_queue(key), 0, -1) == [token.encode()]  # still first in line
    assert 0 < r.pttl(handoff_queue(key)) <= r.pttl(handoff_waiters(key)) + 100  # read apart
    foreign.close()
