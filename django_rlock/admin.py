"""Admin pages for the locks in Redis, on an unmanaged model (no table), as django-rq does.

The standard changelist and actions need a queryset, so the model admin serves its own views
(through ``admin_site.admin_view``: staff login, CSRF, never_cache) and reads Redis live. The
list reads the index the lock scripts keep; ``?scan=1`` walks the keyspace instead, to find
locks other Redisson clients took too.

Every kind is shown (a Kind column: lock, fair, rw, semaphore, permits, latch, fenced) with
its details, and force-unlocked the way its waiters expect (``engine.listing.Locks.force``).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from redis.exceptions import RedisError

from .conf import get_config
from .engine import kinds
from .inspection import Holder, LockInfo, LockInspector, glob_escape
from .models import Lock
from .signals import force_unlocked_by

logger = logging.getLogger("django_rlock")


def format_ttl(ttl: float) -> str:
    return "no expiry" if ttl == float("inf") else f"{ttl:.1f} s"


def format_held(seconds: float) -> str:
    return f"{seconds:.1f} s"


def format_lease(seconds: float | None) -> str:
    return "no expiry" if seconds is None else f"{seconds:.1f} s"


def held_long(held_for: float | None) -> bool:
    """Held longer than ``RLOCK["WARN_HELD_AFTER"]`` (never, with it unset)."""
    after = get_config().get("WARN_HELD_AFTER")
    return held_for is not None and after is not None and held_for > float(after)


def clear_note(kind: str) -> str:
    """What a force-unlock does beyond deleting the key (the confirmation page says it): the
    kind's own word, from the registry."""
    found = kinds.get(kind)
    return "" if found is None else found.note


@admin.register(Lock)
class LockAdmin(admin.ModelAdmin):
    """Live locks: list with search and pages, raw hash per lock, force-unlock with confirmation."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_force_unlock_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.force_unlock")

    def get_urls(self) -> list[URLPattern]:
        # <path:name> takes any lock name ("orders/42", "a:b"); the fixed suffixes keep the
        # patterns apart whatever the name contains.
        wrap = self.admin_site.admin_view
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", wrap(self.changelist_view), name=f"{prefix}_changelist"),
            path("<path:name>/force-unlock/", wrap(self.force_unlock_view), name=f"{prefix}_force_unlock"),
            path("<path:name>/show/", wrap(self.detail_view), name=f"{prefix}_detail"),
        ]

    # -- views ----------------------------------------------------------------------------
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.get("q", "").strip()
        scan = self._scan(request)
        per_page = get_config()["ADMIN_PAGE_SIZE"]
        try:
            inspector = LockInspector()
            # Names from the index (or SCAN), then HGETALL + PTTL for one page only.
            names = inspector.names(f"*{glob_escape(query)}*" if query else "*", scan=scan)
            paginator = Paginator(names, per_page)
            page = paginator.get_page(request.GET.get("p"))
            rows = [self._row(request, info) for info in inspector.fetch(page.object_list)]
        except RedisError as exc:
            return self._unreadable(request, exc)
        return self._changelist(request, rows, paginator, page, query, scan, inspector,
                                extra_context)

    def _changelist(self, request: HttpRequest, rows: list[dict[str, Any]], paginator: Paginator,
                    page: Any, query: str, scan: bool, inspector: LockInspector | None,
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Locks",
            "subtitle": None,
            "rows": rows,
            "query": query,
            "scan": scan,
            "scan_toggle_url": "?" + urlencode(({"q": query} if query else {})
                                                | ({} if scan else {"scan": 1})),
            "show_all_url": "?" + urlencode({"scan": 1} if scan else {}),
            "page_obj": page,
            "paginator": paginator,
            "page_links": self._page_links(paginator, page.number, query, scan),
            "prefix": self._quiet(lambda: inspector.prefix) if inspector else None,
            "cache_alias": self._quiet(lambda: inspector.alias) if inspector else None,
            "has_force_unlock_permission": self.has_force_unlock_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self._templates("change_list"), context)

    def _unreadable(self, request: HttpRequest, exc: RedisError) -> HttpResponse:
        """Redis down (or refusing): every page says so on an empty list, never a 500."""
        logger.warning("django-rlock: admin could not read the locks from Redis: %s: %s",
                       type(exc).__name__, exc)
        messages.error(request, f"Could not read the locks from Redis: {exc}")
        paginator = Paginator([], get_config()["ADMIN_PAGE_SIZE"])
        query = request.GET.get("q", "").strip()
        return self._changelist(request, [], paginator, paginator.get_page(1), query,
                                self._scan(request), self._quiet(LockInspector))

    @staticmethod
    def _quiet(read: Any) -> Any:
        try:
            return read()
        except Exception:
            return None

    def detail_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            inspector = LockInspector()
            info = inspector.show(name)
        except RedisError as exc:
            return self._unreadable(request, exc)
        if info is None:
            raise Http404(f"No lock {name!r} is held.")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Lock {name}",
            "subtitle": None,
            "lock": self._row(request, info),
            "changelist_url": self._changelist_url(request),
            "prefix": inspector.prefix,
            "cache_alias": inspector.alias,
            "has_force_unlock_permission": self.has_force_unlock_permission(request),
        }
        return TemplateResponse(request, self._templates("detail"), context)

    def force_unlock_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """GET: a confirmation page, nothing changes. POST (with CSRF token): force-unlock."""
        if request.method not in ("GET", "HEAD", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not self.has_force_unlock_permission(request):
            raise PermissionDenied
        changelist = self._changelist_url(request)
        try:
            return self._force_unlock(request, name, changelist)
        except RedisError as exc:
            return self._unreadable(request, exc)

    def _force_unlock(self, request: HttpRequest, name: str, changelist: str) -> HttpResponse:
        inspector = LockInspector()
        if request.method == "POST":
            with force_unlocked_by(request.user):  # the lock_force_unlocked signal names the user
                cleared = inspector.clear([name])
            if cleared:
                logger.warning("django-rlock: %r force-unlocked by admin user %r", name,
                               request.user.get_username())
                LogEntry.objects.log_actions(request.user.pk, [Lock(name=name)], DELETION,
                                             change_message="Force-unlocked", single_object=True)
                messages.success(request, f"Force-unlocked {name!r}.")
            else:
                messages.warning(request, f"{name!r} was not locked any more; nothing to do.")
            return HttpResponseRedirect(changelist)
        info = inspector.show(name)
        if info is None:
            messages.warning(request, f"{name!r} is not locked any more.")
            return HttpResponseRedirect(changelist)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Are you sure?",
            "subtitle": None,
            "lock": self._row(request, info),
            "changelist_url": changelist,
        }
        return TemplateResponse(request, self._templates("force_unlock_confirmation"), context)

    # -- helpers --------------------------------------------------------------------------
    def _templates(self, page: str) -> list[str]:
        return [f"admin/{self.opts.app_label}/{self.opts.model_name}/{page}.html"]

    @staticmethod
    def _page_links(paginator: Paginator, current: int, query: str, scan: bool
                    ) -> list[dict[str, Any]]:
        """Numbered links (elided like the admin's: 1 2 … 9 10 11 … 24 25) keeping the search
        and the listing mode."""
        if paginator.num_pages <= 1:
            return []
        links = []
        for number in paginator.get_elided_page_range(current, on_each_side=2, on_ends=2):
            if not isinstance(number, int):
                links.append({"ellipsis": True, "label": str(number)})
                continue
            params = ({"q": query} if query else {}) | ({"scan": 1} if scan else {}) | {"p": number}
            links.append({"number": number, "current": number == current,
                          "url": "?" + urlencode(params)})
        return links

    @staticmethod
    def _scan(request: HttpRequest) -> bool:
        """``?scan=1``: list by SCAN. Carried to the detail and force-unlock pages and back, so
        a lock only SCAN finds is not followed by a list that hides it."""
        return request.GET.get("scan") == "1"

    def _changelist_url(self, request: HttpRequest) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                      current_app=self.admin_site.name)
        return url + ("?scan=1" if self._scan(request) else "")

    def _row(self, request: HttpRequest, info: LockInfo) -> dict[str, Any]:
        prefix = f"admin:{self.opts.app_label}_{self.opts.model_name}"
        mode = "?scan=1" if self._scan(request) else ""
        holders = [self._holder(h) for h in info.holders]
        return {
            "name": info.name,
            "key": info.key,
            "kind": info.kind,
            "summary": info.summary(),
            "details": self._details(info),
            "value": info.value,
            "clear_note": clear_note(info.kind),
            "holders": holders,
            # Held longer than RLOCK["WARN_HELD_AFTER"]: the row is marked.
            "held_long": any(h["long"] for h in holders),
            "known": all(h.pid is not None for h in info.holders),
            "fields": sorted(info.fields.items()),
            "ttl": format_ttl(info.ttl),
            "waiters": [self._waiter(w) for w in info.waiters],
            "detail_url": reverse(f"{prefix}_detail", args=[info.name],
                                  current_app=self.admin_site.name) + mode,
            "force_unlock_url": reverse(f"{prefix}_force_unlock", args=[info.name],
                                        current_app=self.admin_site.name) + mode,
        }

    def _details(self, info: LockInfo) -> dict[str, Any]:
        """The kind's details for the templates, times formatted."""
        d = dict(info.details)
        if "queue" in d:
            d["queue"] = [{"owner": w["owner"], "timeout": format_lease(w["timeout"])}
                          for w in d["queue"]]
        if "leases" in d:
            d["leases"] = [{"id": p["id"], "ttl": format_lease(p["ttl"])} for p in d["leases"]]
        return d

    def _waiter(self, w: Any) -> dict[str, Any]:
        """A waiter (``waiters.Waiter``) for the templates: since when, in server time (UTC)."""
        empty = self.get_empty_value_display()
        since = datetime.datetime.fromtimestamp(w.since, datetime.UTC)
        return {"owner": w.owner, "host": w.host or empty, "pid": empty if w.pid is None else w.pid,
                "process": w.process or empty, "thread": w.thread or empty,
                "since": since.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                "waiting_for": format_held(w.waiting_for)}

    def _holder(self, h: Holder) -> dict[str, Any]:
        """A holder for the templates: what is unknown (a lock another Redisson client took has
        no index entry) reads as the admin's empty value."""
        empty = self.get_empty_value_display()

        def shown(value: Any) -> Any:
            return empty if value is None else value

        return {
            "owner": h.field,
            "write": h.write,
            "hold_count": h.hold_count,
            "host": shown(h.host),
            "pid": shown(h.pid),
            "process": shown(h.process),
            "thread": shown(h.thread),
            "os_thread_id": shown(h.os_thread_id),
            "held": empty if h.held_for is None else format_held(h.held_for),
            "long": held_long(h.held_for),
            "known": h.pid is not None,
        }
