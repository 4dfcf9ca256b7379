"""De-dup marks are listed as the task they stand for (#23 section 7): kind ``task``, the task's
name, id and state (``queued`` after ``delay()``, ``running`` once a worker runs it), no
holder; in ``locks list`` (table and JSON) and the admin's change list.

No worker consumes these messages: ``delay()`` writes the mark exactly as in production, and
``apply(task_id=...)`` runs the task body in this process through the same ``@locked`` task
path a worker takes (``celery.run_task``: the worker's claim of the mark). The queue is purged
after each test, so no later worker runs them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from tests.celery.conftest import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def purged(celery_app: Any, locks: Any) -> Iterator[None]:
    yield
    celery_app.control.purge()


def listed(*args: str) -> str:
    out = StringIO()
    call_command("locks", "list", *args, stdout=out)
    return out.getvalue()


def marks() -> list[dict[str, Any]]:
    return [m for m in json.loads(listed("--format", "json")) if m["kind"] == "task"]


def test_a_queued_then_running_mark_is_listed_as_its_task(purged: None, admin_client: Any) -> None:
    from tests.celery.tasks import deduped

    queued = deduped.delay(4242, hold=3.0)
    [mark] = marks()
    assert mark["name"].startswith("dedupe:tests.celery.tasks.deduped:")
    assert (mark["task"], mark["task_id"], mark["state"]) == (
        "tests.celery.tasks.deduped", queued.id, "queued")
    assert mark["holders"] == []  # not a lock held by the process that enqueued it
    assert mark["by"]["pid"] is not None and mark["ttl"] > 0
    table = listed()
    row = next(line for line in table.splitlines() if line.startswith("dedupe:"))
    assert row.split()[1] == "task"
    assert f"queued tests.celery.tasks.deduped [{queued.id}]" in row

    page = admin_client.get("/admin/django_rlock/lock/").content.decode()
    assert '<td class="kind">task</td>' in page
    assert f"queued tests.celery.tasks.deduped [{queued.id}]" in page
    assert f'title="{mark["name"]}"' in page  # the truncated name in full, as a tooltip

    detail = admin_client.get(f"/admin/django_rlock/lock/{mark['name']}/show/").content.decode()
    assert f'<td class="task-id"><code>{queued.id}</code></td>' in detail
    assert '<td class="state">queued' in detail and "Enqueued by" in detail
    show = StringIO()
    call_command("locks", "show", mark["name"], stdout=show)
    assert f"task id: {queued.id}" in show.getvalue() and "state: queued" in show.getvalue()

    # The worker's claim (same task id) turns it into a running task.
    runner = threading.Thread(target=lambda: deduped.apply((4242,), {"hold": 3.0},
                                                           task_id=queued.id))
    runner.start()
    try:
        running = wait_for(lambda: [m for m in marks() if m["state"] == "running"])
        assert [(m["task_id"], m["task"]) for m in running] == [
            (queued.id, "tests.celery.tasks.deduped")]
        page = admin_client.get("/admin/django_rlock/lock/").content.decode()
        assert f"running tests.celery.tasks.deduped [{queued.id}]" in page
    finally:
        runner.join(timeout=30)
    assert marks() == []  # finished: the mark is gone
    queued.backend.remove_pending_result(queued)  # no worker will answer: stop listening now
