"""``manage.py locks`` and the inspection it shares with the admin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rlock import get_lock
from django_rlock.engine import RLock
from django_rlock.inspect import LockInspector, glob_escape
from tests.django.conftest import DJANGO_REDIS_DB, write_lock
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("locks", *args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def foreign_keys(db1: redis.Redis) -> None:
    """Keys under (or near) the prefix that are not locks and must survive everything."""
    caches["default"].set("x", 1)                        # demo:1:x, a pickled cache value
    db1.hset("demo:rlock:plain-hash", "field", "value")  # a hash, wrong field shape
    db1.hset("demo:rlock:almost", "owner:12", "many")     # right field, non-integer count
    db1.set("demo:rlock:string", "v")                    # not a hash
    db1.hset("other:rlock:elsewhere", "a:1", 1)          # lock-shaped, other prefix


def foreign_state(db1: redis.Redis) -> dict[str, Any]:
    return {
        "x": caches["default"].get("x"),
        "plain-hash": db1.hgetall("demo:rlock:plain-hash"),
        "almost": db1.hgetall("demo:rlock:almost"),
        "string": db1.get("demo:rlock:string"),
        "elsewhere": db1.hgetall("other:rlock:elsewhere"),
    }


FOREIGN = {"x": 1, "plain-hash": {b"field": b"value"}, "almost": {b"owner:12": b"many"},
           "string": b"v", "elsewhere": {b"a:1": b"1"}}


# -- list -----------------------------------------------------------------------------------
def test_list_table_and_json(hold: Callable[..., RLock], db1: redis.Redis) -> None:
    foreign_keys(db1)
    lock = hold(get_lock("orders/42:pay"), times=2)
    write_lock(db1, "demo:rlock:batch", owner="java-client:77", count=1, ttl_ms=None)

    table = run("list")
    lines = table.splitlines()
    assert lines[0].split() == ["NAME", "CLIENT", "ID", "THREAD", "ID", "HOLDS", "TTL"]
    client_id, thread_id = db1.hkeys(lock.key)[0].decode().rsplit(":", 1)
    assert lines[1].split() == ["batch", "java-client", "77", "1", "no", "expiry"]
    name, cid, tid, holds, ttl = lines[2].split()
    assert (name, cid, tid, holds) == ("orders/42:pay", client_id, thread_id, "2")
    assert 25 < float(ttl.rstrip("s")) <= 30
    assert lines[3] == "2 lock(s) under prefix 'demo:rlock:'."
    assert "plain-hash" not in table and "almost" not in table and "string" not in table

    data = json.loads(run("list", format="json"))
    assert [d["name"] for d in data] == ["batch", "orders/42:pay"]
    assert data[0] == {"name": "batch", "key": "demo:rlock:batch", "ttl": None,
                       "holders": [{"client_id": "java-client", "thread_id": 77, "hold_count": 1}]}
    assert data[1]["holders"] == [{"client_id": client_id, "thread_id": int(thread_id), "hold_count": 2}]
    assert 25 < data[1]["ttl"] <= 30


def test_list_match_and_empty(db1: redis.Redis) -> None:
    assert run("list") == "No locks under prefix 'demo:rlock:'.\n"
    assert json.loads(run("list", "--format", "json")) == []
    for name in ("report:1", "report:2", "email:1"):
        write_lock(db1, f"demo:rlock:{name}")
    assert [d["name"] for d in json.loads(run("list", "--match", "report:*", "--format=json"))] == [
        "report:1", "report:2"]


def test_list_other_cache(settings: Any, redis_server: RedisServer) -> None:
    with redis_server.client(db=2) as c:
        write_lock(c, "site2:rlock:on-builtin")
    assert [d["name"] for d in json.loads(run("list", "--cache", "builtin", format="json"))] == [
        "on-builtin"]
    assert json.loads(run("list", format="json")) == []


def test_prefix_with_glob_characters(settings: Any, db1: redis.Redis) -> None:
    settings.RLOCK = {"PREFIX": "l[1]*:"}
    write_lock(db1, "l[1]*:mine")
    write_lock(db1, "l1x:not-mine")  # would match the unescaped glob "l[1]*:*"
    assert glob_escape("l[1]*:") == r"l\[1\]\*:"
    assert LockInspector().names() == ["mine"]


def test_decode_responses_client(db1: redis.Redis, redis_server: RedisServer) -> None:
    write_lock(db1, "demo:rlock:text", owner="abc:5", count=3)
    db1.hset("demo:rlock:plain", "k", "v")
    inspector = LockInspector()
    inspector.client = redis_server.client(db=DJANGO_REDIS_DB, decode_responses=True)
    [info] = inspector.locks()
    assert (info.name, info.holders[0].client_id, info.holders[0].hold_count) == ("text", "abc", 3)
    assert inspector.show("text").fields == {"abc:5": "3"}  # type: ignore[union-attr]
    assert inspector.clear_all() == ["text"]
    assert db1.exists("demo:rlock:plain")


# -- show -----------------------------------------------------------------------------------
def test_show(hold: Callable[..., RLock], db1: redis.Redis) -> None:
    lock = hold(get_lock("a:b/c"))
    field = db1.hkeys(lock.key)[0].decode()
    out = run("show", "a:b/c")
    assert "key:  demo:rlock:a:b/c" in out
    assert f"  {field} -> 1" in out
    data = json.loads(run("show", "a:b/c", format="json"))
    assert data["hash"] == {field: "1"} and data["name"] == "a:b/c"


def test_show_unknown_is_a_command_error(db1: redis.Redis) -> None:
    db1.hset("demo:rlock:plain", "k", "v")
    with pytest.raises(CommandError, match="No lock 'nope'"):
        run("show", "nope")
    with pytest.raises(CommandError, match="No lock 'plain'"):
        run("show", "plain")  # exists, but is not a lock


def manage(redis_server: RedisServer, *args: str,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "REDIS_URL": f"{redis_server.url}?db={DJANGO_REDIS_DB}"}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "locks", *args], cwd=ROOT, env=env,
                          input=input, capture_output=True, text=True, timeout=60)


def test_exit_status_from_the_command_line(redis_server: RedisServer, db1: redis.Redis) -> None:
    """Through manage.py and testproject.settings (REDIS_URL): exit 1 on an unknown lock."""
    write_lock(db1, "demo:rlock:cli")
    ok = manage(redis_server, "show", "cli")
    assert ok.returncode == 0, ok.stderr
    assert "demo:rlock:cli" in ok.stdout
    missing = manage(redis_server, "show", "nope")
    assert missing.returncode == 1
    assert "No lock 'nope'" in missing.stderr
    usage = manage(redis_server, "frobnicate")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    declined = manage(redis_server, "clear", "--all", input="no\n")
    assert declined.returncode == 0 and "Cancelled" in declined.stdout
    assert db1.exists("demo:rlock:cli")


# -- clear ----------------------------------------------------------------------------------
def test_clear_all_no_input_leaves_other_keys(hold: Callable[..., RLock], db1: redis.Redis) -> None:
    foreign_keys(db1)
    hold(get_lock("held"))
    write_lock(db1, "demo:rlock:written")
    out = run("clear", "--all", "--no-input")
    assert "Force-unlocked 2 lock(s)." in out
    assert not db1.exists("demo:rlock:held") and not db1.exists("demo:rlock:written")
    assert foreign_state(db1) == FOREIGN
    assert run("clear", "--all", interactive=False) == "No locks to clear.\n"


def test_clear_names(db1: redis.Redis) -> None:
    foreign_keys(db1)
    for name in ("a", "b", "c"):
        write_lock(db1, f"demo:rlock:{name}")
    err = StringIO()
    out = StringIO()
    call_command("locks", "clear", "a", "c", "plain-hash", "gone", "--no-input", stdout=out, stderr=err)
    assert "Force-unlocked 2 lock(s)." in out.getvalue()
    assert "Not held: 'gone'" in err.getvalue() and "Not held: 'plain-hash'" in err.getvalue()
    assert [k.decode() for k in db1.scan_iter(match="demo:rlock:?")] == ["demo:rlock:b"]
    assert foreign_state(db1) == FOREIGN


def test_configuration_and_connection_errors(settings: Any, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="'nope' is not in settings.CACHES"):
        run("list", cache="nope")
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": f"unix://{tmp_path}/absent.sock"}}
    with pytest.raises(CommandError, match="Redis error"):
        run("list")


def test_clear_needs_names_or_all() -> None:
    with pytest.raises(CommandError, match="names or --all"):
        run("clear", "--no-input")
    with pytest.raises(CommandError, match="names or --all"):
        run("clear", "a", "--all", "--no-input")


def test_clear_asks_for_confirmation(monkeypatch: pytest.MonkeyPatch, db1: redis.Redis) -> None:
    write_lock(db1, "demo:rlock:keep")
    prompts: list[str] = []
    answers = iter(["no", "YES", "yes"])
    monkeypatch.setattr("builtins.input", lambda prompt="": prompts.append(prompt) or next(answers))
    out = run("clear", "--all")
    assert "About to force-unlock 1 lock(s)" in out and "keep" in out and "Cancelled" in out
    assert "Type 'yes' to continue" in prompts[0]
    assert db1.exists("demo:rlock:keep")
    run("clear", "keep")  # "YES" is not "yes"
    assert db1.exists("demo:rlock:keep")
    assert "Force-unlocked 1 lock(s)." in run("clear", "keep")
    assert not db1.exists("demo:rlock:keep")


def test_clear_wakes_a_waiter(hold: Callable[..., RLock], db1: redis.Redis) -> None:
    """Force-unlock publishes: a thread blocked in lock() gets it at once, not at expiry."""
    import threading
    import time

    hold(get_lock("busy"))
    got = threading.Event()

    def wait() -> None:
        lock = get_lock("busy")
        if lock.try_lock(wait_time=20):
            got.set()
            lock.unlock()

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    time.sleep(0.2)
    assert not got.is_set()
    start = time.monotonic()
    run("clear", "busy", "--no-input")
    assert got.wait(5)
    assert time.monotonic() - start < 2
    t.join(5)
