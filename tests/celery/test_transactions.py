"""A ``@locked`` task run inside a database transaction keeps its lock (and de-dup mark) until
that transaction ends, like any ``@locked`` call.

Tasks run with ``apply()`` on this thread, inside the test's ``transaction.atomic()``: the
path of an eager task called from a view under ``ATOMIC_REQUESTS``, or of a task body wrapped
in ``transaction.atomic`` outside its ``@locked``. SQLite is enough: no concurrency here.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.db import transaction

from django_rlock import locked

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def tasks(celery_app: Any) -> SimpleNamespace:
    from django_rlock.celery import LockedTask

    @celery_app.task(bind=True, name="rlock_tests.txn_write")
    @locked("txn:{key}")
    def write(self: Any, key: str) -> bool:
        return self.request.id is not None

    @celery_app.task(bind=True, name="rlock_tests.txn_write_at_return")
    @locked("txn:{key}", until_commit=False)
    def write_at_return(self: Any, key: str) -> bool:
        return True

    @celery_app.task(bind=True, base=LockedTask, name="rlock_tests.txn_deduped")
    @locked("txnd:{key}", dedupe=True)
    def deduped(self: Any, key: str) -> bool:
        return True

    return SimpleNamespace(write=write, write_at_return=write_at_return, deduped=deduped)


def test_task_in_a_transaction_keeps_its_lock_until_the_commit(tasks, locks):
    with transaction.atomic():
        assert tasks.write.apply(("a",)).get() is True
        assert locks.exists("ct:rlock:txn:a")
    assert not locks.exists("ct:rlock:txn:a")


def test_rolled_back_transaction_releases_the_tasks_lock(tasks, locks):
    with pytest.raises(KeyError):
        with transaction.atomic():
            tasks.write.apply(("b",))
            assert locks.exists("ct:rlock:txn:b")
            raise KeyError("roll back")
    assert not locks.exists("ct:rlock:txn:b")


def test_until_commit_false_task_releases_at_return(tasks, locks):
    with transaction.atomic():
        assert tasks.write_at_return.apply(("c",)).get() is True
        assert not locks.exists("ct:rlock:txn:c")


def test_dedupe_mark_is_released_with_the_transaction(tasks, locks):
    from django_rlock.celery import dedupe_name

    mark = "ct:rlock:" + dedupe_name(tasks.deduped, ("d",))
    with transaction.atomic():
        assert tasks.deduped.apply(("d",)).get() is True
        assert locks.exists(mark) and locks.exists("ct:rlock:txnd:d")
    assert not locks.exists(mark) and not locks.exists("ct:rlock:txnd:d")


def test_no_transaction_releases_when_the_task_returns(tasks, locks):
    assert tasks.write.apply(("e",)).get() is True
    assert not locks.exists("ct:rlock:txn:e")
