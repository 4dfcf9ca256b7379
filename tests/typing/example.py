"""A small typed user of django_rlock, checked by ``mypy --strict`` (tests/typing/test_typing.py).

Every line says what a type checker must see: the public names are typed (not ``Any``),
decorated functions keep their signatures, ``get_lock`` returns the lock class of its kind.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, assert_type

from django_rlock import (
    AsyncFairLock,
    AsyncLeader,
    AsyncMultiLock,
    AsyncReadLock,
    AsyncRLock,
    CountDownLatch,
    FairLock,
    FencedLock,
    Leader,
    LockBusy,
    MultiLock,
    NonReentrantLock,
    PermitExpirableSemaphore,
    RateLimiter,
    ReadLock,
    RLock,
    WriteLock,
    get_latch,
    get_leader,
    get_lock,
    get_rate_limiter,
    get_semaphore,
    limited,
    locked,
    rate_limited,
)


@locked("report:{pk}", wait=2)
def report(pk: int, fmt: str = "csv") -> str:
    return f"{pk}.{fmt}"


@locked("areport:{pk}")
async def areport(pk: int) -> bytes:
    return b""


@limited("export:{user_id}", permits=2)
def export(user_id: int) -> list[int]:
    return [user_id]


@rate_limited("search:{q}", rate="30/m")
def search(q: str) -> int:
    return len(q)


assert_type(report(1), str)
assert_type(report(1, fmt="json"), str)
report("1")  # type: ignore[arg-type]  # an unused ignore fails --strict: report is not Any
pending = assert_type(areport(1), Coroutine[Any, Any, bytes])
pending.close()
assert_type(export(3), list[int])
assert_type(search("a"), int)

assert_type(get_lock("invoice:1"), RLock)
assert_type(get_lock("invoice:1", kind="fair"), FairLock)
assert_type(get_lock("invoice:1", kind="read"), ReadLock)
assert_type(get_lock("invoice:1", kind="write"), WriteLock)
assert_type(get_lock("invoice:1", kind="fenced"), FencedLock)
assert_type(get_lock("invoice:1", cache=["a", "b", "c"]), MultiLock)
assert_type(get_lock("invoice:1", kind="non_reentrant"), NonReentrantLock)


async def in_async_code() -> None:  # get_lock(aio=True): the asyncio twin of each kind
    assert_type(get_lock("invoice:1", aio=True), AsyncRLock)
    assert_type(get_lock("invoice:1", kind="fair", aio=True), AsyncFairLock)
    assert_type(get_lock("invoice:1", kind="read", aio=True), AsyncReadLock)
    assert_type(get_lock("invoice:1", cache=["a", "b"], aio=True), AsyncMultiLock)
    async with get_lock("invoice:1", aio=True):
        pass


assert_type(get_semaphore("pool", 3), PermitExpirableSemaphore)
assert_type(get_latch("ready"), CountDownLatch)
assert_type(get_rate_limiter("api", "10/s"), RateLimiter)
assert_type(get_leader("beat"), Leader)
assert_type(get_leader("beat", aio=True), AsyncLeader)


def use(lock: RLock) -> float | None:
    if lock.try_lock(wait_time=1.0):
        try:
            return lock.remaining_ttl()
        finally:
            lock.unlock()
    return None


try:
    with get_lock("invoice:2"):
        pass
except LockBusy as busy:
    assert_type(busy.ttl, float | None)
