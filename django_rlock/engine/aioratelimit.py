"""AsyncRateLimiter: ``RateLimiter`` on a ``redis.asyncio`` client.

The same scripts and layout. Waiting is the engine's ``await_`` (the task parks on its own
event loop). A cancelled ``acquire`` never spends permits nobody uses: a grant its round trip
took as it was cancelled is given back by id (that grant and no other, unlike Redisson's
``release``, which frees the oldest grants of anyone), and a place in line is given up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import waiters
from .named import uncancellable
from .ratelimit import (
    RATE_LEAVE_SCRIPT,
    RATE_PEEK_SCRIPT,
    RATE_SET_SCRIPT,
    REFUSED,
    Grant,
    RateLimiterBase,
    grant_id,
)
from .scripts import acall_once
from .wait import loop as waiting


class AsyncRateLimiter(RateLimiterBase):
    """``RateLimiter`` for asyncio; every method is a coroutine."""

    def __init__(self, client: Any, name: str, prefix: str = "", *, rate: Any = None,
                 keep_alive: float | None = None, sync_client: Any = None) -> None:
        super().__init__(client, name, prefix, rate=rate, keep_alive=keep_alive, aio=True,
                         sync_client=sync_client)

    async def try_set_rate(self, rate: int, interval: float,
                           keep_alive: float | None = None) -> bool:
        r, i, k = self._rate_args(rate, interval, keep_alive)
        done = bool(await acall_once(self._client, RATE_SET_SCRIPT, (*self._keys, self._index),
                                     (r, i, "1", self.channel, k)))
        if done:
            self._rate = r
        return done

    async def set_rate(self, rate: int, interval: float, keep_alive: float | None = None) -> None:
        r, i, k = self._rate_args(rate, interval, keep_alive)
        await acall_once(self._client, RATE_SET_SCRIPT, (*self._keys, self._index),
                         (r, i, "0", self.channel, k))
        self._rate = r

    async def get_rate(self) -> tuple[int, float] | None:
        rate, interval = await self._reader.hmget(self.key, "rate", "interval")
        if rate is None or interval is None:
            return None
        self._rate = int(rate)
        return int(rate), int(interval) / 1000.0

    async def try_acquire(self, permits: int = 1, wait_time: float = 0.0) -> bool:
        return (await self.attempt(permits, wait_time)).granted

    async def acquire(self, permits: int = 1) -> float:
        g = await self._take(self._permits(permits), None)
        return g.at if g.at is not None else 0.0

    async def attempt(self, permits: int = 1, wait_time: float = 0.0) -> Grant:
        n = self._permits(permits)
        return await self._take(n, self._wait_budget(wait_time))

    async def _send(self, n: int, token: str, budget: float | None,
                    note: waiters.Note | None = None) -> Grant:
        box: list[Grant] = []

        async def send() -> int | None:
            g = self._grant(await acall_once(self._client,
                                             *self._sending(n, token, budget, note)), n)
            box.append(g)
            return None if g.granted else 0

        async def undo() -> None:  # cancelled as its grant landed: that grant given back
            await self._leave(f"{token}|{n}" if token else "", box[0].id, n)

        await uncancellable(send, undo)
        return box[0]

    async def _take(self, n: int, budget: float | None) -> Grant:
        t0 = time.monotonic()
        token = "" if budget == 0 else grant_id()
        note = self._note(t0, budget) if token else None
        g = await self._send(n, token, budget, note)
        if g.granted or g.code != REFUSED or not token:
            return g
        deadline = None if budget is None else time.monotonic() + budget
        last = [g]

        async def attempt(claim: bool) -> int | None:
            r = last[0] = await self._send(n, token, self._left(deadline), note)
            return None if r.granted else self._park_ms(r, deadline)

        try:
            await waiting.await_(self._wait(t0), attempt, self._left(deadline),
                                 park_until=time.monotonic() + min(g.retry_after + 0.001, self._RECHECK))
        finally:
            if not last[0].granted and last[0].code == REFUSED:
                await asyncio.shield(self._leave(f"{token}|{n}", "", n))
        return last[0]

    async def _leave(self, member: str, gid: str, n: int) -> None:
        try:
            await acall_once(self._client, RATE_LEAVE_SCRIPT, self._keys, (member, gid, n))
        except Exception:
            pass  # its place expires LINE_SLACK after its wait

    async def available_permits(self) -> int:
        reply = await acall_once(self._client, RATE_PEEK_SCRIPT, self._keys, (1,))
        return max(self._peeked(reply, 1)[1], 0)

    async def time_until_available(self, permits: int = 1) -> float:
        n = self._permits(permits)
        reply = await acall_once(self._client, RATE_PEEK_SCRIPT, self._keys, (n,))
        return self._peeked(reply, n)[0]

    async def force_unlock(self) -> bool:
        """``RateLimiter.force_unlock`` for asyncio: the budget reset, the rate kept."""
        before = self._forcing()
        script, keys, args = self._force_call()
        return self._forced(await acall_once(self._client, script, keys, args), before)

    async def delete(self) -> bool:
        script, keys, args = self._delete_call()
        self._rate = None
        return bool(await acall_once(self._client, script, keys, args))


__all__ = ["AsyncRateLimiter"]
