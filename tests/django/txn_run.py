"""Runs transaction scenarios against PostgreSQL; prints their results as JSON on the last line.

``python -m tests.django.txn_run '[[key, scenario, {kwargs}], ...]'``, started once by
``tests/django/test_transactions_postgres.py`` with ``RLOCK_TEST_PG_HOST`` (the socket dir of
its PostgreSQL) and ``RLOCK_TEST_REDIS`` set. A subprocess, because the main test session's
Django is already configured for SQLite.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.txn_settings"

import django

django.setup()

from django.db import connection, connections, transaction  # noqa: E402
from django.test import Client  # noqa: E402

from django_rlock import get_lock  # noqa: E402
from django_rlock.connection import get_client  # noqa: E402
from django_rlock.engine.watchdog import watchdog  # noqa: E402
from tests.django import txn_app  # noqa: E402
from tests.django.txn_app import Counter  # noqa: E402

SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {}


def scenario(func: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    SCENARIOS[func.__name__] = func
    return func


def value() -> int:
    return Counter.objects.get(pk=1).value


def in_threads(n: int, job: Callable[[], Any]) -> list[Any]:
    """``job`` on ``n`` threads started together, each with its own database connections."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = job()
        except Exception as exc:
            out[i] = f"{type(exc).__name__}: {exc}"
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def lock_state(name: str) -> dict[str, Any]:
    lock = get_lock(name)
    return {"locked": lock.is_locked(), "renewing": watchdog().renewing()}


@scenario
def concurrent_views(n: int, url: str) -> dict[str, Any]:
    """``n`` concurrent requests to an ``ATOMIC_REQUESTS`` view, through Django's test client."""
    started = time.monotonic()
    statuses = in_threads(n, lambda: Client().get(url).status_code)
    return {"statuses": statuses, "final": value(), "seconds": time.monotonic() - started,
            "after": lock_state("counter")}


@scenario
def concurrent_atomic(n: int, at_return: bool) -> dict[str, Any]:
    """``n`` threads each running ``transaction.atomic()`` around a ``@locked`` function."""
    bump = txn_app.bump_at_return if at_return else txn_app.bump

    def job() -> int:
        with transaction.atomic():
            return bump()

    results = in_threads(n, job)
    return {"results": results, "final": value(), "after": lock_state("counter")}


@scenario
def commit() -> dict[str, Any]:
    """Held after the call until the commit; the next holder sees the committed row."""
    out: dict[str, Any] = {}
    seen_by_next: list[Any] = []

    def next_holder() -> None:  # another thread and connection, blocked on the lock
        with get_lock("work:c"):
            seen_by_next.append(value())
        connections.close_all()

    with transaction.atomic():
        out["held_by_call"] = txn_app.work("c")
        waiter = threading.Thread(target=next_holder)
        waiter.start()
        time.sleep(0.3)
        out["inside"] = lock_state("work:c")
        out["waiter_blocked"] = waiter.is_alive()
    waiter.join(10)
    out["after"] = lock_state("work:c")
    out["seen_by_next"] = seen_by_next
    return out


@scenario
def rollback() -> dict[str, Any]:
    """A rollback releases the lock at once, and nothing renews it afterwards."""
    out: dict[str, Any] = {}
    try:
        with transaction.atomic():
            txn_app.work("r")
            out["inside"] = lock_state("work:r")
            raise KeyError("roll back")
    except KeyError:
        pass
    out["after"] = lock_state("work:r")
    time.sleep(1.5)  # 1.5 watchdog timeouts: a hold renewed by mistake would still be there
    out["later"] = lock_state("work:r")
    out["value"] = value()  # the write was rolled back
    return out


@scenario
def call_raises() -> dict[str, Any]:
    """The call raises inside the transaction; the caller catches and commits its writes."""
    out: dict[str, Any] = {}
    with transaction.atomic():
        try:
            txn_app.work("e", fail=True)
        except ValueError:
            pass
        out["inside"] = lock_state("work:e")
    out["after"] = lock_state("work:e")
    out["value"] = value()  # committed, although the call raised
    return out


@scenario
def savepoints() -> dict[str, Any]:
    """A rolled-back savepoint that contained the call releases; a released one does not."""
    out: dict[str, Any] = {}
    with transaction.atomic():
        try:
            with transaction.atomic():
                txn_app.work("s1")
                out["inside_savepoint"] = lock_state("work:s1")
                raise KeyError("roll back the savepoint")
        except KeyError:
            pass
        out["after_savepoint_rollback"] = lock_state("work:s1")
        with transaction.atomic():
            txn_app.work("s2")
        out["after_savepoint_release"] = lock_state("work:s2")
        out["outer_still_open"] = connection.in_atomic_block
    out["after_commit"] = lock_state("work:s2")
    out["value"] = value()
    return out


@scenario
def two_databases() -> dict[str, Any]:
    """Transactions open on two databases: released when the last of them ends."""
    out: dict[str, Any] = {}
    with transaction.atomic(using="default"):
        with transaction.atomic(using="other"):
            connections["other"].cursor().execute("SELECT 1")
            txn_app.work("m")
        out["after_other_commit"] = lock_state("work:m")
    out["after_default_commit"] = lock_state("work:m")
    with transaction.atomic(using="other"):
        with transaction.atomic(using="default"):
            txn_app.work("n")
        out["after_default_commit_2"] = lock_state("work:n")
        transaction.set_rollback(True, using="other")
    out["after_other_rollback"] = lock_state("work:n")
    return out


@scenario
def callbacks(fail_first: bool) -> dict[str, Any]:
    """Release comes before the call's own on_commit callbacks; and happens even when an
    earlier callback raised and Django skipped ours (the request_finished safety net)."""
    url = "/callbacks/?fail_first=1" if fail_first else "/callbacks/"
    txn_app.seen.clear()
    out: dict[str, Any] = {}
    try:
        response = Client().get(url)
        out["status"] = response.status_code
    except RuntimeError as exc:
        out["raised"] = str(exc)
        # The traceback still holds Django's list of the skipped callbacks (ours among them).
        out["traceback_alive"] = exc.__traceback__ is not None
        out["after"] = lock_state("work:cb")
    else:
        out["after"] = lock_state("work:cb")
    out["seen"] = dict(txn_app.seen)
    return out


def run(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """One scenario on a fresh table and an empty lock database; an error is returned."""
    try:
        txn_app.create_schema()
        get_client().flushdb()
        return SCENARIOS[name](**kwargs)
    except Exception:
        return {"error": traceback.format_exc()}
    finally:
        connections.close_all()


def main() -> None:
    """argv[1]: JSON ``[[key, scenario, kwargs], ...]``; prints ``{key: result}``."""
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = 'other'")
        if cur.fetchone() is None:
            cur.execute("CREATE DATABASE other")
    results = {key: run(name, kwargs) for key, name, kwargs in json.loads(sys.argv[1])}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
