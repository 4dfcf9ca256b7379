"""Waiters in ``manage.py locks`` (list's WAITING, show's waiters, JSON ``waiters``) and the
admin (the change list's count, the detail page's table)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_rlock import get_lock
from django_rlock.engine import RLock

pytestmark = pytest.mark.django_db


def run(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("locks", *args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def wait_for_report(got: list[bool]) -> None:
    lock = get_lock("report")
    if lock.try_lock(30):
        got.append(True)
        lock.unlock()


@pytest.fixture
def waiting(hold: Callable[..., RLock], holders: Callable[[], Any]
            ) -> Iterator[tuple[Any, RLock, threading.Thread]]:
    """``report`` held (by a holder thread), and a thread named ``report-waiter`` waiting for
    it (listed); ``idle`` held with nobody waiting."""
    h = holders()
    held = get_lock("report")
    h.call(held.lock)
    hold(get_lock("idle"))
    got: list[bool] = []
    waiter = threading.Thread(target=wait_for_report, args=(got,), name="report-waiter",
                              daemon=True)
    waiter.start()
    end = time.monotonic() + 15
    while "waiting: 1" not in run("show", "report"):
        assert time.monotonic() < end, "the waiter was never listed"
        time.sleep(0.02)
    yield h, held, waiter
    if waiter.is_alive():
        h.call(held.unlock)
    waiter.join(30)


def test_locks_list_counts_the_waiters(waiting: Any) -> None:
    out = run("list")
    header, *rows = out.splitlines()[:-1]
    at = header.index("WAITING")
    cells = {row.split()[0]: row[at:].split()[0] for row in rows}
    assert cells == {"idle": "0", "report": "1"}


def test_locks_show_lists_each_waiter(waiting: Any) -> None:
    out = run("show", "report")
    assert "waiting: 1" in out
    lines = dict(line.split(":", 1) for line in out.split("waiting: 1", 1)[1].splitlines()
                 if ":" in line and not line.startswith(" " * 3))
    lines = {k.strip(): v.strip() for k, v in lines.items()}
    assert lines["thread"] == "report-waiter"
    assert lines["pid"] == str(os.getpid()) and lines["host"] == socket.gethostname()
    assert lines["since"].endswith("+00:00") and lines["waiting for"].endswith("s")


def test_json_gives_waiters_with_the_holder_keys_and_waiting_for(waiting: Any) -> None:
    listed = {d["name"]: d for d in json.loads(run("list", format="json"))}
    assert listed["idle"]["waiters"] == []
    [w] = listed["report"]["waiters"]
    holder_keys = set(listed["report"]["holders"][0])
    assert holder_keys <= set(w) and {"waiting_for", "since"} <= set(w)
    assert (w["thread"], w["pid"], w["host"]) == ("report-waiter", os.getpid(),
                                                   socket.gethostname())
    assert 0 <= w["waiting_for"] < 30
    shown = json.loads(run("show", "report", format="json"))
    assert [x["thread"] for x in shown["waiters"]] == ["report-waiter"]


def test_admin_shows_the_count_and_the_waiters(waiting: Any, admin_client: Client) -> None:
    h, held, waiter = waiting
    html = admin_client.get(reverse("admin:django_rlock_lock_changelist")).content.decode()
    assert ">Waiting<" in html
    assert html.count('<td class="waiting">1</td>') == 1
    assert html.count('<td class="waiting">0</td>') == 1
    detail = reverse("admin:django_rlock_lock_detail", args=["report"])
    page = admin_client.get(detail).content.decode()
    assert "Waiting (1)" in page
    assert '<td class="thread">report-waiter</td>' in page
    assert f'<td class="pid">{os.getpid()}</td>' in page
    # it acquires (and lets go): listed nowhere any more
    h.call(held.unlock)
    waiter.join(30)
    assert not waiter.is_alive()
    html = admin_client.get(reverse("admin:django_rlock_lock_changelist")).content.decode()
    assert '<td class="waiting">1</td>' not in html
    assert "Nobody is waiting." in admin_client.get(
        reverse("admin:django_rlock_lock_detail", args=["idle"])).content.decode()
