"""get_leader on a cache alias; the leader_elected / leader_revoked signals; the Prometheus
gauge and terms counter; `locks list` / `locks clear` on a leadership."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_rlock import AsyncLeader, Leader, get_leader
from django_rlock.signals import leader_elected, leader_revoked


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []

    def on_elected(sender: Any, **kw: Any) -> None:
        got.append(("elected", kw))

    def on_revoked(sender: Any, **kw: Any) -> None:
        got.append(("revoked", kw))

    leader_elected.connect(on_elected, weak=False)
    leader_revoked.connect(on_revoked, weak=False)
    yield got
    leader_elected.disconnect(on_elected)
    leader_revoked.disconnect(on_revoked)


def test_get_leader_uses_the_cache_connection_prefix_and_watchdog_setting(settings, db1):
    settings.RLOCK = {"WATCHDOG_TIMEOUT": 7}
    leader = get_leader("beat")
    assert isinstance(leader, Leader)
    assert (leader.key, leader.watchdog_timeout) == ("demo:rlock:rlock-leader:beat", 7.0)
    assert leader.token_key == "redisson_lock_token:{demo:rlock:rlock-leader:beat}"
    assert get_leader("beat", watchdog_timeout=2).watchdog_timeout == 2.0
    other = get_leader("beat", cache="builtin")
    assert other.key.startswith("site2:") and other.key.endswith("rlock-leader:beat")
    with leader:
        assert leader.wait_elected(5)
        assert db1.hexists(leader.key, leader.owner)  # on the default cache's database
        assert db1.get(leader.token_key) == str(leader.term).encode()


def test_get_leader_refuses_bad_input_before_any_command():
    with pytest.raises(TypeError, match="unknown option.*lease_time.*'beat'"):
        get_leader("beat", lease_time=3)
    with pytest.raises(TypeError, match="group must be a str"):
        get_leader(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group must not be empty"):
        get_leader("")
    with pytest.raises(TypeError, match="on_elected must be callable"):
        get_leader("beat", on_elected="no")
    # The lease and the cache are the group's: the error names it (not "lock 'beat'").
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"watchdog_timeout must be a finite number > 0 "
                                             r"seconds, got .* \(leader group 'beat'\)$"):
            get_leader("beat", watchdog_timeout=bad)
    with pytest.raises(TypeError, match=r"watchdog_timeout must be a number of seconds, not "
                                        r"str \(leader group 'beat'\)$"):
        get_leader("beat", watchdog_timeout="30")
    with pytest.raises(TypeError, match=r"not list \(leader group 'beat'\)"):
        get_leader("beat", ["default"])  # type: ignore[arg-type]


def test_signals_carry_group_term_and_reason(received):
    with get_leader("sig") as leader:
        assert leader.wait_elected(5)
        term = leader.term
    assert [(w, kw["group"], kw["term"], kw.get("reason")) for w, kw in received] == [
        ("elected", "sig", term, None), ("revoked", "sig", term, "stopped")]
    assert received[0][1]["label"] == "rlock-leader:sig"


def test_locks_list_shows_the_term_and_clear_deposes(received):
    with get_leader("ops", watchdog_timeout=30) as leader:
        assert leader.wait_elected(5)
        term = leader.term
        out = StringIO()
        call_command("locks", "list", "--format", "json", stdout=out, stderr=StringIO())
        [row] = json.loads(out.getvalue())
        assert (row["name"], row["kind"], row["term"]) == ("rlock-leader:ops", "leader", term)
        call_command("locks", "clear", "rlock-leader:ops", "--no-input", stdout=StringIO(),
                     stderr=StringIO())
        end = time.monotonic() + 5
        while not any(w == "revoked" for w, _ in received):
            assert time.monotonic() < end
            time.sleep(0.01)
        revoked = [kw for w, kw in received if w == "revoked"][0]
        assert (revoked["term"], revoked["reason"]) == (term, "lost")
        assert leader.wait_elected(5) and leader.term > term  # it campaigned again


def test_prometheus_gauge_and_terms(received):
    prometheus_client = pytest.importorskip("prometheus_client")
    from django_rlock import prometheus

    registry = prometheus_client.CollectorRegistry()
    prometheus.install(registry)
    try:
        def value(name: str) -> float | None:
            return registry.get_sample_value(name, {"group": "prom"})

        a, b = get_leader("prom"), get_leader("prom")
        a.start()
        assert a.wait_elected(5)
        assert (value("django_rlock_leader"), value("django_rlock_leader_terms_total")) == (1, 1)
        b.start()  # a standby of the same process sets the process's gauge back to 0 ...
        assert value("django_rlock_leader") == 0
        a.stop()   # ... a's revocation too; b's election to 1
        assert b.wait_elected(5)
        time.sleep(0.05)
        assert (value("django_rlock_leader"), value("django_rlock_leader_terms_total")) == (1, 2)
        b.stop()
        assert value("django_rlock_leader") == 0
    finally:
        prometheus.uninstall(registry)


def test_get_leader_aio_is_an_async_leader(received):
    async def main() -> tuple[bool, int | None]:
        leader = get_leader("aio", aio=True)
        assert isinstance(leader, AsyncLeader)
        async with leader:
            elected = await leader.wait_elected(5)
            info = await leader.leader()
            return elected, None if info is None else info.term

    elected, term = asyncio.run(main())
    assert elected and term is not None
    assert [(w, kw["term"]) for w, kw in received] == [("elected", term), ("revoked", term)]


@pytest.mark.django_db
def test_the_admin_lists_the_leadership_with_its_term(admin_client, received):
    from django.urls import reverse

    from tests.django.test_admin import cells

    with get_leader("adm") as leader:
        assert leader.wait_elected(5)
        html = admin_client.get(reverse("admin:django_rlock_lock_changelist")).content.decode()
        row = cells(html, "rlock-leader:adm")
        assert (row["kind"], row["details"]) == ("leader", f"term {leader.term}")
