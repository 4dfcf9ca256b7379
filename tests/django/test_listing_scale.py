"""Listing with a big database: 1,000,000 unrelated keys and 50 real locks.

The default listing reads the index, so it must send no SCAN and cost the same as on an empty
database; ``--scan`` visits every key and is the "before" figure. The times are printed (run
with ``-s`` to see them) and bounded generously, so a busy CI machine does not fail the build.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from redis.exceptions import ResponseError

from django_rlock import get_lock
from django_rlock.engine import RLock
from tests.django.conftest import DJANGO_REDIS_DB, caches_for
from tests.redis_server import RedisServer

pytestmark = pytest.mark.django_db

UNRELATED = 1_000_000
LOCKS = 50
CHANGELIST = "admin:django_rlock_lock_changelist"
# Fills keys server-side where DEBUG is refused (Redis 7 without enable-debug-command).
FILL = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  redis.call('set', 'demo:1:page:' .. i, 'x')
end
return 0
"""


def populate(client: redis.Redis, n: int) -> None:
    """``n`` plain string keys, made by the server itself (no Python loop, no n round trips)."""
    try:
        client.execute_command("DEBUG", "POPULATE", n, "demo:1:page")
    except ResponseError:
        for start in range(0, n, 100_000):
            client.eval(FILL, 0, start, min(start + 100_000, n) - 1)
    assert client.dbsize() >= n


@pytest.fixture
def big_db(settings: Any, own_server: RedisServer) -> Iterator[redis.Redis]:
    """The cache's database on a server of this test's own, holding a million unrelated keys."""
    settings.CACHES = caches_for(own_server)
    client = own_server.client(db=DJANGO_REDIS_DB)
    populate(client, UNRELATED)
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def fifty_locks(big_db: redis.Redis, hold: Callable[..., RLock]) -> list[str]:
    names = [f"job:{i:02d}" for i in range(LOCKS)]
    for name in names:
        hold(get_lock(name))
    return names


def scans(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def commands(client: redis.Redis) -> int:
    """Every command the server ran since the last ``CONFIG RESETSTAT`` (this one's INFO too)."""
    return sum(int(c["calls"]) for c in client.info("commandstats").values())


def timed(fn: Callable[[], Any], runs: int = 5) -> tuple[Any, float, float]:
    """``fn()``'s result, the first call's wall time and the median of ``runs`` calls."""
    times = []
    result = None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, times[0], statistics.median(times)


def list_json(*args: str) -> list[dict[str, Any]]:
    out = StringIO()
    call_command("locks", "list", "--format", "json", *args, stdout=out)
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def report(what: str, first: float, median: float) -> None:
    print(f"\n{what} with {UNRELATED:,} other keys: first {first * 1000:.1f} ms, "
          f"median {median * 1000:.1f} ms")


def test_command_lists_from_the_index_without_scan(big_db: redis.Redis, fifty_locks: list[str]) -> None:
    big_db.config_resetstat()
    found, first, median = timed(list_json)
    assert [d["name"] for d in found] == fifty_locks
    assert all(d["holders"][0]["pid"] is not None for d in found)
    assert scans(big_db) == 0
    report("locks list (index)", first, median)
    # Its cost is counted, not timed (a first call on a loaded CI machine took 127 ms once):
    # a listing runs a dozen commands per lock, whatever else the database holds.
    big_db.config_resetstat()
    list_json()
    sent = commands(big_db)
    print(f"locks list: {sent} commands for {LOCKS} locks")
    assert sent <= 15 * LOCKS + 10, sent  # 12 per lock today (pipelined reads of its keys)
    assert median < 0.5, f"locks list took {median * 1000:.1f} ms (median of 5)"

    found, first, median = timed(lambda: list_json("--scan"), runs=2)
    assert [d["name"] for d in found] == fifty_locks
    assert scans(big_db) >= UNRELATED // 1000  # every key visited, COUNT 1000 per call
    report("locks list --scan", first, median)


def test_admin_changelist_from_the_index_without_scan(admin_client: Client, big_db: redis.Redis,
                                                      fifty_locks: list[str]) -> None:
    url = reverse(CHANGELIST)
    big_db.config_resetstat()
    response, first, median = timed(lambda: admin_client.get(url))
    assert response.status_code == 200 and f"{LOCKS} locks" in response.content.decode()
    assert scans(big_db) == 0
    report("admin changelist (index)", first, median)
    assert median < 0.5, f"the changelist took {median * 1000:.1f} ms"

    response, first, median = timed(lambda: admin_client.get(url, {"scan": "1"}), runs=2)
    assert f"{LOCKS} locks" in response.content.decode()
    assert scans(big_db) > 0
    report("admin changelist ?scan=1", first, median)
