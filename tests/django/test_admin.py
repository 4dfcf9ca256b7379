"""Admin pages: permissions, CSRF, the confirmation step, search and pagination, read live."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

import pytest
import redis
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.core.cache import caches
from django.test import Client
from django.urls import resolve, reverse

from django_rlock import get_lock
from django_rlock.engine import RLock, identity
from django_rlock.signals import lock_force_unlocked
from tests.django.conftest import write_lock

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_rlock_lock_changelist"
#: A Java Redisson client's uuid: its locks have no index entry (only --scan finds them).
JAVA = "9a1b2c3d-0000-4000-8000-00000000a042"
PREFIX = "demo:rlock:"


def detail_url(name: str) -> str:
    return reverse("admin:django_rlock_lock_detail", args=[name])


def unlock_url(name: str) -> str:
    return reverse("admin:django_rlock_lock_force_unlock", args=[name])


@pytest.fixture
def staff(django_user_model: Any) -> Callable[..., Client]:
    """``staff(*perms)``: a logged-in client of a staff user with just these permissions."""
    def make(*codenames: str) -> Client:
        user = django_user_model.objects.create_user(f"staff{len(codenames)}", password="pw",
                                                     is_staff=True)
        for codename in codenames:
            user.user_permissions.add(Permission.objects.get(content_type__app_label="django_rlock",
                                                             codename=codename))
        client = Client()
        client.force_login(user)
        return client
    return make


def test_permissions_exist() -> None:
    perms = set(Permission.objects.filter(content_type__app_label="django_rlock")
                .values_list("codename", flat=True))
    assert perms == {"view_lock", "force_unlock"}


def test_url_names_accept_any_lock_name() -> None:
    """Quoted by reverse(), decoded by the server (resolve() sees the decoded path)."""
    for name in ("a", "orders/42", "x:y:z", "a/show", "b/force-unlock", "sp ace?&#%", "ü/ñ", "/lead//trail/"):
        assert resolve(unquote(detail_url(name))).kwargs == {"name": name}
        match = resolve(unquote(unlock_url(name)))
        assert match.kwargs == {"name": name} and match.url_name == "django_rlock_lock_force_unlock"
    assert reverse(CHANGELIST) == "/admin/django_rlock/lock/"


# -- who may do what ------------------------------------------------------------------------
def test_anonymous_is_sent_to_login(client: Client, db1: redis.Redis) -> None:
    write_lock(db1, "demo:rlock:job")
    for url in (reverse(CHANGELIST), detail_url("job"), unlock_url("job")):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login") + "?next=")
    assert client.post(unlock_url("job")).status_code == 302
    assert db1.exists("demo:rlock:job")


def test_staff_without_permission_is_forbidden(staff: Callable[..., Client], db1: redis.Redis) -> None:
    write_lock(db1, "demo:rlock:job")
    c = staff()
    for url in (reverse(CHANGELIST), detail_url("job"), unlock_url("job")):
        assert c.get(url).status_code == 403
    assert c.post(unlock_url("job")).status_code == 403
    assert b"django_rlock/lock/" not in c.get(reverse("admin:index")).content
    assert db1.exists("demo:rlock:job")


def test_view_permission_sees_but_cannot_unlock(staff: Callable[..., Client], db1: redis.Redis) -> None:
    write_lock(db1, "demo:rlock:job", owner="client-a:11", count=2, indexed=PREFIX)
    c = staff("view_lock")
    index = c.get(reverse("admin:index")).content.decode()
    assert 'href="/admin/django_rlock/lock/"' in index and "Distributed locks" in index
    assert "/admin/django_rlock/lock/add/" not in index

    page = c.get(reverse(CHANGELIST))
    assert page.status_code == 200
    html = page.content.decode()
    assert "client-a:11" in html and f'href="{detail_url("job")}"' in html
    assert "Force unlock" not in html and unlock_url("job") not in html

    detail = c.get(detail_url("job"))
    assert detail.status_code == 200
    assert "<code>client-a:11</code></td><td>2</td>" in detail.content.decode()
    assert unlock_url("job") not in detail.content.decode()

    assert c.get(unlock_url("job")).status_code == 403
    assert c.post(unlock_url("job")).status_code == 403
    assert db1.exists("demo:rlock:job")


def test_force_unlock_permission(staff: Callable[..., Client], db1: redis.Redis) -> None:
    write_lock(db1, "demo:rlock:job", indexed=PREFIX)
    c = staff("view_lock", "force_unlock")
    assert unlock_url("job") in c.get(reverse(CHANGELIST)).content.decode()
    response = c.post(unlock_url("job"))
    assert response.status_code == 302 and response["Location"] == reverse(CHANGELIST)
    assert not db1.exists("demo:rlock:job")


# -- force-unlock ---------------------------------------------------------------------------
def test_superuser_force_unlock_flow(admin_user: Any, hold: Callable[..., RLock], db1: redis.Redis) -> None:
    name = "reports/daily:2024-01-01"
    lock = hold(get_lock(name))
    db1.set("demo:rlock:neighbour", "x")
    c = Client(enforce_csrf_checks=True)
    c.force_login(admin_user)

    confirm = c.get(unlock_url(name))  # GET only asks
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Are you sure?" in html and name in html and 'name="csrfmiddlewaretoken"' in html
    assert db1.exists(lock.key)

    assert c.post(unlock_url(name)).status_code == 403  # no CSRF token
    assert db1.exists(lock.key)

    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    response = c.post(unlock_url(name), {"csrfmiddlewaretoken": token}, follow=True)
    assert response.redirect_chain == [(reverse(CHANGELIST), 302)]
    assert f"Force-unlocked &#x27;{name}&#x27;." in response.content.decode()
    assert "No locks are held." in response.content.decode()
    assert not db1.exists(lock.key)
    assert db1.get("demo:rlock:neighbour") == b"x"

    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.action_flag, entry.user_id) == (name, DELETION, admin_user.pk)

    # A second POST (double click, or the lock was released meanwhile) changes nothing.
    again = c.post(unlock_url(name), {"csrfmiddlewaretoken": token}, follow=True)
    assert "was not locked any more" in again.content.decode()
    # GET for a lock that is gone: back to the list, with a message.
    gone = c.get(unlock_url(name), follow=True)
    assert gone.redirect_chain == [(reverse(CHANGELIST), 302)]


def test_force_unlock_refuses_other_methods(admin_client: Client, db1: redis.Redis) -> None:
    write_lock(db1, "demo:rlock:job")
    assert admin_client.put(unlock_url("job")).status_code == 405
    assert admin_client.delete(unlock_url("job")).status_code == 405
    assert db1.exists("demo:rlock:job")


def test_force_unlock_only_touches_lock_hashes(admin_client: Client, db1: redis.Redis) -> None:
    db1.hset("demo:rlock:plain", "k", "v")
    assert admin_client.get(detail_url("plain")).status_code == 404
    admin_client.post(unlock_url("plain"))
    assert db1.hgetall("demo:rlock:plain") == {b"k": b"v"}


# -- the pages ------------------------------------------------------------------------------
def test_detail_shows_raw_hash_and_ttl(admin_client: Client, db1: redis.Redis) -> None:
    name = "a/b c?&#%ü"
    write_lock(db1, f"demo:rlock:{name}", owner=f"{JAVA}:140245372086080", count=3, ttl_ms=None)
    page = admin_client.get(detail_url(name))
    assert page.status_code == 200
    html = page.content.decode()
    assert f"<code>{JAVA}:140245372086080</code></td><td>3</td>" in html
    assert "no expiry" in html and "demo:rlock:a/b c?&amp;#%ü" in html
    assert admin_client.get(detail_url("missing")).status_code == 404


def test_search(admin_client: Client, db1: redis.Redis) -> None:
    for name in ("orders:1", "orders:2", "emails:1", "x*y"):
        write_lock(db1, f"demo:rlock:{name}", indexed=PREFIX)
    html = admin_client.get(reverse(CHANGELIST), {"q": "orders"}).content.decode()
    assert "orders:1" in html and "orders:2" in html and "emails:1" not in html
    assert "2 results" in html
    html = admin_client.get(reverse(CHANGELIST), {"q": "*"}).content.decode()  # literal, not a glob
    assert "x*y" in html and "orders:1" not in html
    assert "No lock name contains" in admin_client.get(reverse(CHANGELIST), {"q": "zzz"}).content.decode()


def lock_names(html: str) -> list[str]:
    return re.findall(r'<tr class="lock-row" data-name="([^"]+)">', html)


def test_pagination_with_thousands_of_locks(admin_client: Client, db1: redis.Redis) -> None:
    pipe = db1.pipeline(transaction=False)
    for i in range(2500):
        write_lock(pipe, f"demo:rlock:job:{i:04d}", f"client-{i}:{i + 1}", ttl_ms=60_000, indexed=PREFIX)
    for i in range(300):  # noise the listing must skip
        pipe.set(f"demo:rlock:noise:{i}", 1)
    pipe.execute()

    start = time.monotonic()
    first = admin_client.get(reverse(CHANGELIST))
    elapsed = time.monotonic() - start
    html = first.content.decode()
    assert lock_names(html) == [f"job:{i:04d}" for i in range(100)]
    assert "2500 locks, page 1 of 25" in html
    assert '<span class="this-page">1</span>' in html
    assert '<a href="?p=2">2</a>' in html and '<a href="?p=25">25</a>' in html
    assert '<a href="?p=13">' not in html and "…" in html  # elided, not 25 links
    assert elapsed < 3, f"first page took {elapsed:.2f}s"

    html = admin_client.get(reverse(CHANGELIST), {"p": 13}).content.decode()
    assert lock_names(html) == [f"job:{i:04d}" for i in range(1200, 1300)]
    assert '<a href="?p=12">12</a>' in html and '<a href="?p=14">14</a>' in html

    html = admin_client.get(reverse(CHANGELIST), {"p": 999}).content.decode()  # clamped
    assert lock_names(html)[-1] == "job:2499"

    html = admin_client.get(reverse(CHANGELIST), {"q": "job:1", "p": 2}).content.decode()
    assert lock_names(html) == [f"job:{i:04d}" for i in range(1100, 1200)]
    assert "1000 results" in html and '<a href="?q=job%3A1&amp;p=1">1</a>' in html


def test_page_size_setting(settings: Any, admin_client: Client, db1: redis.Redis) -> None:
    settings.RLOCK = {"ADMIN_PAGE_SIZE": 2}
    for i in range(5):
        write_lock(db1, f"demo:rlock:l{i}", indexed=PREFIX)
    html = admin_client.get(reverse(CHANGELIST), {"p": 3}).content.decode()
    assert lock_names(html) == ["l4"] and "5 locks, page 3 of 3" in html


def test_redis_down_shows_an_error(settings: Any, admin_client: Client, tmp_path: Any) -> None:
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": f"unix://{tmp_path}/absent.sock?db=1"}}
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert "Could not read the locks from Redis" in response.content.decode()


# -- who holds it, and the SCAN listing ------------------------------------------------------
def cells(html: str, name: str) -> dict[str, str]:
    """The cells of one list row (or the detail's holder row), by class, tags stripped."""
    row = re.search(rf'<tr class="lock-row" data-name="{re.escape(name)}">(.*?)</tr>', html, re.DOTALL)
    assert row is not None, f"no row {name!r}"
    return {m[0]: re.sub(r"<[^>]+>", "", m[1]).strip()
            for m in re.findall(r'<td class="([\w-]+)">(.*?)</td>', row.group(1), re.DOTALL)}


@pytest.fixture
def process_label() -> Iterator[str]:
    label = "celery worker ForkPoolWorker-2"
    identity.set_process_label(label)
    yield label
    identity.set_process_label(None)


def test_list_detail_and_confirmation_show_where_a_lock_is_held(
        admin_client: Client, hold: Callable[..., RLock], db1: redis.Redis, process_label: str) -> None:
    lock = hold(get_lock("reports/daily"), times=2, thread="worker-7")
    field = db1.hkeys(lock.key)[0].decode()
    ident = next(t.ident for t in threading.enumerate() if t.name == "worker-7")
    time.sleep(0.15)
    where = {"holders": field, "hold-count": "2", "host": socket.gethostname(), "pid": str(os.getpid()),
             "process": process_label, "thread": "worker-7"}

    row = cells(admin_client.get(reverse(CHANGELIST)).content.decode(), "reports/daily")
    assert {k: row[k] for k in where} == where
    assert re.fullmatch(r"\d+\.\d s", row["held"]) and float(row["held"][:-2]) >= 0.1
    assert row["ttl"].endswith(" s")

    html = admin_client.get(detail_url("reports/daily")).content.decode()
    holder = re.search(r'<tr class="holder">(.*?)</tr>', html, re.DOTALL).group(1)  # type: ignore[union-attr]
    shown = dict(re.findall(r'<td class="([\w-]+)">(?:<code>)?(.*?)(?:</code>)?</td>', holder))
    assert shown | {"held": ""} == {"owner": field, "hold-count": "2", "host": socket.gethostname(),
                                    "pid": str(os.getpid()), "process": process_label,
                                    "thread": "worker-7", "os-thread-id": str(ident), "held": ""}
    assert "taken by another Redisson client" not in html

    html = admin_client.get(unlock_url("reports/daily")).content.decode()
    assert f"{process_label}, pid {os.getpid()} on {socket.gethostname()}, thread worker-7, held for" in html


def test_scan_lists_locks_of_other_clients(settings: Any, admin_client: Client,
                                           hold: Callable[..., RLock], db1: redis.Redis) -> None:
    """A lock with no index entry (another Redisson client's) shows only with ?scan=1, which
    search, pages, the detail and the force-unlock keep."""
    settings.RLOCK = {"ADMIN_PAGE_SIZE": 1}
    hold(get_lock("ours"))
    write_lock(db1, "demo:rlock:theirs", owner=f"{JAVA}:42", count=3)

    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert lock_names(html) == ["ours"]
    assert '<a href="?scan=1" id="scan-toggle">Scan every key</a>' in html
    assert "also finds locks taken by other Redisson clients" in html and "visits every key" in html

    html = admin_client.get(reverse(CHANGELIST), {"scan": "1"}).content.decode()
    assert "2 locks, page 1 of 2" in html and '<a href="?scan=1&amp;p=2">2</a>' in html
    assert '<a href="?" id="scan-toggle">List from the index</a>' in html
    html = admin_client.get(reverse(CHANGELIST), {"scan": "1", "p": 2}).content.decode()
    assert lock_names(html) == ["theirs"]
    row = cells(html, "theirs")
    assert (row["holders"], row["hold-count"]) == (f"{JAVA}:42", "3")
    assert [row[k] for k in ("host", "pid", "process", "thread", "held")] == ["-"] * 5
    assert f'href="{detail_url("theirs")}?scan=1"' in html and f'href="{unlock_url("theirs")}?scan=1"' in html

    html = admin_client.get(reverse(CHANGELIST), {"scan": "1", "q": "the"}).content.decode()
    assert lock_names(html) == ["theirs"] and '<input type="hidden" name="scan" value="1">' in html
    assert '<a href="?scan=1">Show all</a>' in html
    assert '<a href="?q=the" id="scan-toggle">' in html
    html = admin_client.get(reverse(CHANGELIST), {"q": "the"}).content.decode()
    assert lock_names(html) == [] and '<a href="?q=the&amp;scan=1" id="scan-toggle">' in html

    detail = admin_client.get(detail_url("theirs"), {"scan": "1"}).content.decode()
    assert f'<a href="{reverse(CHANGELIST)}?scan=1">' in detail
    assert "taken by another Redisson client" in detail
    response = admin_client.post(unlock_url("theirs") + "?scan=1")
    assert response["Location"] == reverse(CHANGELIST) + "?scan=1"
    assert not db1.exists("demo:rlock:theirs")


def test_force_unlock_signal_names_the_admin_user(admin_user: Any, admin_client: Client,
                                                  hold: Callable[..., RLock]) -> None:
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    hold(get_lock("job"))
    lock_force_unlocked.connect(receiver)
    try:
        admin_client.post(unlock_url("job"))
    finally:
        lock_force_unlocked.disconnect(receiver)
    assert [(s["name"], s["user"]) for s in seen] == [("job", admin_user)]


def test_scan_with_an_empty_prefix_never_shows_or_unlocks_cache_integers(
        settings: Any, admin_client: Client, hold: Callable[..., RLock], db1: redis.Redis) -> None:
    """``PREFIX ""``: the cache's raw integers sit under the scan's glob and look like a
    semaphore or latch; ``?scan=1`` lists only what is provably a lock, and the force-unlock
    of such a key by its name leaves it (user audit)."""
    settings.RLOCK = {"PREFIX": ""}
    caches["default"].set("visits", 42, timeout=None)
    hold(get_lock("ours"))
    html = admin_client.get(reverse(CHANGELIST), {"scan": "1"}).content.decode()
    assert lock_names(html) == ["ours"]
    assert admin_client.get(detail_url("demo:1:visits"), {"scan": "1"}).status_code == 404
    admin_client.post(unlock_url("demo:1:visits") + "?scan=1")
    assert caches["default"].get("visits") == 42
    admin_client.post(unlock_url("ours") + "?scan=1")
    assert not db1.exists("ours") and caches["default"].get("visits") == 42
