"""CountDownLatch: Redisson's ``RCountDownLatch``.

Redisson's layout: the string ``<key>`` holds the count; changes are published on
``redisson_countdownlatch__channel__{<key>}`` (literal braces, ``naming.latch_channel``).
``count_down`` deletes the key once the count reaches zero and then publishes ``0``;
``try_set_count`` and ``delete`` publish ``1`` (a new count). A missing key is a count of 0,
so waiting on a latch that was never set, or was deleted, returns at once.

Waiters use the engine's one wait loop on the process's one subscription; every message
wakes every local waiter (``wait.channel.wake_all``), which re-reads the count. A message can be
lost (a reconnect) and the key can vanish without one, so each park is also bounded by
``RECHECK`` seconds: a waiter re-checks at least that often and never hangs for good.
"""

from __future__ import annotations

from typing import Any

from . import waiters
from .kinds import SEMAPHORE_OR_LATCH, Kind, declare
from .lua import Script, source
from .named import RECHECK, Named
from .naming import READ_UNLOCK_MESSAGE, latch_channel
from .scripts import acall_once, call_once
from .wait.channel import wake_all

# KEYS, ARGV and the reply of each: ``lua/latch_*.lua``.
LATCH_TRY_SET = source("latch_try_set")
LATCH_COUNT_DOWN = source("latch_count_down")
LATCH_DELETE = source("latch_delete")

LATCH_TRY_SET_SCRIPT = Script(LATCH_TRY_SET)
LATCH_COUNT_DOWN_SCRIPT = Script(LATCH_COUNT_DOWN)
LATCH_DELETE_SCRIPT = Script(LATCH_DELETE)
#: A waiter's retry: the count, read by a script that carries its record (``waiters``).
LATCH_COUNT_SCRIPT = Script(source("latch_count"))
_WAITING = "reply and (tonumber(reply) or 0) > 0"


class _LatchBase(Named):
    _WHAT = "latch"
    _WAKES = staticmethod(wake_all)
    _RECHECK = RECHECK

    def __init__(self, client: Any, name: str, prefix: str = "", *, aio: bool = False,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=aio, sync_client=sync_client)
        self._channel = latch_channel(self.key).encode()
        self._keys = (self.key, self._channel, self._index)

    def _force_call(self) -> tuple[Script, tuple[Any, ...], tuple[Any, ...]]:
        # The force-unlock of a latch is its delete: it opens, and every waiter returns.
        return LATCH_DELETE_SCRIPT, self._keys, ()

    @staticmethod
    def _open(value: Any) -> int | None:
        """An attempt's outcome from the count read: None (open), or -1 (wait, unbounded)."""
        return None if value is None or int(value) <= 0 else -1


class CountDownLatch(_LatchBase):
    """Redisson's ``RCountDownLatch``: ``wait()`` returns once ``count_down()`` has been
    called ``n`` times (``try_set_count(n)``), by any thread, process or host."""

    def try_set_count(self, count: int) -> bool:
        """Set the count (>= 1) if the latch has none; True if it was set."""
        n = self._count(count, "count", least=1)
        return bool(call_once(self._client, LATCH_TRY_SET_SCRIPT, self._keys, (n,)))

    def count_down(self) -> None:
        """Lower the count by one; at zero the latch opens (key deleted, waiters woken)."""
        call_once(self._client, LATCH_COUNT_DOWN_SCRIPT, self._keys, ())

    def get_count(self) -> int:
        return int(self._reader.get(self.key) or 0)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the count is zero (``await`` in Redisson); False if ``timeout`` seconds
        passed first (None: no limit, 0: just look)."""
        budget = self._budget(timeout, "timeout")
        def attempt(note: waiters.Note | None = None) -> int | None:
            if note is None:
                return self._open(self._reader.get(self.key))
            return self._open(call_once(self._client, *waiters.noted(
                note, LATCH_COUNT_SCRIPT, (self.key,), (), _WAITING)))

        return self._waits(attempt, budget)

    def delete(self) -> bool:
        """Delete the latch (its waiters see a count of 0 and return); True if there was one."""
        return bool(call_once(self._client, LATCH_DELETE_SCRIPT, self._keys, ()))

    def force_unlock(self) -> bool:
        """``delete``, as ``manage.py locks clear`` and the admin do it (this process's
        listeners hear a ``force_unlocked`` event)."""
        return self._forced(call_once(self._client, LATCH_DELETE_SCRIPT, self._keys, ()),
                            self._forcing())


class AsyncCountDownLatch(_LatchBase):
    """``CountDownLatch`` for asyncio (``redis.asyncio`` client)."""

    def __init__(self, client: Any, name: str, prefix: str = "", *,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=True, sync_client=sync_client)

    async def try_set_count(self, count: int) -> bool:
        n = self._count(count, "count", least=1)
        return bool(await acall_once(self._client, LATCH_TRY_SET_SCRIPT, self._keys, (n,)))

    async def count_down(self) -> None:
        await acall_once(self._client, LATCH_COUNT_DOWN_SCRIPT, self._keys, ())

    async def get_count(self) -> int:
        return int(await self._reader.get(self.key) or 0)

    async def wait(self, timeout: float | None = None) -> bool:
        budget = self._budget(timeout, "timeout")

        async def attempt(note: waiters.Note | None = None) -> int | None:
            if note is None:
                return self._open(await self._reader.get(self.key))
            return self._open(await acall_once(self._client, *waiters.noted(
                note, LATCH_COUNT_SCRIPT, (self.key,), (), _WAITING)))

        return await self._awaits(attempt, budget)

    async def delete(self) -> bool:
        return bool(await acall_once(self._client, LATCH_DELETE_SCRIPT, self._keys, ()))

    async def force_unlock(self) -> bool:
        """``CountDownLatch.force_unlock`` for asyncio."""
        before = self._forcing()
        return self._forced(await acall_once(self._client, LATCH_DELETE_SCRIPT, self._keys, ()),
                            before)


class SemaphoreOrLatch(Named):
    """An integer string found by SCAN with no index entry: Redisson stores a semaphore and a
    latch alike, so its force-unlock does what either's would (deleted; the waiters of both
    woken, a latch's returning)."""

    def force_unlock(self) -> bool:
        script, keys, args = self._force_call()
        return self._forced(call_once(self._client, script, keys,
                                      args + (latch_channel(self.key), READ_UNLOCK_MESSAGE)),
                            self._forcing())


LATCH = declare(Kind(
    "latch", "string",
    note="The latch opens (a missing latch counts 0): every waiter returns.",
    open=CountDownLatch, detect=lambda probe: False,
    details=lambda probe, detail: {"count": probe["number"]},
    summary=lambda d: f"count {d['count']}",
    lines=lambda d: [f"count: {d['count']}"]))
EITHER = declare(Kind(
    SEMAPHORE_OR_LATCH, "string",
    note="The key is deleted: a semaphore has no permits until they are set again, a latch "
         "opens. Waiters of either are woken.",
    open=SemaphoreOrLatch, details=lambda probe, detail: {"value": probe["number"]},
    summary=lambda d: f"value {d['value']}",
    lines=lambda d: [
        f"count or permits: {d['value']} (a semaphore or a latch: Redisson stores both "
        f"alike, and no index entry says which)"]))

__all__ = ["AsyncCountDownLatch", "CountDownLatch", "SemaphoreOrLatch"]
