"""A leadership's end outside ``stop()``: a term given up by its user (``abandon``), on a
real Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
import redis.asyncio

from django_rlock import AsyncLeader, Leader


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
