"""Models and scenarios of the fencing tests (``django_rlock.fencing``).

The models live in a registry of their own (``Apps()``): nothing is added to testproject's
apps or migrations; the scenarios create and drop their tables. Each scenario returns what it
saw as a JSON-able dict: tests/django/test_fencing.py runs them on the session's SQLite, and
(through ``tests/django/_fencing_pg.py``, a subprocess) on a PostgreSQL of its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from django.apps.registry import Apps
from django.db import connections, models, transaction
from django.db.models import F

from django_rlock import LockNotOwnedError
from django_rlock.engine.fenced import AsyncFencedLock, FencedLock
from django_rlock.fencing import afenced_update, fenced_update

registry = Apps()


class Job(models.Model):
    """A row two lock holders write: who wrote it last, and with which token."""

    name = models.CharField(max_length=40)
    result = models.CharField(max_length=40, default="")
    writes = models.IntegerField(default=0)
    fence_token = models.BigIntegerField(null=True)

    class Meta:
        app_label = "rlock_fencing"
        apps = registry
        db_table = "rlock_fencing_job"


class Versioned(models.Model):
    """A token column of another name and type (for the bad-input tests)."""

    label = models.CharField(max_length=40, default="")
    version = models.BigIntegerField(default=0)

    class Meta:
        app_label = "rlock_fencing"
        apps = registry
        db_table = "rlock_fencing_versioned"


class Base(models.Model):
    fence_token = models.BigIntegerField(null=True)
    note = models.CharField(max_length=40, default="")

    class Meta:
        app_label = "rlock_fencing"
        apps = registry
        db_table = "rlock_fencing_base"


class Child(Base):
    """Multi-table inheritance: its parent's columns live in another table."""

    extra = models.CharField(max_length=40, default="")

    class Meta:
        app_label = "rlock_fencing"
        apps = registry
        db_table = "rlock_fencing_child"


MODELS = (Job, Versioned, Base, Child)


def create_tables(using: str = "default") -> None:
    drop_tables(using)
    with connections[using].schema_editor() as editor:
        for model in MODELS:
            editor.create_model(model)


def drop_tables(using: str = "default") -> None:
    conn = connections[using]
    existing = set(conn.introspection.table_names())
    with conn.schema_editor() as editor:
        for model in reversed(MODELS):
            if model._meta.db_table in existing:
                editor.delete_model(model)


def _on_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread of its own (another lock owner, its own database connection)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as exc:
            out.append(("err", exc))
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    kind, value = out[0]
    if kind == "err":
        raise value
    return value


def row(pk: int) -> dict[str, Any]:
    job = Job.objects.get(pk=pk)
    return {"result": job.result, "writes": job.writes, "token": job.fence_token}


def stale_writer(client: Any, prefix: str) -> dict[str, Any]:
    """A takes the lock with a short lease and writes; it pauses past its lease; B takes the
    lock (a larger token) and writes; A's late write must change nothing."""
    create_tables()
    try:
        lock = FencedLock(client, "job:1", prefix)
        pk = Job.objects.create(name="job 1").pk  # token NULL: older than any
        qs = Job.objects.filter(pk=pk)
        out: dict[str, Any] = {}
        t1 = _on_thread(lambda: lock.lock_and_get_token(lease_time=0.3))
        out["a_first"] = fenced_update(qs, t1, result="A", writes=F("writes") + 1)
        out["a_again"] = fenced_update(qs, t1, result="A", writes=F("writes") + 1)
        out["after_a"] = row(pk)
        t2 = lock.lock_and_get_token()  # waits out A's lease: A is "paused"
        out["tokens"] = [t1, t2]
        out["b"] = fenced_update(qs, t2, result="B", writes=F("writes") + 1)
        out["a_late"] = fenced_update(qs, t1, result="A late", writes=F("writes") + 1)
        out["a_late_other_filter"] = fenced_update(Job.objects.filter(name="job 1"), t1,
                                                   result="A late")
        out["final"] = row(pk)
        out["b_missing_row"] = fenced_update(Job.objects.filter(pk=pk + 1000), t2, result="B")
        zero = Job.objects.create(name="zero", fence_token=0).pk
        out["zero_start"] = fenced_update(Job.objects.filter(pk=zero), t2, result="B")
        lock.unlock()
        return out
    finally:
        drop_tables()


def stale_writer_async(client: Any, make_aclient: Callable[[], Any], prefix: str) -> dict[str, Any]:
    """``stale_writer`` with AsyncFencedLock and ``afenced_update``, A and B two tasks.
    ``make_aclient()`` (called in the event loop) gives the asyncio client."""
    create_tables()
    try:
        pk = Job.objects.create(name="job 2").pk

        async def main() -> dict[str, Any]:
            aclient = make_aclient()
            lock = AsyncFencedLock(aclient, "job:2", prefix, sync_client=client)
            qs = Job.objects.filter(pk=pk)
            out: dict[str, Any] = {}
            got: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            late = asyncio.Event()

            async def a() -> None:  # a task that lives on, paused past its lease
                got.set_result(await lock.lock_and_get_token(lease_time=0.3))
                await late.wait()
                out["a_late"] = await afenced_update(qs, t1, result="A late")
                try:
                    await lock.unlock()
                    out["a_unlock"] = "unlocked"
                except LockNotOwnedError:
                    out["a_unlock"] = "not owner"

            task = asyncio.create_task(a())
            t1 = await got
            out["a_first"] = await afenced_update(qs, t1, result="A")
            t2 = await lock.lock_and_get_token()
            out["tokens"] = [t1, t2]
            out["b"] = await afenced_update(qs, t2, result="B")
            late.set()
            await task
            await lock.unlock()
            await aclient.aclose()
            return out

        out = asyncio.run(main())
        out["final"] = row(pk)
        return out
    finally:
        drop_tables()


def racing_writers(client: Any, prefix: str, stale_first: bool) -> dict[str, Any]:
    """Server databases only: the two writes overlap in open transactions. The first one's
    UPDATE holds the row; the second blocks on it and, once the first commits, is checked
    against the row as committed. Whoever comes first, the row ends with B's write."""
    create_tables()
    try:
        lock = FencedLock(client, "job:3", prefix)
        pk = Job.objects.create(name="job 3").pk
        qs = Job.objects.filter(pk=pk)
        t1 = _on_thread(lambda: lock.lock_and_get_token(lease_time=0.2))
        t2 = lock.lock_and_get_token()
        lock.unlock()
        first, second = (("A", t1), ("B", t2)) if stale_first else (("B", t2), ("A", t1))
        wrote = threading.Event()
        commit = threading.Event()
        out: dict[str, Any] = {"tokens": [t1, t2]}

        def first_writer() -> None:
            with transaction.atomic():
                out[first[0]] = fenced_update(qs, first[1], result=first[0])
                wrote.set()
                commit.wait(60)
                time.sleep(0.3)  # the second writer is blocked on the row meanwhile

        def second_writer() -> None:
            wrote.wait(60)
            commit.set()
            started = time.monotonic()
            out[second[0]] = fenced_update(qs, second[1], result=second[0])
            out["second_waited"] = time.monotonic() - started

        threads = [threading.Thread(target=_closing(f)) for f in (first_writer, second_writer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        out["final"] = row(pk)
        return out
    finally:
        drop_tables()


def _closing(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        finally:
            connections.close_all()

    return run
