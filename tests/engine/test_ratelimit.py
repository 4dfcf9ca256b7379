"""RateLimiter / AsyncRateLimiter: Redisson's RRateLimiter (OVERALL) layout, on the server clock,
with Redisson's known faults fixed (docs/engine.md, "Rate limiter").

The 8-process load test is tests/load/test_ratelimit_load.py (it runs once, not again on
Redis 6.2 and Valkey).
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from django_rlock.engine import LockError, ratelimit
from django_rlock.engine.aioratelimit import AsyncRateLimiter
from django_rlock.engine.kinds import get as get_kind
from django_rlock.engine.listing import Locks
from django_rlock.engine.naming import index_key, rate_keys
from django_rlock.engine.ratelimit import RateLimited, RateLimiter, RateLimiterError, parse_rate


def calls(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def sent(r: redis.Redis) -> int:
    """Commands other than INFO / CONFIG sent since the last reset, and other than the
    process's one subscription tidying its channels (an earlier test's wait may leave an
    ``UNSUBSCRIBE`` to be sent at any time)."""
    # (Redis 6.2 counts CONFIG RESETSTAT as "config", 7 as "config|resetstat".)
    tidy = {"info", "subscribe", "unsubscribe", "ssubscribe", "sunsubscribe"}
    return sum(n for k, n in calls(r).items() if k not in tidy and not k.startswith("config"))


def grants(r: redis.Redis, key: str) -> list[tuple[str, int, float]]:
    """The grants zset read the way a Redisson client reads it: (id, permits, score)."""
    out = []
    for member, score in r.zrange(rate_keys(key)[2], 0, -1, withscores=True):
        n = member[0]
        out.append((member[1:1 + n].decode(), struct.unpack("<I", member[1 + n:])[0], score))
    return out


# -- Redisson's layout ---------------------------------------------------------------------------
def test_layout_is_redissons(r):
    rl = RateLimiter(r, "api")
    assert rl.try_set_rate(5, 2.0)
    assert not rl.try_set_rate(7, 1.0)  # only if unset
    assert r.hgetall("api") == {b"rate": b"5", b"interval": b"2000", b"type": b"0",
                                b"keepAliveTime": b"0"}
    assert rl.try_acquire(2)
    assert r.get("{api}:value") == b"3"
    (gid, permits, score), = grants(r, "api")
    assert permits == 2 and len(gid) == 16
    now = r.time()
    assert abs(score - (now[0] * 1000 + now[1] // 1000)) < 1000  # the server's ms
    assert rl.get_rate() == (5, 2.0)


def test_a_redisson_clients_grants_count(r):
    """A grant written as a Java client writes it (packed member, value decremented) counts."""
    rl = RateLimiter(r, "api")
    rl.set_rate(3, 5.0)
    now = r.time()
    member = struct.pack("<B8sI", 8, b"javaid01", 2)
    r.zadd("{api}:permits", {member: now[0] * 1000 + now[1] // 1000})
    r.set("{api}:value", 1)
    assert rl.available_permits() == 1
    assert rl.try_acquire()
    assert not rl.try_acquire()
    # And a counter lost (expired, deleted) is recounted from the grants, never reset to full.
    r.delete("{api}:value")
    assert rl.available_permits() == 0
    assert not rl.try_acquire()


def test_braced_names_share_one_slot(r):
    for name in ("api", "user:{42}:api"):
        keys = rate_keys(name)
        assert len({key_slot(k.encode()) for k in keys}) == 1
    assert rate_keys("a{b}c")[1] == "a{b}c:value"
    assert rate_keys("api")[1:3] == ("{api}:value", "{api}:permits")


def test_per_client_limiter_refused(r):
    r.hset("pc", mapping={"rate": 5, "interval": 1000, "type": 1})
    with pytest.raises(RateLimiterError, match="PER_CLIENT.*'pc'"):
        RateLimiter(r, "pc").try_acquire()


# -- semantics -----------------------------------------------------------------------------------
def test_budget_window_and_waits(r):
    rl = RateLimiter(r, "api")
    rl.set_rate(3, 1.0)
    assert [rl.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert rl.available_permits() == 0
    left = rl.time_until_available()
    assert 0.5 < left <= 1.002
    # A wait that cannot be met is refused at once, not after sleeping through it.
    t = time.monotonic()
    assert not rl.try_acquire(wait_time=0.2)
    assert time.monotonic() - t < 0.15
    g = rl.attempt(1, 0.0)
    assert not g.granted and 0.5 < g.retry_after <= 1.002
    # A wait that can: granted after about that long.
    t = time.monotonic()
    assert rl.try_acquire(wait_time=3.0)
    assert left - 0.25 < time.monotonic() - t < left + 1.5
    # The three first grants freed together: two left, the third is the one just taken.
    assert rl.time_until_available(2) == 0
    assert rl.time_until_available(3) > 0.5


def test_a_grant_counts_for_its_whole_interval(r):
    """No interval, closed at both ends, holds more than ``rate`` grants (Redisson frees a
    grant at exactly its score + interval)."""
    rl = RateLimiter(r, "edge")
    rl.set_rate(2, 0.3)
    at = [rl.acquire() for _ in range(8)]
    for i in range(len(at) - 2):
        assert at[i + 2] - at[i] > 0.3
    assert at[-1] - at[0] < 3 * 0.3 + 1.0  # and it kept going at the rate


def test_set_rate_keeps_the_window(r):
    rl = RateLimiter(r, "api")
    rl.set_rate(5, 10.0)
    assert rl.try_acquire(5)
    rl.set_rate(8, 10.0)  # Redisson deletes the grants here: 8 more at once
    assert rl.available_permits() == 3
    rl.set_rate(2, 10.0)  # lowered below what was granted: nothing until they expire
    assert rl.available_permits() == 0
    assert not rl.try_acquire()
    assert rl.get_rate() == (2, 10.0)


def test_equal_grant_ids_are_two_grants(r, monkeypatch):
    monkeypatch.setattr(ratelimit, "grant_id", lambda: "same-id-00000000")
    rl = RateLimiter(r, "api")
    rl.set_rate(5, 10.0)
    assert rl.try_acquire() and rl.try_acquire()
    assert sorted(g[0] for g in grants(r, "api")) == ["same-id-00000000", "same-id-00000000.1"]
    assert rl.available_permits() == 3


def test_no_rate_set_refused_without_writes(r):
    rl = RateLimiter(r, "nothing")
    for call in (rl.try_acquire, rl.available_permits, rl.time_until_available):
        with pytest.raises(RateLimiterError, match="no rate is set.*'nothing'") as e:
            call()
        assert isinstance(e.value, LockError) and e.value.name == "nothing"
    assert r.keys("*") == []


def test_rate_given_on_the_object_is_set_by_the_first_attempt(r):
    rl = RateLimiter(r, "per-user:7", rate="2/m", keep_alive=90)
    r.config_resetstat()
    assert rl.try_acquire()
    assert calls(r)["evalsha"] == 1  # no extra round trip to set it
    assert r.hgetall("per-user:7")[b"rate"] == b"2"
    assert 89_000 < r.pttl("per-user:7") <= 90_000
    assert 89_000 < r.pttl("{per-user:7}:permits") <= 90_000
    assert 89_000 < r.pttl("{per-user:7}:value") <= 90_000
    RateLimiter(r, "per-user:7").set_rate(5, 60)  # someone else's rate stands
    assert RateLimiter(r, "per-user:7", rate="2/m").attempt().available == 3
    assert r.pttl("per-user:7") == -1  # set_rate without keep_alive: kept until deleted


def test_keep_alive_keys_never_outlive_the_limiter(r):
    """Every key of a limiter with a keepAliveTime keeps a TTL, whichever script wrote it last
    (a counter rewritten by a refusal, or made anew after it was lost)."""
    rl = RateLimiter(r, "ka", rate=(2, 0.2), keep_alive=5)
    assert rl.try_acquire(2)
    time.sleep(0.25)  # both grants expire: the next attempt rewrites the counter
    assert rl.try_acquire(2) and not rl.try_acquire()
    r.delete("{ka}:value")
    assert not rl.try_acquire()  # refused, the counter recounted and made anew
    for key in ("ka", "{ka}:value", "{ka}:permits"):
        assert 0 < r.pttl(key) <= 5000, key


# -- bad input: raised before any command ---------------------------------------------------------
def test_bad_input_before_any_command(r):
    rl = RateLimiter(r, "api")
    rl.set_rate(5, 1.0)
    r.config_resetstat()
    bad = [
        (TypeError, lambda: rl.try_acquire(True)),
        (TypeError, lambda: rl.try_acquire(1.5)),
        (TypeError, lambda: rl.acquire("1")),
        (ValueError, lambda: rl.try_acquire(0)),
        (ValueError, lambda: rl.try_acquire(-1)),
        (RateLimiterError, lambda: rl.try_acquire(6)),
        (RateLimiterError, lambda: rl.acquire(6)),
        (RateLimiterError, lambda: rl.time_until_available(6)),
        (TypeError, lambda: rl.try_acquire(1, "1")),
        (ValueError, lambda: rl.try_acquire(1, -1)),
        (ValueError, lambda: rl.try_acquire(1, float("nan"))),
        (TypeError, lambda: rl.set_rate(True, 1)),
        (TypeError, lambda: rl.set_rate(5, "1")),
        (ValueError, lambda: rl.set_rate(0, 1)),
        (ValueError, lambda: rl.set_rate(5, 0)),
        (ValueError, lambda: rl.set_rate(5, float("inf"))),
        (ValueError, lambda: rl.try_set_rate(5, 10, keep_alive=5)),
        (TypeError, lambda: RateLimiter(r, "other", rate=100)),
        (ValueError, lambda: RateLimiter(r, "other", rate="100/x")),
    ]
    for exc, call in bad:
        with pytest.raises(exc, match="'api'|'other'|rate"):
            call()
    assert issubclass(RateLimiterError, LockError)
    assert sent(r) == 0, calls(r)


def test_parse_rate():
    assert parse_rate("100/s") == (100, 1.0)
    assert parse_rate("100/m") == (100, 60.0)
    assert parse_rate("100/h") == (100, 3600.0)
    assert parse_rate("10/30s") == (10, 30.0)
    assert parse_rate((3, 0.5)) == (3, 0.5)
    for bad in ("100", "100/", "/s", "0/s", "1.5/s", "-1/s"):
        with pytest.raises(ValueError):
            parse_rate(bad)


# -- waiting: the line -------------------------------------------------------------------------
def test_blocking_acquire_costs_two_round_trips_a_grant(r):
    """Eight threads blocked in acquire() on a limiter whose permits free one at a time: each
    is told its own slot (the first in line the next permit, the second the one after...), so
    a grant costs about two attempts (the refusal that tells the wait, the one that takes it;
    now and then a third, when a permit it was counted on is taken a little late), not one per
    waiting thread per freed permit."""
    rl = RateLimiter(r, "api")
    rl.set_rate(2, 0.2)
    r.config_resetstat()
    at: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(4):
            t = rl.acquire()
            with lock:
                at.append(t)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(at) == 32
    at.sort()
    assert all(at[i + 2] - at[i] > 0.2 for i in range(len(at) - 2))
    attempts = calls(r)["evalsha"]
    assert attempts <= 2.5 * 32, attempts  # ~62 here; ~105 without the line
    assert r.zcard(rate_keys("api")[3]) == 0  # nobody left in line


def test_waiter_gives_up_and_leaves_the_line(r):
    rl = RateLimiter(r, "api")
    rl.set_rate(1, 1.5)
    assert rl.try_acquire()
    assert not rl.try_acquire(wait_time=0.5)  # beyond its budget: never joined
    assert r.zcard(rate_keys("api")[3]) == 0
    t = threading.Thread(target=lambda: rl.try_acquire(wait_time=5.0))
    t.start()
    deadline = time.monotonic() + 5
    while r.zcard(rate_keys("api")[3]) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r.zcard(rate_keys("api")[3]) == 1  # in line meanwhile
    # A caller not in line is served after the line: it is told to wait longer.
    assert rl.time_until_available() > 1.5
    t.join(10)
    assert r.zcard(rate_keys("api")[3]) == 0


def test_set_rate_wakes_waiters(r):
    rl = RateLimiter(r, "api")
    rl.set_rate(1, 30.0)
    assert rl.try_acquire()
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(rl.acquire()))
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    RateLimiter(r, "api").set_rate(2, 30.0)
    t.join(10)
    assert out and time.monotonic() - t0 < 5.0  # not the 30 s it was told at first


# -- force-unlock, delete, listing -------------------------------------------------------------
def test_force_unlock_resets_the_budget_and_keeps_the_rate(r):
    rl = RateLimiter(r, "api")
    rl.set_rate(3, 60.0)
    assert rl.try_acquire(3)
    kind = get_kind("rate")
    assert "reset" in kind.note
    assert kind.open(r, "api", "").force_unlock()
    assert rl.available_permits() == 3
    assert rl.get_rate() == (3, 60.0)
    assert rl.delete()
    assert r.keys("*") == [index_key("").encode()] or r.keys("*") == []
    assert r.hget(index_key(""), "api") is None


def test_listed_as_kind_rate(r):
    rl = RateLimiter(r, "api", prefix="p:")
    rl.set_rate(10, 60.0)
    assert rl.try_acquire(4)
    locks = Locks(r, "p:")
    assert locks.names() == ["api"]
    info, = locks.read(["api"])
    assert info.kind == "rate" and info.holders == ()
    assert info.details == {"rate": 10, "interval": 60.0, "available": 6, "waiting": 0}
    # Found by SCAN too (a Java client's limiter never enters the index); its counter is no
    # semaphore of its own.
    r.delete(index_key("p:"))
    assert [(i.name, i.kind) for i in Locks(r, "p:").read(Locks(r, "p:").names(scan=True))] == [
        ("api", "rate")]
    assert get_kind("rate").summary(info.details) == "6/10 per 60s available"


def test_decode_responses_client(redis_server):
    c = redis_server.client(decode_responses=True)
    rl = RateLimiter(c, "dec")
    rl.set_rate(2, 1.0)
    assert rl.attempt().granted and rl.try_acquire()
    assert not rl.try_acquire()
    assert Locks(c).read(["dec"])[0].details["available"] == 0
    c.close()


def test_rate_limited_is_a_lock_busy():
    e = RateLimited("over", "api", 2.5)
    assert isinstance(e, LockError) and e.name == "api" and e.retry_after == 2.5 and e.ttl == 2.5


# -- asyncio -------------------------------------------------------------------------------------
def test_async_twin(redis_server, r):
    async def main() -> None:
        ar = redis.asyncio.Redis(unix_socket_path=redis_server.socket)
        rl = AsyncRateLimiter(ar, "aio", sync_client=r)
        assert await rl.try_set_rate(2, 0.5)
        assert await rl.try_acquire() and await rl.try_acquire()
        assert not await rl.try_acquire()
        assert await rl.available_permits() == 0
        assert 0 < await rl.time_until_available() <= 0.502
        t = time.monotonic()
        got = await asyncio.gather(*(rl.acquire() for _ in range(4)))
        assert 0.3 < time.monotonic() - t < 5
        assert len(got) == 4 and all(g > 0 for g in got)
        with pytest.raises(RateLimiterError):
            await rl.try_acquire(3)
        # A cancelled waiter leaves the line and keeps no grant.
        task = asyncio.ensure_future(rl.acquire())
        await asyncio.sleep(0.1)
        assert r.zcard(rate_keys("aio")[3]) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert r.zcard(rate_keys("aio")[3]) == 0
        await rl.set_rate(3, 0.5)
        assert await rl.get_rate() == (3, 0.5)
        assert await rl.force_unlock()
        assert await rl.available_permits() == 3
        assert await rl.delete()
        await ar.aclose()

    asyncio.run(main())
