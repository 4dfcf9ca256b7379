"""``until_commit`` and ``django_rlock.transaction`` on the test session's SQLite.

Concurrency and lost updates need a server database: see test_transactions_postgres.py. These
cover the API, the opt-out, and the safety net for a commit callback that outlives its
transaction (its release must still happen, and only on the owner thread).
"""

from __future__ import annotations

import logging
import os
import threading

import pytest
from django.db import connection, transaction

from django_rlock import get_lock, locked
from django_rlock.transaction import (
    TransactionRelease,
    hold_until_commit,
    open_transactions,
    release_ended,
)

KEY = "demo:rlock:"


@locked("t:{n}")
def call(n: int) -> bool:
    return get_lock(f"t:{n}").is_held_by_current_thread()


@locked("t:{n}", until_commit=False)
def call_at_return(n: int) -> bool:
    return get_lock(f"t:{n}").is_held_by_current_thread()


pytestmark = pytest.mark.django_db(transaction=True)


def test_no_transaction_releases_at_return(db1):
    assert open_transactions() == []
    assert call(1) is True
    assert not db1.exists(KEY + "t:1")


def test_held_until_commit_and_logged(db1, caplog):
    caplog.set_level(logging.DEBUG, logger="django_rlock")
    with transaction.atomic():
        assert open_transactions() == ["default"]
        call(2)
        assert db1.exists(KEY + "t:2")
    assert not db1.exists(KEY + "t:2")
    assert any("'t:2' is released when the transaction on 'default' ends" in r.getMessage()
               for r in caplog.records)


def test_until_commit_false_releases_at_return(db1):
    with transaction.atomic():
        call_at_return(3)
        assert not db1.exists(KEY + "t:3")


def test_reentrant_calls_in_one_transaction_release_every_hold(db1):
    with transaction.atomic():
        call(4)
        call(4)
        assert get_lock("t:4").hold_count() == 2  # each call's hold waits for the commit
    assert not db1.exists(KEY + "t:4")


def test_hold_until_commit_context_manager(db1):
    with hold_until_commit(get_lock("cm")) as lock:
        assert lock.is_held_by_current_thread()
    assert not db1.exists(KEY + "cm")  # no transaction: released on exit
    with transaction.atomic():
        with hold_until_commit(get_lock("cm")):
            pass
        assert db1.exists(KEY + "cm")
    assert not db1.exists(KEY + "cm")


def test_transaction_release_api():
    released: list[str] = []
    outside = TransactionRelease(lambda: released.append("outside"), "o")
    assert outside.waiting_for == [] and outside.done() is False and released == ["outside"]
    with transaction.atomic():
        inside = TransactionRelease(lambda: released.append("inside"), "i")
        assert inside.waiting_for == ["default"]
        assert inside.done() is True and released == ["outside"]
    assert released == ["outside", "inside"]
    try:
        with transaction.atomic():
            TransactionRelease(lambda: released.append("rolled back"), "r").done()
            raise KeyError
    except KeyError:
        pass
    assert released[-1] == "rolled back"


def test_release_waits_for_done_even_if_the_transaction_ends_first():
    # The callback is dropped before the protected code is over (here its savepoint rolls
    # back first): the release happens at done(), never in the middle of that code.
    released: list[bool] = []
    with transaction.atomic():
        try:
            with transaction.atomic():
                pending = TransactionRelease(lambda: released.append(True), "x")
                raise KeyError
        except KeyError:
            pass
        assert pending.waiting_for == [] and released == []
        assert pending.done() is False and released == [True]


def _outliving_callback(name: str) -> list[object]:
    """A locked call whose commit callback survives its rolled-back transaction (as when a
    traceback keeps Django's list alive); returns the references that keep it."""
    keep: list[object] = []
    with transaction.atomic():
        call(name)
        keep.extend(func for _, func, _ in connection.run_on_commit)
        transaction.set_rollback(True)
    return keep


def test_callback_freed_on_another_thread_is_released_by_the_owner(db1):
    keep = _outliving_callback(5)
    assert db1.exists(KEY + "t:5")  # the transaction is over, but nothing has told us yet
    other = threading.Thread(target=keep.clear)  # the finalizer runs on that thread...
    other.start()
    other.join()
    assert db1.exists(KEY + "t:5")  # ...which cannot unlock the owner's hold
    assert release_ended() == 1
    assert not db1.exists(KEY + "t:5")


def test_next_locked_call_releases_what_an_ended_transaction_left(db1):
    keep = _outliving_callback(6)
    assert db1.exists(KEY + "t:6")
    call(7)
    assert not db1.exists(KEY + "t:6") and not db1.exists(KEY + "t:7")
    del keep


def test_forked_child_never_releases_its_parents_locks(db1):
    keep = _outliving_callback(9)
    pid = os.fork()
    if pid == 0:  # the child: a new owner, with nothing of the parent's to release
        code = 0 if release_ended() == 0 else 1
        keep.clear()  # frees the callback here: still nothing to release
        os._exit(code if db1.exists(KEY + "t:9") else 2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db1.exists(KEY + "t:9")
    assert release_ended() == 1 and not db1.exists(KEY + "t:9")


@pytest.mark.django_db(transaction=False)
def test_testcase_transaction_holds_until_callbacks_run(db1, django_capture_on_commit_callbacks):
    # A TestCase-style test runs inside a transaction that never commits: the lock is held
    # until its callbacks run (captureOnCommitCallbacks(execute=True)) or the test ends.
    with django_capture_on_commit_callbacks(execute=True):
        call(8)
        assert db1.exists(KEY + "t:8")
    assert not db1.exists(KEY + "t:8")
