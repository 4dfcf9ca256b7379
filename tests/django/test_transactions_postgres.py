"""``@locked`` inside database transactions, on a real PostgreSQL the suite starts itself.

Each test reads the result of one scenario of ``tests/django/txn_run.py``; all of them run in
one subprocess (its own Django settings: two PostgreSQL databases, ``ATOMIC_REQUESTS``), with
the server started here on a unix socket in a temp dir and stopped at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.django.postgres import PostgresServer, postgres_bindir
from tests.redis_server import RedisServer

ROOT = Path(__file__).parents[2]
N = 8

SCENARIOS = [
    ("views", "concurrent_views", {"n": N, "url": "/bump/"}),
    ("views_at_return", "concurrent_views", {"n": N, "url": "/bump-at-return/"}),
    ("atomic", "concurrent_atomic", {"n": N, "at_return": False}),
    ("atomic_at_return", "concurrent_atomic", {"n": N, "at_return": True}),
    ("commit", "commit", {}),
    ("rollback", "rollback", {}),
    ("call_raises", "call_raises", {}),
    ("savepoints", "savepoints", {}),
    ("two_databases", "two_databases", {}),
    ("callbacks", "callbacks", {"fail_first": False}),
    ("callbacks_fail_first", "callbacks", {"fail_first": True}),
]

FREE = {"locked": False, "renewing": 0}
HELD = {"locked": True, "renewing": 1}


@pytest.fixture(scope="module")
def results(redis_server: RedisServer) -> Iterator[dict[str, Any]]:
    if postgres_bindir() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, postgres): apt-get install postgresql, "
                    "or set PG_BIN to their directory")
    with PostgresServer() as pg:
        env = {**os.environ, "RLOCK_TEST_PG_HOST": pg.socket_dir,
               "RLOCK_TEST_REDIS": f"{redis_server.url}?db=7"}
        proc = subprocess.run(
            [sys.executable, "-m", "tests.django.txn_run", json.dumps(SCENARIOS)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
        assert proc.returncode == 0, proc.stderr[-6000:] + pg.log()
        yield json.loads(proc.stdout.strip().splitlines()[-1])


def result(results: dict[str, Any], key: str) -> dict[str, Any]:
    out = results[key]
    assert "error" not in out, out["error"]
    return out


def test_atomic_requests_view_loses_no_update(results):
    out = result(results, "views")
    assert out["statuses"] == [200] * N
    assert out["final"] == N  # every request read the previous one's committed write
    assert out["after"] == FREE


def test_atomic_requests_view_released_at_return_loses_updates(results):
    # The control: with until_commit=False the next request takes the lock while the previous
    # COMMIT is still running and reads the old value. Proves the test above can fail.
    out = result(results, "views_at_return")
    assert out["statuses"] == [200] * N
    assert out["final"] < N
    assert out["after"] == FREE


def test_atomic_block_around_locked_function_loses_no_update(results):
    out = result(results, "atomic")
    assert sorted(out["results"]) == list(range(1, N + 1))
    assert out["final"] == N
    assert out["after"] == FREE


def test_atomic_block_released_at_return_loses_updates(results):
    out = result(results, "atomic_at_return")
    assert out["final"] < N
    assert len(set(out["results"])) < N  # two calls wrote the same value
    assert out["after"] == FREE


def test_commit_releases_and_the_next_holder_sees_the_write(results):
    out = result(results, "commit")
    assert out["held_by_call"] is True
    assert out["inside"] == HELD and out["waiter_blocked"] is True  # returned, not committed
    assert out["after"] == FREE
    assert out["seen_by_next"] == [1]


def test_rollback_releases_at_once_and_nothing_renews_it(results):
    out = result(results, "rollback")
    assert out["inside"] == HELD
    assert out["after"] == FREE
    assert out["later"] == FREE  # 1.5 watchdog timeouts later: no renewal brought it back
    assert out["value"] == 0


def test_call_that_raises_holds_until_the_callers_commit(results):
    out = result(results, "call_raises")
    assert out["inside"] == HELD  # its write is still in the caller's transaction
    assert out["after"] == FREE
    assert out["value"] == 1


def test_savepoint_rollback_releases_a_released_savepoint_holds(results):
    out = result(results, "savepoints")
    assert out["inside_savepoint"] == HELD
    assert out["after_savepoint_rollback"] == FREE  # its writes are gone with the savepoint
    assert out["after_savepoint_release"] == HELD and out["outer_still_open"] is True
    assert out["after_commit"] == FREE
    assert out["value"] == 1


def test_two_databases_released_when_the_last_transaction_ends(results):
    out = result(results, "two_databases")
    assert out["after_other_commit"] == HELD
    assert out["after_default_commit"] == FREE
    assert out["after_default_commit_2"] == HELD
    assert out["after_other_rollback"] == FREE


def test_release_comes_before_the_calls_own_on_commit_callbacks(results):
    out = result(results, "callbacks")
    assert out["status"] == 200
    assert out["seen"] == {"free_in_callback": True}
    assert out["after"] == FREE


def test_commit_callback_skipped_by_django_is_released_when_the_request_ends(results):
    # An earlier on_commit callback raised: Django skips the rest, ours included, and the
    # traceback keeps them alive. request_finished releases the lock all the same.
    out = result(results, "callbacks_fail_first")
    assert out["raised"] == "an on_commit callback failed"
    assert out["traceback_alive"] is True
    assert out["after"] == FREE
    assert out["seen"] == {}
