"""``fenced_update`` / ``afenced_update``: a write a stale FencedLock holder cannot make.

The scenarios (tests/django/fencing_app.py) run on the session's SQLite here, and on a
PostgreSQL of the suite's own (``PostgresServer``) in a subprocess, where two writers also
race in open transactions.
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
from django.db import connection, models
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from django_rlock.connection import get_client, get_prefix
from django_rlock.engine.clients import async_twin
from django_rlock.fencing import afenced_update, fenced_update
from tests.django import fencing_app
from tests.django.fencing_app import Child, Job, Versioned
from tests.django.postgres import PostgresServer, postgres_bindir
from tests.redis_server import RedisServer

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.django_db(transaction=True)


def check_stale_writer(out: dict[str, Any]) -> None:
    assert "error" not in out, out.get("error")
    t1, t2 = out["tokens"]
    assert t2 > t1
    assert out["a_first"] == 1  # a NULL token column is older than any token
    assert out["a_again"] == 1  # the holder writes again with its own token
    assert out["after_a"] == {"result": "A", "writes": 2, "token": t1}
    assert out["b"] == 1
    assert out["a_late"] == 0  # the paused holder's write is refused...
    assert out["a_late_other_filter"] == 0
    assert out["final"] == {"result": "B", "writes": 3, "token": t2}  # ...B's work stays
    assert out["b_missing_row"] == 0
    assert out["zero_start"] == 1  # a column that starts at 0 works too


def check_stale_writer_async(out: dict[str, Any]) -> None:
    assert "error" not in out, out.get("error")
    t1, t2 = out["tokens"]
    assert t2 > t1
    assert (out["a_first"], out["b"], out["a_late"]) == (1, 1, 0)
    assert out["a_unlock"] == "not owner"  # its lease ran out: it learns it here too
    assert out["final"] == {"result": "B", "writes": 0, "token": t2}


# -- SQLite (the test session's database) --------------------------------------------------
def test_a_stale_writer_is_rejected_on_sqlite():
    check_stale_writer(fencing_app.stale_writer(get_client(), get_prefix()))


def test_a_stale_async_writer_is_rejected_on_sqlite():
    client = get_client()
    check_stale_writer_async(fencing_app.stale_writer_async(
        client, lambda: async_twin(client), get_prefix()))  # the cache's server and database


@pytest.fixture
def tables() -> Iterator[None]:
    fencing_app.create_tables()
    yield
    fencing_app.drop_tables()


def test_one_update_statement_with_the_token_condition(tables):
    pk = Job.objects.create(name="q").pk
    with CaptureQueriesContext(connection) as queries:
        assert fenced_update(Job.objects.filter(pk=pk), 7, result="x") == 1
    assert len(queries) == 1
    sql = queries[0]["sql"]
    assert sql.startswith("UPDATE") and '"fence_token" <= 7' in sql
    assert '"fence_token" IS NULL' in sql
    assert Job.objects.get(pk=pk).fence_token == 7


def test_equal_token_passes_older_is_refused_newer_wins(tables):
    pk = Job.objects.create(name="e", fence_token=5).pk
    qs = Job.objects.filter(pk=pk)
    assert fenced_update(qs, 4, result="older") == 0
    assert fenced_update(qs, 5, result="same") == 1
    assert fenced_update(qs, 6, result="newer") == 1
    assert fenced_update(qs, 5, result="same again") == 0
    assert Job.objects.get(pk=pk).result == "newer"


def test_only_rows_not_newer_than_the_token_are_written(tables):
    Job.objects.bulk_create([Job(name="n", fence_token=t) for t in (None, 0, 3, 5, 9)])
    assert fenced_update(Job.objects.filter(name="n"), 5, result="w") == 4
    assert sorted(Job.objects.filter(result="w").values_list("fence_token", flat=True)) == [5] * 4
    assert Job.objects.get(name="n", result="").fence_token == 9


def test_another_token_field(tables):
    pk = Versioned.objects.create(version=2).pk
    assert fenced_update(Versioned.objects.filter(pk=pk), 1, "version", label="x") == 0
    assert fenced_update(Versioned.objects.filter(pk=pk), 3, token_field="version",
                         label="y") == 1
    assert Versioned.objects.get(pk=pk).label == "y"


def test_afenced_update(tables):
    import asyncio

    pk = Job.objects.create(name="a", fence_token=2).pk

    async def main() -> tuple[int, int]:
        qs = Job.objects.filter(pk=pk)
        return (await afenced_update(qs, 1, result="old"),
                await afenced_update(qs, 3, result="new", writes=F("writes") + 1))

    assert asyncio.run(main()) == (0, 1)
    assert fencing_app.row(pk) == {"result": "new", "writes": 1, "token": 3}


@pytest.mark.parametrize(("call", "exc", "match"), [
    (lambda qs: fenced_update(qs, True, result="x"), TypeError, "token must be an int"),
    (lambda qs: fenced_update(qs, 1.0, result="x"), TypeError, "token must be an int"),
    (lambda qs: fenced_update(qs, "3", result="x"), TypeError, "token must be an int"),
    (lambda qs: fenced_update(qs, None, result="x"), TypeError, "token must be an int"),
    (lambda qs: fenced_update(qs, -1, result="x"), ValueError, "token must be between"),
    (lambda qs: fenced_update(qs, 2**63, result="x"), ValueError, "token must be between"),
    (lambda qs: fenced_update(qs, 1, "fence", result="x"), ValueError,
     "rlock_fencing.Job has no field 'fence'"),
    (lambda qs: fenced_update(qs, 1, nope="x"), ValueError, "has no field 'nope'"),
    (lambda qs: fenced_update(qs, 1, fence_token=5, result="x"), ValueError,
     "must not set the token field 'fence_token'"),
    (lambda qs: fenced_update(qs, 1), ValueError, "at least one value"),
    (lambda qs: fenced_update(qs, 1, "result", name="x"), ValueError,
     "token field rlock_fencing.Job.result must be a 64-bit integer column"),
    (lambda qs: fenced_update(qs, 1, "id", name="x"), ValueError, "must be a 64-bit integer column"),
    (lambda qs: fenced_update(qs, 1, "writes", name="x"), ValueError,  # an IntegerField
     r"token field rlock_fencing.Job.writes must be a 64-bit integer column .*not IntegerField"),
    (lambda qs: fenced_update(qs, 1, 5, name="x"), TypeError, "token_field must be"),
    (lambda qs: fenced_update([], 1, name="x"), TypeError, "needs a QuerySet"),
    (lambda qs: fenced_update(Child.objects.all(), 1, extra="x"), ValueError,
     "multi-table inheritance"),
    (lambda qs: fenced_update(Child.objects.all(), 1, "fence_token", note="x"), ValueError,
     "multi-table inheritance"),
    (lambda qs: fenced_update(qs[:1], 1, result="x"), TypeError,
     r"fenced_update cannot update a sliced QuerySet \[0:1\] of rlock_fencing.Job: filter"),
    (lambda qs: fenced_update(Job.objects.all()[2:], 1, result="x"), TypeError,
     r"fenced_update cannot update a sliced QuerySet \[2:\] of rlock_fencing.Job"),
    (lambda qs: fenced_update(qs.union(qs), 1, result="x"), TypeError,
     r"fenced_update cannot update a union\(\) of QuerySets of rlock_fencing.Job"),
    (lambda qs: fenced_update(qs.difference(qs), 1, result="x"), TypeError,
     r"fenced_update cannot update a difference\(\) of QuerySets"),
])
def test_bad_input_raises_before_any_query(tables, django_assert_num_queries, call, exc, match):
    with django_assert_num_queries(0), pytest.raises(exc, match=match):
        call(Job.objects.filter(pk=1))


class Positive(models.Model):
    """A PositiveBigIntegerField token column: 64 bits, accepted."""

    fence_token = models.PositiveBigIntegerField(null=True)
    label = models.CharField(max_length=40, default="")

    class Meta:
        app_label = "rlock_fencing"
        apps = fencing_app.registry
        db_table = "rlock_fencing_positive"


def test_a_token_from_the_clock_fits_a_positive_big_integer_column(redis_server):
    from django_rlock.engine.fenced import FencedLock

    with connection.schema_editor() as editor:
        editor.create_model(Positive)
    try:
        lock = FencedLock(redis_server.client(), "positive")
        token = lock.lock_and_get_token()
        lock.unlock()
        assert token > 2**31  # the server clock in microseconds (issue #25)
        pk = Positive.objects.create().pk
        assert fenced_update(Positive.objects.filter(pk=pk), token, label="x") == 1
        assert fenced_update(Positive.objects.filter(pk=pk), token - 1, label="old") == 0
        assert Positive.objects.get(pk=pk).fence_token == token
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(Positive)


def test_afenced_update_validates_before_any_query(tables, django_assert_num_queries):
    import asyncio

    with django_assert_num_queries(0), pytest.raises(ValueError, match="token field"):
        asyncio.run(afenced_update(Job.objects.all(), 1, fence_token=3))
    with django_assert_num_queries(0), pytest.raises(TypeError, match="fenced_update cannot"):
        asyncio.run(afenced_update(Job.objects.all()[:3], 1, result="x"))


# -- PostgreSQL (started by the test, in a subprocess of Django's own) ----------------------
@pytest.fixture(scope="module")
def pg_results(redis_server: RedisServer) -> Iterator[dict[str, Any]]:
    if postgres_bindir() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, postgres): apt-get install postgresql, "
                    "or set PG_BIN to their directory")
    with PostgresServer() as pg:
        env = {**os.environ, "RLOCK_TEST_PG_HOST": pg.socket_dir,
               "RLOCK_TEST_REDIS_SOCKET": redis_server.socket}
        proc = subprocess.run([sys.executable, "-m", "tests.django._fencing_pg"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=150)
        assert proc.returncode == 0, proc.stderr[-6000:] + pg.log()
        yield json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_stale_writer_is_rejected_on_postgresql(pg_results):
    check_stale_writer(pg_results["stale_writer"])


def test_a_stale_async_writer_is_rejected_on_postgresql(pg_results):
    check_stale_writer_async(pg_results["stale_writer_async"])


@pytest.mark.parametrize("key", ["racing_stale_first", "racing_newer_first"])
def test_overlapping_writes_on_postgresql_end_with_the_newer_holders(pg_results, key):
    out = pg_results[key]
    assert "error" not in out, out.get("error")
    t1, t2 = out["tokens"]
    assert t2 > t1
    assert out["second_waited"] >= 0.2  # it was blocked on the first one's row lock
    if key == "racing_stale_first":
        assert (out["A"], out["B"]) == (1, 1)  # A committed first, then B overwrote it
    else:
        assert (out["B"], out["A"]) == (1, 0)  # A, re-checked after B's commit, is refused
    assert out["final"] == {"result": "B", "writes": 0, "token": t2}
