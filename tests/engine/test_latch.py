"""CountDownLatch / AsyncCountDownLatch: Redisson's RCountDownLatch (RedissonCountDownLatchTest)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio

from django_rlock.engine.latch import AsyncCountDownLatch, CountDownLatch
from django_rlock.engine.naming import index_key
from django_rlock.engine.semaphore import RECHECK

ROOT = Path(__file__).parents[2]
CHANNEL = "redisson_countdownlatch__channel__{%s}"


@pytest.fixture
def ar(redis_server, r):
    return redis.asyncio.Redis(unix_socket_path=redis_server.socket)


def background(fn, *args):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


def test_await_timeout(r):
    latch = CountDownLatch(r, "l")
    assert latch.try_set_count(1)
    threading.Timer(0.5, latch.count_down).start()
    t0 = time.monotonic()
    assert latch.wait(RECHECK * 0.8)  # woken by the "0" message, not by a re-check
    assert 0.4 < time.monotonic() - t0 < RECHECK * 0.8 - 0.5
    assert latch.get_count() == 0


def test_await_timeout_fail(r):
    latch = CountDownLatch(r, "l")
    latch.try_set_count(1)
    timer = threading.Timer(2.0, latch.count_down)
    timer.start()
    t0 = time.monotonic()
    assert latch.wait(0.5) is False
    assert 0.45 < time.monotonic() - t0 < 2
    assert latch.wait(0) is False  # just a look
    timer.join()
    assert latch.wait(0) is True


def test_count_down(r):
    latch = CountDownLatch(r, "l")
    latch.try_set_count(2)
    assert latch.get_count() == 2
    latch.count_down()
    assert latch.get_count() == 1
    latch.count_down()
    assert latch.get_count() == 0
    latch.count_down()  # stays 0: the key is gone
    assert latch.get_count() == 0 and not r.exists("l")
    assert latch.wait() is True
    assert CountDownLatch(r, "missing").wait() is True  # a latch never set is open


def test_try_set_count_delete_and_count(r):
    latch = CountDownLatch(r, "l")
    assert latch.get_count() == 0
    assert latch.delete() is False
    assert latch.try_set_count(3)
    assert not latch.try_set_count(5)
    assert latch.get_count() == 3
    assert latch.delete() is True
    assert latch.get_count() == 0 and latch.try_set_count(1)


def test_multi_await(r):
    latch = CountDownLatch(r, "l")
    latch.try_set_count(5)
    waiters = [background(latch.wait, 10) for _ in range(5)]
    for i in range(5):
        threading.Timer(0.2 + 0.1 * i, latch.count_down).start()
    for t, _ in waiters:
        t.join(7)
    assert [out for _, out in waiters] == [[True]] * 5


def test_layout_messages_and_index(r, redis_server):
    latch = CountDownLatch(r, "lay", prefix="p:")
    assert latch.key == "p:lay" and latch.channel == CHANNEL % "p:lay"
    sub = redis_server.client().pubsub()
    sub.subscribe(CHANNEL % "p:lay")
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    latch.try_set_count(2)
    assert r.get("p:lay") == b"2"
    assert r.hget(index_key("p:"), "p:lay").decode().split(" ", 1)[1] == '{"kind":"latch"}'
    latch.count_down()
    latch.count_down()
    assert not r.exists("p:lay") and not r.hexists(index_key("p:"), "p:lay")
    latch.try_set_count(1)
    latch.delete()
    assert not r.hexists(index_key("p:"), "p:lay")
    got = []
    while (m := sub.get_message(timeout=0.5)) is not None:
        got.append(m["data"])
    assert got == [b"1", b"0", b"1", b"1"]  # set, reached zero, set, deleted
    sub.close()


def test_a_deleted_latch_releases_its_waiters(r):
    latch = CountDownLatch(r, "del")
    latch.try_set_count(3)
    t, out = background(latch.wait, RECHECK * 0.8)
    time.sleep(0.3)
    latch.delete()
    t.join(RECHECK)
    assert out == [True]


def test_a_lost_message_is_found_by_the_recheck(r):
    latch = CountDownLatch(r, "lost")
    latch.try_set_count(1)
    t, out = background(latch.wait, RECHECK * 3)
    time.sleep(0.3)
    r.delete("lost")  # at zero with no message
    t0 = time.monotonic()
    t.join(RECHECK * 3)
    assert out == [True] and time.monotonic() - t0 <= RECHECK + 1


def test_bad_input_raises_before_any_command():
    dead = redis.Redis(unix_socket_path="/nonexistent")
    latch = CountDownLatch(dead, "bad")
    for call, exc in [
        (lambda: latch.try_set_count(0), ValueError), (lambda: latch.try_set_count(-1), ValueError),
        (lambda: latch.try_set_count(True), TypeError), (lambda: latch.try_set_count(1.0), TypeError),
        (lambda: latch.wait(-1), ValueError), (lambda: latch.wait("1"), TypeError),
    ]:
        with pytest.raises(exc, match="'bad'"):
            call()
    with pytest.raises(ValueError):
        CountDownLatch(dead, "")


def test_20_waiters_in_4_processes(r, redis_server):
    latch = CountDownLatch(r, "many")
    latch.try_set_count(2)
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine._sem_proc", "latch",
                               redis_server.socket, "many", "5", "60"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every process subscribed, its waiters parked
            if r.pubsub_numsub(CHANNEL % "many")[0][1] == 4:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        latch.count_down()
        time.sleep(0.3)
        assert all(p.poll() is None for p in procs)  # count 1: still waiting
        opened = time.time()
        latch.count_down()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            results += json.loads(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(results) == 20 and all(ok for ok, _ in results)
    assert max(at for _, at in results) - opened < 3


# -- AsyncCountDownLatch -------------------------------------------------------------------------
def test_async_latch(ar, r):
    async def main() -> None:
        latch = AsyncCountDownLatch(ar, "al")
        assert await latch.try_set_count(2)
        assert not await latch.try_set_count(2)
        waiters = [asyncio.ensure_future(latch.wait(RECHECK * 0.8)) for _ in range(5)]
        await asyncio.sleep(0.2)
        await latch.count_down()
        assert await latch.get_count() == 1
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waiters)
        t0 = time.monotonic()
        await latch.count_down()
        assert await asyncio.gather(*waiters) == [True] * 5
        assert time.monotonic() - t0 < RECHECK * 0.8 - 0.5
        assert await latch.wait(0) is True
        assert await latch.try_set_count(1)
        assert await latch.wait(0.2) is False
        cancelled = asyncio.ensure_future(latch.wait())
        await asyncio.sleep(0.1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert await latch.delete()
        await ar.aclose()

    asyncio.run(main())
