"""Fencing in the database: a model write that a stale lock holder cannot make.

A lock's lease can run out while its holder is paused (GC, swap, a stalled network); the next
holder goes ahead, and the paused one wakes up and writes over its work. A ``FencedLock``
hands every acquire a token larger than all before it; the row keeps the token of its last
write, and ``fenced_update`` writes only where that token is not newer than the caller's::

    token = lock.lock_and_get_token()
    try:
        done = fenced_update(Job.objects.filter(pk=job_id), token, status="done")
        if not done:
            ...  # a newer holder has written this row: our lease ran out, stop
    finally:
        lock.unlock()

The check and the write are one ``UPDATE ... SET <values>, <token_field> = <token> WHERE
<filter> AND (<token_field> <= <token> OR <token_field> IS NULL)``, so the database settles a
race between the two writers (its row lock serialises them), not Python.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Q

#: Redis INCR's ceiling, and a BigIntegerField's. Tokens start from the server clock in
#: microseconds (about 1.7e15 today, 2**53 in the year 2255): far below it.
MAX_TOKEN = 2**63 - 1


def _fenced(queryset: models.QuerySet[Any], token: Any, token_field: str,
            values: dict[str, Any]) -> tuple[models.QuerySet[Any], dict[str, Any]]:
    """Validate (before any query) and build the conditional queryset and its SET values."""
    if not isinstance(queryset, models.QuerySet):
        raise TypeError(f"fenced_update needs a QuerySet, not {type(queryset).__name__}")
    query = queryset.query
    if query.is_sliced or query.combinator:
        # The UPDATE needs a WHERE over one table: SQL has no UPDATE of a LIMIT or a UNION.
        # (Never repr() the queryset here: that would run it.)
        what = (f"a {query.combinator}() of QuerySets" if query.combinator
                else f"a sliced QuerySet [{query.low_mark}:{query.high_mark or ''}]")
        raise TypeError(f"fenced_update cannot update {what} of {queryset.model._meta.label}: "
                        f"filter the rows instead (e.g. .filter(pk__in=...))")
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int (from lock_and_get_token), not "
                        f"{type(token).__name__} ({token!r})")
    if not 0 <= token <= MAX_TOKEN:
        raise ValueError(f"token must be between 0 and {MAX_TOKEN}, got {token}")
    if not isinstance(token_field, str):
        raise TypeError(f"token_field must be a field name (str), not {type(token_field).__name__}")
    if token_field in values:
        raise ValueError(f"the values must not set the token field {token_field!r}: "
                         f"fenced_update writes the token there itself")
    if not values:
        raise ValueError("fenced_update needs at least one value to write")
    meta = queryset.model._meta
    table = meta.concrete_model
    for name in (token_field, *values):
        try:
            field = meta.get_field(name)
        except FieldDoesNotExist:
            raise ValueError(f"{meta.label} has no field {name!r}") from None
        if not field.concrete or field.many_to_many or field.one_to_many:
            raise ValueError(f"{meta.label}.{name} is not a column fenced_update can write")
        if field.model._meta.concrete_model is not table:
            # Django would write an inherited parent's table in a second UPDATE after reading
            # the matching ids: the check and that write would no longer be one statement.
            raise ValueError(f"{meta.label}.{name} lives in the table of "
                             f"{field.model._meta.label} (multi-table inheritance): "
                             f"fenced_update writes {meta.label}'s table only")
        if name == token_field and (not isinstance(field, models.BigIntegerField)
                                    or field.primary_key):
            # Tokens start from the Redis server's clock in microseconds (about 1.7e15): an
            # IntegerField would overflow (or, on SQLite, work until the project moves).
            raise ValueError(f"the token field {meta.label}.{name} must be a 64-bit integer "
                             f"column (BigIntegerField or PositiveBigIntegerField, not a primary "
                             f"key: tokens are about 1.7e15), not {type(field).__name__}")
    not_newer = Q(**{f"{token_field}__lte": token}) | Q(**{f"{token_field}__isnull": True})
    return queryset.filter(not_newer), {**values, token_field: token}


def fenced_update(queryset: models.QuerySet[Any], token: int, token_field: str = "fence_token",
                  **values: Any) -> int:
    """``queryset.update(**values)`` only where the row's token is not newer than ``token``.

    Writes ``token`` into ``token_field`` with the values, in one UPDATE; returns the number
    of rows written. 0 for a row that matched means a newer holder wrote it: the caller's
    lease ran out (or its token is otherwise stale) and it must not go on as the holder.

    Equal tokens pass: a holder may write the same rows as often as it likes with its token
    (and only it has that token: every acquire gets a new one). A NULL token column counts as
    older than any token, so new rows can start with NULL (or 0: tokens are positive). The
    column must be a ``BigIntegerField(null=True)`` (or ``PositiveBigIntegerField``): tokens
    are about 1.7e15 (they start from the Redis server's clock in microseconds, so they keep
    growing after Redis loses the counter), and any other field raises ValueError. The token
    field must be a column of the queryset's own table, as must every value (no
    multi-table-inherited parents' fields), and the queryset a plain filter: not sliced, not
    a ``union()`` / ``intersection()`` / ``difference()`` (TypeError).
    Bad input raises TypeError/ValueError before any query.
    """
    qs, sets = _fenced(queryset, token, token_field, values)
    return qs.update(**sets)


async def afenced_update(queryset: models.QuerySet[Any], token: int,
                         token_field: str = "fence_token", **values: Any) -> int:
    """``fenced_update`` for async code (``QuerySet.aupdate``)."""
    qs, sets = _fenced(queryset, token, token_field, values)
    return await qs.aupdate(**sets)
