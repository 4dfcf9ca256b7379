"""An asyncio waiter's park and wake (``wait/waiter.py``, invariants 4 and 49), on real event
loops in real threads: a park is one future and one timer, a wake before the park is kept, a
cancellation propagates, and a wake from the pub/sub listener is written only once it lets go
of the manager lock (``hold_wakes`` / ``send_held_wakes``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from django_rlock.engine.wait.waiter import State, Waiter, hold_wakes, send_held_wakes


class LoopThread:
    """An event loop running in a thread of its own, with one waiter made on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(5)
        self.waiter: Waiter = self.call(lambda: Waiter("k", loop=self.loop))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self.ready.set)
        self.loop.run_forever()

    def call(self, fn: Any) -> Any:
        done: list[Any] = []
        ev = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (done.append(fn()), ev.set()))
        assert ev.wait(5)
        return done[0]

    def park(self, timeout: float | None) -> Any:
        """Start a park on the loop; a concurrent future that resolves to its duration."""
        async def park() -> float:
            t = time.monotonic()
            await self.waiter.apark(timeout)
            return time.monotonic() - t
        return asyncio.run_coroutine_threadsafe(park(), self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def lt():
    t = LoopThread()
    yield t
    if not t.loop.is_closed():
        t.stop()


def test_a_wake_held_by_the_listener_is_written_only_when_sent(lt):
    parked = lt.park(30.0)
    time.sleep(0.1)
    hold_wakes()
    try:
        assert lt.waiter.wake() is True  # booked as woken: the loop is open
        time.sleep(0.3)
        assert not parked.done()  # ... but nothing written to its loop yet
    finally:
        send_held_wakes()
    assert parked.result(5) < 5
    # Held no more: the next wake from this thread is written at once.
    parked = lt.park(30.0)
    time.sleep(0.1)
    assert lt.waiter.wake() is True
    assert parked.result(5) < 5


def test_a_wake_for_a_closed_loop_fails_and_abandons_the_waiter_even_when_held(lt):
    lt.stop()
    hold_wakes()
    try:
        assert lt.waiter.wake() is False
    finally:
        send_held_wakes()
    assert lt.waiter.state is State.ABANDONED


def test_a_park_ends_at_its_bound_a_wake_before_it_is_kept_and_used_once(lt):
    assert 0.04 <= lt.park(0.05).result(5) < 3  # its bound: returns, raises nothing
    lt.call(lt.waiter.wake)  # woken from its own loop before it parks
    assert lt.park(30.0).result(5) < 1  # the wake was kept (invariant 4) ...
    assert lt.park(0.2).result(5) >= 0.15  # ... and used up by that park
    assert lt.park(0).result(5) < 1  # no time left: no park at all


def test_a_cancelled_park_raises_the_cancellation(lt):
    async def main() -> str:
        task = asyncio.ensure_future(lt.waiter.apark(None))
        await asyncio.sleep(0.1)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "returned"

    assert asyncio.run_coroutine_threadsafe(main(), lt.loop).result(5) == "cancelled"
    # The waiter is usable again: a wake ends the next park.
    parked = lt.park(30.0)
    time.sleep(0.1)
    lt.waiter.wake()
    assert parked.result(5) < 5
