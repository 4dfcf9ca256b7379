"""``manage.py locks`` and the admin with every kind of the family (fair, rw, fenced, semaphore,
permits, latch): the KIND column, each kind's details, and force-unlock by kind.

The keys are Redisson's layout written with raw commands (``write_kinds``), with the index
entries the kinds' scripts write, or without (what another Redisson client leaves).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import redis
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from django_rlock.engine.naming import latch_channel, lock_channel, prefix_name, suffix_name
from django_rlock.signals import lock_force_unlocked
from tests.django.test_admin import cells, detail_url, lock_names, unlock_url
from tests.django.test_command import run, table
from tests.engine.test_listing_kinds import (
    PERMIT_1,
    PERMIT_2,
    U1,
    U2,
    W1,
    W2,
    Subscriber,
    write_kinds,
)
from tests.redis_server import RedisServer

pytestmark = pytest.mark.django_db

PREFIX = "demo:rlock:"
CHANGELIST = "admin:django_rlock_lock_changelist"
SUMMARIES = {"plain": "", "fair": "queue 2", "rw": "mode read, 2 readers",
             "rw-w": f"mode write, 1 reader, writer {U2}:5", "fenced": "token 17",
             "sem": "3 available", "permits": "1 available, 2 taken", "latch": "count 4"}


@pytest.fixture
def kinds(db1: redis.Redis) -> dict[str, str]:
    return write_kinds(db1, PREFIX)


@pytest.fixture
def subscriber(redis_server: RedisServer) -> Any:
    made: list[Subscriber] = []

    def make(*channels: str) -> Subscriber:
        made.append(Subscriber(redis_server, *channels))
        return made[-1]
    yield make
    for s in made:
        s.close()


# -- the command -------------------------------------------------------------------------------
def test_list_has_a_kind_column_and_each_kinds_details(kinds: dict[str, str]) -> None:
    rows = table(run("list"))
    by_name: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_name.setdefault(row["NAME"], []).append(row)
    assert sorted(by_name) == sorted(kinds)
    for name, kind in kinds.items():
        assert {row["KIND"] for row in by_name[name]} == {kind}, name
        assert {row["DETAILS"] for row in by_name[name]} == {SUMMARIES[name]}, name
    # one row per holder; the semaphores and the latch have none
    assert [r["HOLDER"] for r in by_name["rw"]] == [f"{U1}:3", f"{U2}:4"]
    assert sorted(r["HOLDER"] for r in by_name["rw-w"]) == [f"{U2}:5", f"{U2}:5:write"]
    assert [r["HOLDER"] for r in by_name["fair"]] == [f"{U1}:2"]
    for name in ("sem", "permits", "latch"):
        [row] = by_name[name]
        assert [row[k] for k in ("HOLDER", "HOLDS", "PID", "HELD")] == ["-"] * 4
        assert row["TTL"] == "no expiry"
    assert run("list").splitlines()[-1] == "8 lock(s) under prefix 'demo:rlock:'."


def test_list_scan_tells_kinds_by_layout(db1: redis.Redis) -> None:
    write_kinds(db1, PREFIX, indexed=False)
    assert run("list") == "No locks under prefix 'demo:rlock:'.\n"
    kinds = {row["NAME"]: row["KIND"] for row in table(run("list", "--scan"))}
    # The unindexed semaphore and latch are plain integer strings: no proof, not listed.
    assert kinds == {"plain": "lock", "fair": "fair", "rw": "rw", "rw-w": "rw", "fenced": "fenced",
                     "permits": "permits"}
    data = {d["name"]: d for d in json.loads(run("list", "--scan", format="json"))}
    assert data["permits"]["kind"] == "permits" and "latch" not in data


def test_list_json_carries_the_kind_and_its_details(kinds: dict[str, str]) -> None:
    data = {d["name"]: d for d in json.loads(run("list", format="json"))}
    assert {n: d["kind"] for n, d in data.items()} == kinds
    assert set(data["plain"]) == {"name", "key", "ttl", "holders", "kind", "waiters"}
    assert data["fair"]["queue_length"] == 2 and "queue" not in data["fair"]
    assert data["rw-w"]["mode"] == "write" and data["rw-w"]["writer"] == {"owner": f"{U2}:5",
                                                                          "hold_count": 1}
    assert data["rw"]["readers"] == [{"owner": f"{U1}:3", "hold_count": 2},
                                     {"owner": f"{U2}:4", "hold_count": 1}]
    assert data["fenced"]["token"] == 17
    assert (data["sem"]["permits"], data["sem"]["holders"], data["sem"]["ttl"]) == (3, [], None)
    assert (data["permits"]["permits"], data["permits"]["taken"]) == (1, 2)
    assert data["latch"]["count"] == 4
    for d in data.values():  # holders keep exactly their 8 documented keys
        for h in d["holders"]:
            assert list(h) == ["client_id", "thread_id", "hold_count", "host", "pid", "process",
                               "thread", "held_for"]


def test_show_each_kind(kinds: dict[str, str]) -> None:
    out = run("show", "fair").splitlines()
    assert "kind: fair" in out and "queue length: 2" in out
    assert [line.split(" (")[0] for line in out if re.match(r"  \d\. ", line)] == [
        f"  1. {W1}", f"  2. {W2}"]
    assert re.search(r"times out in \d+\.\d{3}s", "\n".join(out))

    out = run("show", "rw-w").splitlines()
    assert "mode: write" in out and f"writer: {U2}:5 (1 hold(s))" in out and "readers: 1" in out
    assert f"holder:         {U2}:5:write" in out and "  mode -> write" in out

    out = run("show", "permits").splitlines()
    assert "permits available: 1" in out and "permits taken: 2" in out and "value: 1" in out
    assert f"  {PERMIT_2} (lease no expiry)" in out
    assert any(re.fullmatch(rf"  {PERMIT_1} \(lease \d+\.\d{{3}}s\)", line) for line in out)
    assert "hash:" not in out

    assert "count: 4" in run("show", "latch").splitlines()
    assert "token: 17" in run("show", "fenced").splitlines()
    assert "permits available: 3" in run("show", "sem").splitlines()

    fair = json.loads(run("show", "fair", format="json"))
    assert [w["owner"] for w in fair["queue"]] == [W1, W2] and fair["hash"] == {f"{U1}:2": "1"}
    permits = json.loads(run("show", "permits", format="json"))
    assert permits["raw"] == "1" and "hash" not in permits
    assert {p["id"] for p in permits["leases"]} == {PERMIT_1, PERMIT_2}


def test_clear_by_kind_wakes_each_kinds_waiters(kinds: dict[str, str], db1: redis.Redis,
                                                subscriber: Any) -> None:
    key = PREFIX + "fair"
    sub = subscriber(f"{lock_channel(key)}:{W1}", prefix_name("redisson_rwlock", PREFIX + "rw"),
                     prefix_name("redisson_sc", PREFIX + "permits"), latch_channel(PREFIX + "latch"),
                     lock_channel(PREFIX + "fenced"))
    seen: list[str] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs["name"])
    lock_force_unlocked.connect(receiver)
    try:
        out = run("clear", "fair", "rw", "permits", "latch", "fenced", "--no-input")
    finally:
        lock_force_unlocked.disconnect(receiver)
    assert "Force-unlocked 5 lock(s)." in out
    assert sorted(seen) == ["fair", "fenced", "latch", "permits", "rw"]
    assert sorted(sub.messages()) == sorted([
        (f"{lock_channel(key)}:{W1}", "0"), (prefix_name("redisson_rwlock", PREFIX + "rw"), "1"),
        (prefix_name("redisson_sc", PREFIX + "permits"), "0"), (latch_channel(PREFIX + "latch"), "1"),
        (lock_channel(PREFIX + "fenced"), "0")])
    assert not db1.exists(key)  # the fair lock's queue stays: its waiters keep their places
    assert db1.exists(prefix_name("redisson_lock_queue", key),
                      prefix_name("redisson_lock_timeout", key)) == 2
    assert db1.get(prefix_name("redisson_lock_token", PREFIX + "fenced")) == b"17"
    assert not db1.keys(f"{{{PREFIX}rw}}:*")  # the read holds' timeouts went with it
    assert sorted(row["NAME"] for row in table(run("list"))) == ["plain", "rw-w", "rw-w", "sem"]
    assert "Force-unlocked 3 lock(s)." in run("clear", "--all", "--no-input")
    assert run("list") == "No locks under prefix 'demo:rlock:'.\n"


def test_clear_all_scan_clears_foreign_kinds(db1: redis.Redis) -> None:
    write_kinds(db1, PREFIX, indexed=False)
    assert "Force-unlocked 6 lock(s)." in run("clear", "--all", "--scan", "--no-input")
    # Left: the fenced lock's token counter (tokens keep growing) and the fair lock's queue
    # (its waiters keep their places): each kind's own force-unlock; and the unindexed
    # semaphore and latch, integer strings nothing proves to be locks.
    assert sorted(db1.keys(f"*{PREFIX}*")) == sorted(
        [prefix_name(p, PREFIX + n).encode() for p, n in (
            ("redisson_lock_token", "fenced"), ("redisson_lock_queue", "fair"),
            ("redisson_lock_timeout", "fair"))] + [f"{PREFIX}latch".encode(),
                                                   f"{PREFIX}sem".encode()])


# -- the admin ---------------------------------------------------------------------------------
def test_changelist_kind_and_details_columns(admin_client: Client, kinds: dict[str, str],
                                             db1: redis.Redis) -> None:
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert lock_names(html) == sorted(kinds)
    assert "<span>Kind</span>" in html and "<span>Details</span>" in html
    for name, kind in kinds.items():
        row = cells(html, name)
        assert (row["kind"], row["details"]) == (kind, SUMMARIES[name]), name
    assert cells(html, "sem")["holders"] == ""
    row_html = re.search(r'data-name="rw-w">(.*?)</tr>', html, re.DOTALL).group(1)  # type: ignore[union-attr]
    holders = re.search(r'<td class="holders">(.*?)</td>', row_html).group(1)  # type: ignore[union-attr]
    assert sorted(re.findall(r"<code>([^<]+)</code>", holders)) == [f"{U2}:5", f"{U2}:5:write"]

    db1.delete("rlock-index:demo:rlock:")
    html = admin_client.get(reverse(CHANGELIST), {"scan": "1"}).content.decode()
    assert cells(html, "permits")["kind"] == "permits"
    assert 'data-name="latch"' not in html  # an unindexed integer string proves nothing


def test_detail_pages_show_each_kinds_details(admin_client: Client, kinds: dict[str, str]) -> None:
    html = admin_client.get(detail_url("fair")).content.decode()
    assert '<td class="kind">fair</td>' in html and '<td class="queue-length">2</td>' in html
    queue = re.findall(r'<tr class="waiter"><td>(\d)</td><td class="owner"><code>([^<]+)</code></td>'
                       r'<td class="timeout">([^<]+)</td>', html)
    assert [(n, o) for n, o, _ in queue] == [("1", W1), ("2", W2)]
    assert all(re.fullmatch(r"\d+\.\d s", t) for _, _, t in queue)

    html = admin_client.get(detail_url("rw-w")).content.decode()
    assert '<td class="mode">write</td>' in html and f"<code>{U2}:5</code> (1 hold)" in html
    assert re.search(rf'<tr class="reader"><td class="owner"><code>{U2}:5</code></td>', html)
    assert f"<code>{U2}:5:write</code>" in html  # the writer among the holders
    assert "<code>mode</code></td><td>write</td>" in html  # raw hash, but never a holder
    assert '<td class="owner"><code>mode</code>' not in html

    html = admin_client.get(detail_url("permits")).content.decode()
    assert '<td class="permits">1</td>' in html and '<td class="taken">2</td>' in html
    assert f'<td class="permit-id"><code>{PERMIT_2}</code></td><td class="ttl">no expiry</td>' in html
    assert f"<code>{PERMIT_1}</code>" in html
    assert 'id="lock-value"><code>1</code>' in html
    assert "Raw hash" not in html and 'id="lock-holders"' not in html

    html = admin_client.get(detail_url("latch")).content.decode()
    assert '<td class="count">4</td>' in html
    assert '<td class="token">17</td>' in admin_client.get(detail_url("fenced")).content.decode()


def test_an_expired_permit_is_free_not_taken(admin_client: Client, db1: redis.Redis) -> None:
    """A permit whose lease is over (its holder crashed: SIGKILL, or a lease that ran out) is
    free by the semaphore's own rule, which every write applies first (``reclaim``): listed as
    available, never as taken, though nothing has written since to drop it."""
    from django_rlock import get_semaphore

    sem = get_semaphore("exports", permits=3)
    live = sem.acquire()  # renewed by the watchdog while this test runs
    dead = sem.acquire(lease_time=0.05)
    time.sleep(0.3)  # past the lease on the server's clock too
    row = {r["NAME"]: r for r in table(run("list"))}["exports"]
    assert row["DETAILS"] == "2 available, 1 taken"
    out = run("show", "exports").splitlines()
    assert "permits available: 2" in out and "permits taken: 1" in out and "value: 1" in out
    assert any(re.fullmatch(rf"  {live} \(lease \d+\.\d{{3}}s\)", line) for line in out)
    assert not any(dead in line for line in out)
    data = json.loads(run("show", "exports", format="json"))
    assert (data["permits"], data["taken"], [p["id"] for p in data["leases"]]) == (2, 1, [live])
    html = admin_client.get(detail_url("exports")).content.decode()
    assert '<td class="permits">2</td>' in html and '<td class="taken">1</td>' in html
    assert live in html and dead not in html
    assert db1.zcard(suffix_name(PREFIX + "exports", "timeout")) == 2  # a read: nothing was reclaimed
    assert sem.available_permits() == 2  # what the semaphore says, once it has reclaimed
    sem.release(live)


def test_force_unlock_a_fair_lock_from_the_admin(admin_user: Any, admin_client: Client,
                                                 kinds: dict[str, str], db1: redis.Redis,
                                                 subscriber: Any) -> None:
    key = PREFIX + "fair"
    confirm = admin_client.get(unlock_url("fair")).content.decode()
    assert "Force-unlock the fair" in confirm and "queue 2" in confirm
    assert "Its queue of waiters stays" in confirm
    assert db1.exists(key)
    sub = subscriber(f"{lock_channel(key)}:{W1}", f"{lock_channel(key)}:{W2}")
    response = admin_client.post(unlock_url("fair"), follow=True)
    assert "Force-unlocked &#x27;fair&#x27;." in response.content.decode()
    assert sub.messages() == [(f"{lock_channel(key)}:{W1}", "0")]
    assert not db1.exists(key)
    assert db1.exists(prefix_name("redisson_lock_queue", key),
                      prefix_name("redisson_lock_timeout", key)) == 2  # waiters keep places
    assert LogEntry.objects.get().object_id == "fair"

    confirm = admin_client.get(unlock_url("latch")).content.decode()
    assert "The latch opens" in confirm and 'id="lock-holders"' not in confirm
    sub = subscriber(latch_channel(PREFIX + "latch"))
    admin_client.post(unlock_url("latch"))
    assert sub.messages() == [(latch_channel(PREFIX + "latch"), "1")]
    assert not db1.exists(PREFIX + "latch")
