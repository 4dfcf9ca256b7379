"""CountDownLatch: Redisson's ``RCountDownLatch``.

Redisson's layout: the string ``<key>`` holds the count; changes are published on
``redisson_countdownlatch__channel__{<key>}`` (literal braces, ``naming.latch_channel``).
``count_down`` deletes the key once the count reaches zero and then publishes ``0``;
``try_set_count`` and ``delete`` publish ``1`` (a new count). A missing key is a count of 0,
so waiting on a latch that was never set, or was deleted, returns at once.

Waiters use the engine's one wait loop on the process's one subscription; every message
wakes every local waiter (``pubsub.wake_all``), which re-reads the count. A message can be
lost (a reconnect) and the key can vanish without one, so each park is also bounded by
``RECHECK`` seconds: a waiter re-checks at least that often and never hangs for good.
"""

from __future__ import annotations

from typing import Any

from .naming import latch_channel
from .scripts import _STAMP, Script, acall_once, call_once
from .semaphore import RECHECK, _Named
from .wait.channel import wake_all

# KEYS[1] key, KEYS[2] channel, KEYS[3] index; ARGV[1] count. Reply 1 = set, 0 = it has one.
LATCH_TRY_SET = """
if redis.call('exists', KEYS[1]) == 1 then return 0 end
redis.call('set', KEYS[1], ARGV[1])
""" + _STAMP + """
redis.call('hset', KEYS[3], KEYS[1], stamp .. ' {"kind":"latch"}')
redis.call('publish', KEYS[2], '1')
return 1
"""

# KEYS as LATCH_TRY_SET. Reply: the count now (0 when it is open).
LATCH_COUNT_DOWN = """
local v = redis.call('decr', KEYS[1])
if v <= 0 then
  redis.call('del', KEYS[1])
  redis.call('hdel', KEYS[3], KEYS[1])
end
if v == 0 then redis.call('publish', KEYS[2], '0') end
return math.max(v, 0)
"""

# KEYS as LATCH_TRY_SET. Reply 1 = deleted (and published), 0 = there was none.
LATCH_DELETE = """
redis.call('hdel', KEYS[3], KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], '1')
  return 1
end
return 0
"""

LATCH_TRY_SET_SCRIPT = Script(LATCH_TRY_SET)
LATCH_COUNT_DOWN_SCRIPT = Script(LATCH_COUNT_DOWN)
LATCH_DELETE_SCRIPT = Script(LATCH_DELETE)


class _LatchBase(_Named):
    _WHAT = "latch"
    _WAKES = staticmethod(wake_all)
    _RECHECK = RECHECK

    def __init__(self, client: Any, name: str, prefix: str = "", *, aio: bool = False,
                 sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, aio=aio, sync_client=sync_client)
        self._channel = latch_channel(self.key).encode()
        self._keys = (self.key, self._channel, self._index)

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
        return self._waits(lambda: self._open(self._reader.get(self.key)), budget)

    def delete(self) -> bool:
        """Delete the latch (its waiters see a count of 0 and return); True if there was one."""
        return bool(call_once(self._client, LATCH_DELETE_SCRIPT, self._keys, ()))


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

        async def attempt() -> int | None:
            return self._open(await self._reader.get(self.key))

        return await self._awaits(attempt, budget)

    async def delete(self) -> bool:
        return bool(await acall_once(self._client, LATCH_DELETE_SCRIPT, self._keys, ()))


__all__ = ["AsyncCountDownLatch", "CountDownLatch"]
