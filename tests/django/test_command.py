"""``manage.py locks`` and the inspection it shares with the admin."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rlock import get_latch, get_lock
from django_rlock.engine import RLock, identity
from django_rlock.inspection import LockInspector, glob_escape
from django_rlock.signals import lock_force_unlocked
from tests.django.conftest import DJANGO_REDIS_DB, write_lock
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
#: A Java Redisson client's uuid: its locks have no index entry (only --scan finds them).
JAVA = "9a1b2c3d-0000-4000-8000-00000000a042"


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
    db1.hset("demo:rlock:counters", "page:12", 3)        # lock-shaped, but no client uuid


def foreign_state(db1: redis.Redis) -> dict[str, Any]:
    return {
        "x": caches["default"].get("x"),
        "plain-hash": db1.hgetall("demo:rlock:plain-hash"),
        "almost": db1.hgetall("demo:rlock:almost"),
        "string": db1.get("demo:rlock:string"),
        "elsewhere": db1.hgetall("other:rlock:elsewhere"),
        "counters": db1.hgetall("demo:rlock:counters"),
    }


FOREIGN = {"x": 1, "plain-hash": {b"field": b"value"}, "almost": {b"owner:12": b"many"},
           "string": b"v", "elsewhere": {b"a:1": b"1"}, "counters": {b"page:12": b"3"}}





# -- list -----------------------------------------------------------------------------------
HEADER = ["NAME", "KIND", "HOLDER", "HOLDS", "HOST", "PID", "PROCESS", "THREAD", "HELD", "TTL", "WAITING",
          "DETAILS"]


def table(out: str) -> list[dict[str, str]]:
    """The rows of ``locks list``'s table, cut at the header's columns (cells may hold spaces)."""
    lines = out.splitlines()
    assert lines[0].split() == HEADER
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    bounds = [*starts[1:], None]
    return [{h: line[a:b].strip() for h, a, b in zip(HEADER, starts, bounds, strict=True)}
            for line in lines[1:-1]]


@pytest.fixture
def process_label() -> Iterator[str]:
    """A process label with spaces, as a Celery child has; put back to the guess afterwards."""
    label = "celery worker ForkPoolWorker-2"
    identity.set_process_label(label)
    yield label
    identity.set_process_label(None)


def thread_named(name: str) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == name)


def test_list_table_and_json(hold: Callable[..., RLock], db1: redis.Redis) -> None:
    foreign_keys(db1)
    lock = hold(get_lock("orders/42:pay"), times=2)
    write_lock(db1, "demo:rlock:batch", owner=f"{JAVA}:77", count=1, ttl_ms=None)
    field = db1.hkeys(lock.key)[0].decode()

    out = run("list")  # the index: the lock another client wrote by hand is not in it
    [row] = table(out)
    assert (row["NAME"], row["HOLDER"], row["HOLDS"]) == ("orders/42:pay", field, "2")
    assert 25 < float(row["TTL"].rstrip("s")) <= 30
    assert out.splitlines()[-1] == "1 lock(s) under prefix 'demo:rlock:'."

    out = run("list", "--scan")
    batch, orders = table(out)
    assert batch == {"NAME": "batch", "KIND": "lock", "HOLDER": f"{JAVA}:77", "HOLDS": "1",
                     "HOST": "-", "PID": "-", "PROCESS": "-", "THREAD": "-", "HELD": "-",
                     "TTL": "no expiry", "WAITING": "0", "DETAILS": ""}
    assert orders == row | {"HELD": orders["HELD"], "TTL": orders["TTL"]}
    assert out.splitlines()[-1] == "2 lock(s) under prefix 'demo:rlock:'."
    assert "plain-hash" not in out and "almost" not in out and "string" not in out

    data = json.loads(run("list", "--scan", format="json"))
    assert [d["name"] for d in data] == ["batch", "orders/42:pay"]
    assert data[0] == {"name": "batch", "key": "demo:rlock:batch", "ttl": None, "holders": [
        {"client_id": JAVA, "thread_id": 77, "hold_count": 1, "host": None, "pid": None,
         "process": None, "thread": None, "held_for": None}], "kind": "lock", "waiters": []}
    client_id, thread_id = field.rsplit(":", 1)
    [holder] = data[1]["holders"]
    assert (holder["client_id"], holder["thread_id"], holder["hold_count"]) == (client_id, int(thread_id), 2)
    assert 25 < data[1]["ttl"] <= 30
    [indexed] = json.loads(run("list", format="json"))
    assert indexed["name"] == "orders/42:pay" and indexed["holders"][0]["pid"] == os.getpid()


def test_list_shows_where_a_lock_is_held(hold: Callable[..., RLock], db1: redis.Redis,
                                         process_label: str) -> None:
    """A real lock on a live thread: host, pid, process label, thread name and how long."""
    lock = hold(get_lock("reports/daily"), times=2, thread="worker-7")
    field = db1.hkeys(lock.key)[0].decode()
    time.sleep(0.15)

    [row] = table(run("list"))
    assert {k: row[k] for k in ("NAME", "HOLDER", "HOLDS", "HOST", "PID", "PROCESS", "THREAD")} == {
        "NAME": "reports/daily", "HOLDER": field, "HOLDS": "2", "HOST": socket.gethostname(),
        "PID": str(os.getpid()), "PROCESS": process_label, "THREAD": "worker-7"}
    assert re.fullmatch(r"\d+\.\ds", row["HELD"]) and 0.1 <= float(row["HELD"][:-1]) < 10

    [info] = json.loads(run("list", format="json"))
    [holder] = info["holders"]
    assert list(holder) == ["client_id", "thread_id", "hold_count", "host", "pid", "process", "thread",
                            "held_for"]
    client_id, thread_id = field.rsplit(":", 1)
    assert {**holder, "held_for": None} == {
        "client_id": client_id, "thread_id": int(thread_id), "hold_count": 2,
        "host": socket.gethostname(), "pid": os.getpid(), "process": process_label,
        "thread": "worker-7", "held_for": None}
    assert 0.1 <= holder["held_for"] < 10

    out = run("show", "reports/daily")
    ident = thread_named("worker-7").ident
    for line in (f"holder:         {field}", "  hold count:   2", f"  host:         {socket.gethostname()}",
                 f"  pid:          {os.getpid()}", f"  process:      {process_label}",
                 "  thread:       worker-7", f"  os thread id: {ident}", f"  {field} -> 2"):
        assert line in out.splitlines(), (line, out)
    assert re.search(r"^  held for:     \d+\.\ds$", out, re.MULTILINE)
    shown = json.loads(run("show", "reports/daily", format="json"))
    [h] = shown["holders"]
    assert {**h, "held_for": None} == {**holder, "held_for": None}  # exactly the 8 keys


def test_foreign_lock_is_listed_only_with_scan(db1: redis.Redis) -> None:
    """Another Redisson client (Java, Node) writes no index entry: --scan finds its lock,
    with what is unknown about the holder as nulls."""
    write_lock(db1, "demo:rlock:from-java", owner=f"{JAVA}:42", count=3)
    assert run("list") == "No locks under prefix 'demo:rlock:'.\n"
    assert json.loads(run("list", format="json")) == []
    [row] = table(run("list", "--scan"))
    assert row["HOLDER"] == f"{JAVA}:42" and row["HOLDS"] == "3"
    assert [row[k] for k in ("HOST", "PID", "PROCESS", "THREAD", "HELD")] == ["-"] * 5
    [info] = json.loads(run("list", "--scan", format="json"))
    assert info["holders"] == [{"client_id": JAVA, "thread_id": 42, "hold_count": 3, "host": None,
                                "pid": None, "process": None, "thread": None, "held_for": None}]
    out = run("show", "from-java")  # show reads the key itself: no listing involved
    assert "  process:      -" in out and "  os thread id: -" in out and f"  {JAVA}:42 -> 3" in out
    assert json.loads(run("show", "from-java", format="json"))["holders"][0]["pid"] is None
    assert not db1.exists("rlock-index:demo:rlock:")  # listing never writes the index


def test_gone_behind_the_index_is_not_listed_and_pruned(hold: Callable[..., RLock],
                                                        db1: redis.Redis) -> None:
    """Deleted or expired without the scripts knowing: not listed, and the entry pruned."""
    locks = [hold(get_lock(name)) for name in ("deleted", "expired", "live")]
    index = "rlock-index:demo:rlock:"
    assert sorted(db1.hkeys(index)) == sorted(lock.key.encode() for lock in locks)
    db1.delete("demo:rlock:deleted")
    db1.pexpire("demo:rlock:expired", 1)
    time.sleep(0.05)
    assert [d["name"] for d in json.loads(run("list", format="json"))] == ["live"]
    assert db1.hkeys(index) == [b"demo:rlock:live"]
    assert [row["NAME"] for row in table(run("list"))] == ["live"]


def test_listed_right_after_lock_returns(db1: redis.Redis) -> None:
    """The acquire script writes the index entry: no delay between lock() and the listing, and
    release removes it as it deletes the key."""
    lock = get_lock("fresh")
    lock.lock()
    try:
        [info] = json.loads(run("list", format="json"))
        assert info["name"] == "fresh" and info["holders"][0]["thread"] == threading.current_thread().name
    finally:
        lock.unlock()
    assert json.loads(run("list", format="json")) == []
    assert not db1.exists("rlock-index:demo:rlock:")


def test_list_match_and_empty(db1: redis.Redis) -> None:
    assert run("list") == "No locks under prefix 'demo:rlock:'.\n"
    assert json.loads(run("list", "--format", "json")) == []
    for name in ("report:1", "report:2", "email:1"):
        write_lock(db1, f"demo:rlock:{name}", indexed="demo:rlock:")
    for scan in ([], ["--scan"]):
        assert [d["name"] for d in json.loads(run("list", "--match", "report:*", "--format=json", *scan))
                ] == ["report:1", "report:2"]


def test_list_other_cache(settings: Any, redis_server: RedisServer) -> None:
    with redis_server.client(db=2) as c:
        write_lock(c, "site2:rlock:on-builtin", indexed="site2:rlock:")
    assert [d["name"] for d in json.loads(run("list", "--cache", "builtin", format="json"))] == [
        "on-builtin"]
    assert json.loads(run("list", format="json")) == []


def test_prefix_with_glob_characters(settings: Any, db1: redis.Redis) -> None:
    settings.RLOCK = {"PREFIX": "l[1]*:"}
    write_lock(db1, "l[1]*:mine", indexed="l[1]*:")
    write_lock(db1, "l1x:not-mine")  # would match the unescaped glob "l[1]*:*"
    assert glob_escape("l[1]*:") == r"l\[1\]\*:"
    assert LockInspector().names() == ["mine"]
    assert LockInspector().names(scan=True) == ["mine"]


def test_decode_responses_client(monkeypatch: pytest.MonkeyPatch, db1: redis.Redis,
                                 redis_server: RedisServer) -> None:
    write_lock(db1, "demo:rlock:text", owner="abc:5", count=3, indexed="demo:rlock:", host="web-1",
               pid=12, process="runserver", thread="Thread-3", os_thread_id=99)
    write_lock(db1, "demo:rlock:java", owner=f"{JAVA}:6")
    db1.hset("demo:rlock:plain", "k", "v")
    text_client = redis_server.client(db=DJANGO_REDIS_DB, decode_responses=True)
    monkeypatch.setattr("django_rlock.inspection.get_client", lambda alias: text_client)
    inspector = LockInspector()
    [info] = inspector.locks()
    holder = info.holders[0]
    assert (info.name, holder.client_id, holder.hold_count) == ("text", "abc", 3)
    assert (holder.host, holder.pid, holder.process, holder.thread) == ("web-1", 12, "runserver", "Thread-3")
    assert [i.name for i in inspector.locks(scan=True)] == ["java", "text"]
    assert inspector.show("text").fields == {"abc:5": "3"}  # type: ignore[union-attr]
    assert inspector.clear_all() == ["text"]
    assert inspector.clear_all(scan=True) == ["java"]
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
    write_lock(db1, "demo:rlock:cli", indexed="demo:rlock:")
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
    write_lock(db1, "demo:rlock:written")  # not in the index: only --scan finds it
    assert "Force-unlocked 1 lock(s)." in run("clear", "--all", "--no-input")
    assert not db1.exists("demo:rlock:held") and db1.exists("demo:rlock:written")
    assert run("clear", "--all", interactive=False) == "No locks to clear.\n"
    assert "Force-unlocked 1 lock(s)." in run("clear", "--all", "--scan", "--no-input")
    assert not db1.exists("demo:rlock:written")
    assert foreign_state(db1) == FOREIGN
    assert run("clear", "--all", "--scan", interactive=False) == "No locks to clear.\n"


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
    with pytest.raises(CommandError, match="--scan goes with --all"):
        run("clear", "a", "--scan", "--no-input")


def test_clear_asks_for_confirmation(monkeypatch: pytest.MonkeyPatch, db1: redis.Redis) -> None:
    write_lock(db1, "demo:rlock:keep", indexed="demo:rlock:")
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


def test_clear_signal_has_no_user(hold: Callable[..., RLock]) -> None:
    """The command force-unlocks as nobody in particular: lock_force_unlocked gets user=None."""
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    hold(get_lock("job"))
    lock_force_unlocked.connect(receiver)
    try:
        run("clear", "job", "--no-input")
    finally:
        lock_force_unlocked.disconnect(receiver)
    assert [(s["name"], s["user"]) for s in seen] == [("job", None)]


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


# -- what is never touched: an empty prefix over the cache's raw integers (user audit) -----
def test_empty_prefix_scan_never_lists_or_clears_cache_integers(
        settings: Any, hold: Callable[..., RLock], db1: redis.Redis) -> None:
    """``PREFIX ""`` (Redisson's bare names) puts every cache key under the glob, and
    django-redis stores an integer raw ("42"), just as a semaphore or latch is stored. Such a
    string is listed and cleared only if its index entry says it is ours: the cache's values
    survive ``clear --all --scan``; the real lock and latch beside them are cleared."""
    settings.RLOCK = {"PREFIX": ""}
    cache = caches["default"]
    cache.set("visits", 42, timeout=None)
    cache.set("page", "<html>", timeout=None)
    assert db1.get("demo:1:visits") == b"42"  # raw: an integer string at the top level
    db1.hincrby("stats", "page:12", 3)  # somebody's counters: a lock's layout, no client uuid
    hold(get_lock("ours"))
    latch = get_latch("ours-latch")
    assert latch.try_set_count(2)

    listed = {d["name"]: d["kind"] for d in json.loads(run("list", "--scan", format="json"))}
    assert listed == {"ours": "lock", "ours-latch": "latch"}
    assert {d["name"] for d in json.loads(run("list", format="json"))} == set(listed)

    err = StringIO()  # by name: refused, and said why
    out = StringIO()
    call_command("locks", "clear", "demo:1:visits", "--no-input", stdout=out, stderr=err)
    assert out.getvalue() == "No locks to clear.\n"
    assert "Not held: 'demo:1:visits': key 'demo:1:visits' exists but is not provably a lock" in (
        err.getvalue())
    with pytest.raises(CommandError, match="exists but is not provably a lock"):
        run("show", "demo:1:visits")

    assert "Force-unlocked 2 lock(s)." in run("clear", "--all", "--scan", "--no-input")
    assert not db1.exists("ours") and not db1.exists("ours-latch")
    assert cache.get("visits") == 42 and cache.get("page") == "<html>"
    assert db1.hgetall("stats") == {b"page:12": b"3"}
    assert run("clear", "--all", "--scan", interactive=False) == "No locks to clear.\n"
    assert cache.get("visits") == 42


def test_clear_without_a_terminal_fails_cleanly(redis_server: RedisServer, db1: redis.Redis
                                                ) -> None:
    """cron, CI, ``< /dev/null``: the prompt reads end of input, which is a no, and the
    command fails (exit 1) saying to pass --no-input, with no traceback."""
    write_lock(db1, "demo:rlock:cron", indexed="demo:rlock:")
    done = manage(redis_server, "clear", "cron", input="")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Pass --no-input" in done.stderr and "Traceback" not in done.stderr
    assert db1.exists("demo:rlock:cron")


def test_list_table_escapes_names_json_keeps_them(db1: redis.Redis) -> None:
    """A newline or a tab in a name would break the table's rows: the table shows the repr,
    the JSON the exact name."""
    for name in ("two\nlines", "tab\there", "plain"):
        write_lock(db1, f"demo:rlock:{name}", indexed="demo:rlock:")
    out = run("list")
    assert len(out.splitlines()) == 5  # header, three rows, the count
    assert [row["NAME"] for row in table(out)] == ["plain", "'tab\\there'", "'two\\nlines'"]
    assert [d["name"] for d in json.loads(run("list", format="json"))] == [
        "plain", "tab\there", "two\nlines"]
    assert "name: 'two\\nlines'" in run("show", "two\nlines").splitlines()
