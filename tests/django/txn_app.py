"""Model, locked functions and views of the PostgreSQL transaction scenarios.

``Counter`` row 1 is read, incremented in Python and saved: a read-modify-write that loses
updates unless the lock keeps the next reader out until the previous write is committed. A
deferred constraint trigger sleeps at COMMIT (``slow_commit``), so "released before the
commit" leaves a wide, reliable window instead of a microsecond race.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, models, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

from django_rlock import get_lock, locked

COMMIT_DELAY = 0.05  # seconds the trigger sleeps at each COMMIT that updated the counter


class Counter(models.Model):
    value = models.IntegerField(default=0)

    class Meta:
        app_label = "demo"


def create_schema() -> None:
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS demo_counter CASCADE")
        cur.execute("DROP FUNCTION IF EXISTS slow_commit() CASCADE")
    with connection.schema_editor() as editor:
        editor.create_model(Counter)
    with connection.cursor() as cur:
        cur.execute(f"""
            CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep({COMMIT_DELAY}); RETURN NULL; END $$""")
        cur.execute("""
            CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON demo_counter
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()""")
    Counter.objects.create(pk=1, value=0)


def read_modify_write() -> int:
    row = Counter.objects.get(pk=1)
    row.value += 1
    row.save(update_fields=["value"])
    return row.value


@locked("counter", wait=60)
def bump() -> int:
    return read_modify_write()


@locked("counter", wait=60, until_commit=False)
def bump_at_return() -> int:
    return read_modify_write()


@locked("work:{name}")
def work(name: str, fail: bool = False) -> bool:
    """Writes a row, then maybe fails: the caller decides what its transaction does."""
    read_modify_write()
    if fail:
        raise ValueError("work failed on purpose")
    return get_lock(f"work:{name}").is_held_by_current_thread()


@locked("counter", wait=60)
def bump_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(read_modify_write()))


@locked("counter", wait=60, until_commit=False)
def bump_view_at_return(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(read_modify_write()))


seen: dict[str, Any] = {}


def callbacks_view(request: HttpRequest) -> HttpResponse:
    """An on_commit callback registered before the locked call, and one registered inside it."""
    if request.GET.get("fail_first"):
        transaction.on_commit(_fail)
    work_with_callback("cb")
    return HttpResponse("ok")


@locked("work:{name}")
def work_with_callback(name: str) -> None:
    read_modify_write()
    # e.g. enqueueing a task that takes the same lock: it must find it free.
    transaction.on_commit(lambda: seen.update(free_in_callback=not get_lock(f"work:{name}")
                                              .is_locked()))


def _fail() -> None:
    raise RuntimeError("an on_commit callback failed")


urlpatterns = [
    path("bump/", bump_view),
    path("bump-at-return/", bump_view_at_return),
    path("callbacks/", callbacks_view),
]
