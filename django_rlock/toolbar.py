"""A Django Debug Toolbar panel: the locks this request took, with wait, hold and outcome.

    DEBUG_TOOLBAR_PANELS = [..., "django_rlock.toolbar.LocksPanel"]   # pip install
                                                                      # django-debug-toolbar

Fed by ``engine.events`` (``wait_started``, ``wait_ended``, ``refused``, ``acquired``,
``released``, ``lost``) while the toolbar instruments a request: nothing is listened to until
the panel is first enabled, and then a lock event outside an instrumented request costs one
context-variable read. Each row: the lock's name, label and kind, its outcome (``acquired``,
``busy``: a one-shot try refused, ``timeout``, ``error``), the wait, whether a release handed
it over, and how long it was held (or ``held`` if the response went out first).
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from debug_toolbar.panels import Panel
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .engine import events

HoldKey = tuple[str, str]

#: The panel of the request being instrumented on this thread (or task).
_current: contextvars.ContextVar[LocksPanel | None] = contextvars.ContextVar(
    "django_rlock_toolbar_panel", default=None)
#: Waits and holds of instrumented requests, by (key, owner): a grant is booked on the
#: releasing thread, a release may run elsewhere; both find the waiter's panel here.
_waiting: dict[HoldKey, LocksPanel] = {}
_holding: dict[HoldKey, LocksPanel] = {}
_listening = threading.Lock()
_installed = False


def _row(data: dict[str, Any], outcome: str) -> dict[str, Any]:
    return {"name": data["name"], "label": data.get("label") or "", "kind": data.get("kind") or "",
            "outcome": outcome, "wait_ms": round(data.get("wait", 0.0) * 1000, 3),
            "handed_over": False, "held_ms": None, "end": "held" if outcome == "acquired" else ""}


def listen(event: str, data: dict[str, Any]) -> None:
    """The engine listener: routes a lock event to the panel of the request it belongs to."""
    if event not in _ROUTED:
        return
    panel = _current.get()
    k = (data["key"], data.get("owner") or "")
    if event == "wait_started":
        if panel is not None and k[1]:
            _waiting[k] = panel
    elif event == "acquired":
        panel = _waiting.get(k) or panel
        if panel is not None:
            row = _row(data, "acquired")
            panel.rows.append(row)
            panel.holds[k] = row
            _holding[k] = panel
    elif event == "wait_ended":
        panel = _waiting.pop(k, None) or panel
        if panel is None:
            return
        row = panel.holds.get(k) if data["outcome"] == "acquired" else None
        if row is None:
            panel.rows.append(row := _row(data, data["outcome"]))
        row.update(kind=data.get("kind") or "", handed_over=bool(data["handed_over"]),
                   wait_ms=round(data["wait"] * 1000, 3))
    elif event == "refused":
        if panel is not None:
            panel.rows.append(_row(data, "busy"))
    elif event == "busy":
        # A @locked call turned away: its acquire has its row (refused, or a wait that timed
        # out); a kind that sent neither gets its row here.
        last = panel.rows[-1] if panel is not None and panel.rows else None
        if panel is not None and (last is None or last["name"] != data["name"]
                                  or last["outcome"] == "acquired"):
            panel.rows.append(_row(data, "busy"))
    else:  # released, lost
        panel = _holding.pop(k, None)
        row = None if panel is None else panel.holds.pop(k, None)
        if row is not None:
            row["held_ms"] = round(data.get("held", 0.0) * 1000, 3)
            row["end"] = "released" if event == "released" else f"lost ({data.get('how')})"


_ROUTED = frozenset({"wait_started", "wait_ended", "refused", "busy", "acquired", "released",
                     "lost"})


def _install() -> None:
    global _installed
    with _listening:
        if not _installed:
            events.add_listener(listen)
            _installed = True


class LocksPanel(Panel):
    """The locks a request took (every kind: locks, semaphores, latches), in order."""

    title = _("Locks")
    template = "django_rlock/toolbar/locks.html"
    is_async = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[dict[str, Any]] = []
        self.holds: dict[HoldKey, dict[str, Any]] = {}
        self._token: contextvars.Token[LocksPanel | None] | None = None

    @property
    def nav_subtitle(self) -> str:
        stats = self.get_stats()
        count = len(stats.get("locks", ()))
        text = ngettext("%(count)d lock", "%(count)d locks", count) % {"count": count}
        waited = stats.get("wait_ms", 0.0)
        return f"{text}, {waited:.1f} ms waiting" if waited else text

    def enable_instrumentation(self) -> None:
        _install()
        self._token = _current.set(self)

    def disable_instrumentation(self) -> None:
        token, self._token = self._token, None
        try:
            if token is not None:
                _current.reset(token)
        except ValueError:  # reset from another context (an async request's thread hop)
            _current.set(None)
        for registry in (_waiting, _holding):
            for k in [k for k, p in list(registry.items()) if p is self]:
                registry.pop(k, None)

    def generate_stats(self, request: Any, response: Any) -> None:
        rows = [dict(r) for r in self.rows]
        self.record_stats({
            "locks": rows,
            "wait_ms": round(sum(r["wait_ms"] for r in rows), 3),
            "held_ms": round(sum(r["held_ms"] or 0.0 for r in rows), 3),
            "not_acquired": sum(1 for r in rows if r["outcome"] != "acquired"),
        })
