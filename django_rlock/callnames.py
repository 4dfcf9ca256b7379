"""A lock name from a call: the fields a ``@locked`` template uses, checked when decorating,
and the values each call gives them.

Planned once per decorated function (``template_picks``, ``call_fits``) so that a call's name
costs a few dict lookups; ``bound_arguments`` is the general way (``Signature.bind``), which
the planned way must agree with, names and errors alike.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Collection, Sequence
from typing import Any


def template_fields(template: str) -> list[str]:
    """The root names a template uses: ``"r:{request.user.pk}"`` -> ``["request"]``."""
    roots = []
    for _, field, _, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        if conversion not in (None, "r", "s", "a"):  # else every call would fail
            raise ValueError(f"lock template {template!r} converts {{{field}}} with "
                             f"!{conversion}; the conversions are !s, !r and !a")
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(f"lock template {template!r} uses a positional field {{{field}}}; "
                             f"name the argument instead, e.g. {{pk}}")
        roots.append(root)
    return roots


#: A value no call passes (``LockSpec.name_builder``'s "not given").
MISSING: Any = object()


def template_picks(fields: Sequence[str],
                   sig: inspect.Signature) -> list[tuple[str, int | None, Any]] | None:
    """How to pick each root a template uses straight from a call: ``(name, position or None,
    default or MISSING)``; None if some root cannot be picked so (positional-only, ``*args``
    or ``**kwargs`` itself), and ``Signature.bind`` must do it."""
    params = list(sig.parameters.values())
    picks = []
    for field in dict.fromkeys(fields):
        param = sig.parameters.get(field)
        if param is None:  # only through **kwargs (check_signature saw to that)
            picks.append((field, None, MISSING))
        elif param.kind is param.POSITIONAL_OR_KEYWORD:
            picks.append((field, params.index(param),
                          MISSING if param.default is param.empty else param.default))
        elif param.kind is param.KEYWORD_ONLY:
            picks.append((field, None, MISSING if param.default is param.empty else param.default))
        else:
            return None
    return picks


def call_fits(sig: inspect.Signature) -> Callable[[tuple[Any, ...], dict[str, Any]], bool]:
    """A quick check, planned once, that a call binds to ``sig`` (too many positional
    arguments, an unknown or doubled keyword, a required one missing): a call that does not
    is refused with ``Signature.bind``'s error before any Redis command, as the slow path
    does (bad input never takes a lock)."""
    params = list(sig.parameters.values())
    kinds = {p.kind for p in params}
    var_pos = inspect.Parameter.VAR_POSITIONAL in kinds
    var_kw = inspect.Parameter.VAR_KEYWORD in kinds
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_keyword = {p.name: i for i, p in enumerate(positional)
                  if p.kind is p.POSITIONAL_OR_KEYWORD}
    by_keyword.update({p.name: -1 for p in params if p.kind is p.KEYWORD_ONLY})
    required = [(i, p.name if p.kind is p.POSITIONAL_OR_KEYWORD else None)
                for i, p in enumerate(positional) if p.default is p.empty]
    required_kw = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    most = len(positional)

    def fits(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        n = len(args)
        if n > most and not var_pos:
            return False
        for key in kwargs:
            at = by_keyword.get(key)
            if at is None:
                if not var_kw:
                    return False
            elif 0 <= at < n:
                return False  # given twice
        for i, name in required:
            if i >= n and (name is None or name not in kwargs):
                return False
        return all(name in kwargs for name in required_kw)

    return fits


def bound_arguments(sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any],
                    keep: Collection[str] = ()) -> dict[str, Any]:
    """The call's arguments by name, defaults applied, ``**kwargs`` flattened in. ``keep``:
    template roots; a ``**kwargs`` parameter named among them is also there whole, as the dict
    (``"kw:{opts[mode]}"``), over a keyword of the same name."""
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            extra = values.pop(p.name, {})
            values.update(extra)
            if p.name in keep:
                values[p.name] = extra
    return values


__all__ = ["MISSING", "bound_arguments", "call_fits", "template_fields", "template_picks"]
