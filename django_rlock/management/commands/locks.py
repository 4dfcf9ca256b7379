"""``manage.py locks list|show|clear|doctor``: see and force-unlock the live locks in Redis,
and check the health of the lock machinery and the server's settings (``doctor``).

Every kind of the family is shown (KIND: lock, fair, rw, semaphore, permits, latch, fenced, leader)
with its details: permits available and taken, a latch's count, a read-write lock's mode,
readers and writer, a fair lock's queue, a fenced lock's token. A plain integer string that no
index entry names is never listed nor cleared (it may be a cache value); ``clear NAME`` and
``show NAME`` of one say so and leave it alone.

The table form shows a name (or any cell) that is not printable (a newline, a tab) in Python's
repr, quoted, so a row stays one line; ``--format json`` keeps the exact names.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from django_rlock.engine import kinds
from django_rlock.health import doctor, doctor_lines
from django_rlock.inspection import Holder, LockInfo, LockInspector

#: Shown for what is unknown: holders another Redisson client wrote have no index entry.
UNKNOWN = "-"
SCAN_HELP = ("Walk the whole keyspace with SCAN instead of reading the index: also finds locks "
             "taken by other Redisson clients (Java, Node), but visits every key in the database.")


def format_ttl(ttl: float) -> str:
    return "no expiry" if ttl == float("inf") else f"{ttl:.3f}s"


def format_held(seconds: float | None) -> str:
    return UNKNOWN if seconds is None else f"{seconds:.1f}s"


def _cell(value: Any) -> str:
    return UNKNOWN if value is None else printable(str(value))


def printable(text: str) -> str:
    """``text`` for a table or a line of text: as is if printable, else its repr (quoted,
    ``\\n`` for a newline), so a name with a newline or a tab cannot break the layout."""
    return text if text.isprintable() else repr(text)


def _not_a_lock(inspector: LockInspector, name: str) -> str:
    """Why a key that exists is left alone (``clear NAME``, ``show NAME``)."""
    return (f"key {inspector.prefix + name!r} exists but is not provably a lock (no index entry "
            f"names it and its layout proves no kind: a plain integer string may be a cache "
            f"value, and a Redisson semaphore or latch looks the same); left untouched")


class Command(BaseCommand):
    help = "List, show or force-unlock django-rlock locks held in Redis."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True,
                                    metavar="{list,show,clear,doctor}")

        def command(name: str, help: str) -> CommandParser:
            p = sub.add_parser(name, help=help, description=help)
            p.add_argument("--cache", default=None,
                           help="Cache alias whose Redis holds the locks (default: RLOCK['CACHE']).")
            return p

        p = command("list", "List every live lock: name, kind, holders (client id, thread id, hold "
                            "count, host, pid, process, thread, how long held), TTL, how many "
                            "wait for it, the kind's details.")
        p.add_argument("--match", default="*", help="Only names matching this Redis glob (default: *).")
        p.add_argument("--format", choices=["table", "json"], default="table")
        p.add_argument("--scan", action="store_true", help=SCAN_HELP)

        p = command("show", "Show one lock: its kind, holders, TTL, the kind's details (a fair "
                            "lock's queue, each permit's lease), who waits for it (since when) "
                            "and raw hash or value.")
        p.add_argument("name")
        p.add_argument("--format", choices=["table", "json"], default="table")

        p = command("clear", "Force-unlock locks of any kind (delete them, with a fair lock's queue "
                             "and a semaphore's permits, and wake their waiters).")
        p.add_argument("names", nargs="*", metavar="NAME")
        p.add_argument("--all", action="store_true", help="Force-unlock every live lock.")
        p.add_argument("--scan", action="store_true", help=f"With --all: {SCAN_HELP}")
        p.add_argument("--noinput", "--no-input", action="store_false", dest="interactive",
                       help="Do not ask for confirmation.")

        p = command("doctor", "Check the locks' health (Redis reachable, watchdog, pub/sub, "
                              "replicas, holds in doubt) and the server settings that break "
                              "locks, each with its fix. Exits 1 when something is wrong.")
        p.add_argument("--format", choices=["table", "json"], default="table")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["subcommand"] == "doctor":  # reports an unreachable server, never raises
            try:
                report = doctor(options["cache"])
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(json.dumps(report, indent=2) if options["format"] == "json"
                              else "\n".join(doctor_lines(report, self.style)))
            if not report["ok"]:
                raise CommandError("something is wrong with the locks (see above)", returncode=1)
            return
        try:
            inspector = LockInspector(options["cache"])
            getattr(self, f"handle_{options['subcommand']}")(inspector, **options)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except RedisError as exc:
            raise CommandError(f"Redis error: {exc}") from exc

    def handle_list(self, inspector: LockInspector, *, match: str, format: str, scan: bool,
                    **options: Any) -> None:
        locks = inspector.locks(match, scan=scan)
        if format == "json":
            self.stdout.write(json.dumps([info.as_dict() for info in locks], indent=2))
            return
        if not locks:
            self.stdout.write(f"No locks under prefix {inspector.prefix!r}.")
            return
        header = ("NAME", "KIND", "HOLDER", "HOLDS", "HOST", "PID", "PROCESS", "THREAD", "HELD",
                  "TTL", "WAITING", "DETAILS")
        rows = [(printable(info.name), info.kind, *_holder_cells(h), format_ttl(info.ttl),
                 str(len(info.waiters)), info.summary())
                for info in locks for h in (info.holders or (None,))]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        self.stdout.write(self.style.MIGRATE_HEADING(_row(header, widths)))
        for row in rows:
            self.stdout.write(_row(row, widths))
        self.stdout.write(f"{len(locks)} lock(s) under prefix {inspector.prefix!r}.")

    def handle_show(self, inspector: LockInspector, *, name: str, format: str, **options: Any) -> None:
        info = inspector.show(name)
        if info is None:
            if inspector.exists(name):
                raise CommandError(f"No lock {name!r}: {_not_a_lock(inspector, name)}.")
            raise CommandError(f"No lock {name!r} (key {inspector.prefix + name!r}) is held.")
        if format == "json":
            self.stdout.write(json.dumps(_show_json(info), indent=2))
            return
        self.stdout.write(f"name: {printable(info.name)}\nkey:  {printable(info.key)}\n"
                          f"ttl:  {format_ttl(info.ttl)}\n"
                          f"kind: {info.kind}")
        for line in _show_details(info):
            self.stdout.write(line)
        for h in info.holders:
            self.stdout.write(_show_holder(h))
        self.stdout.write(f"waiting: {len(info.waiters)}")
        for w in info.waiters:
            self.stdout.write(_show_waiter(w))
        if info.value is not None:
            self.stdout.write(f"value: {printable(info.value)}")
            return
        self.stdout.write("hash:")
        for f, v in info.fields.items():
            self.stdout.write(f"  {printable(f)} -> {printable(v)}")

    def handle_clear(self, inspector: LockInspector, *, names: list[str], all: bool, scan: bool,
                     interactive: bool, **options: Any) -> None:
        if all == bool(names):
            raise CommandError("Give lock names or --all (not both).")
        if scan and not all:
            raise CommandError("--scan goes with --all (named locks are read directly).")
        targets = (inspector.names(scan=scan) if all
                   else [i.name for i in inspector.fetch(dict.fromkeys(names))])
        for name in sorted(set(names) - set(targets)):
            # A key that is there but not provably a lock may be a cache value: never deleted.
            why = f": {_not_a_lock(inspector, name)}" if inspector.exists(name) else ""
            self.stderr.write(f"Not held: {name!r}{why}")
        if not targets:
            self.stdout.write("No locks to clear.")
            return
        if interactive:
            self.stdout.write(f"About to force-unlock {len(targets)} lock(s) under prefix "
                              f"{inspector.prefix!r}: {_preview(targets)}\nTheir holders keep running "
                              f"without exclusion.")
            try:
                answer = input("Type 'yes' to continue, or 'no' to cancel: ")
            except EOFError:  # no terminal (cron, CI, < /dev/null): no answer is a no
                raise CommandError("No answer to the confirmation (standard input is closed); "
                                   "nothing was unlocked. Pass --no-input to force-unlock "
                                   "without asking.") from None
            if answer != "yes":
                self.stdout.write("Cancelled; nothing was unlocked.")
                return
        # No force_unlocked_by() here: the lock_force_unlocked signal reports user=None.
        cleared = inspector.clear(targets)
        self.stdout.write(self.style.SUCCESS(f"Force-unlocked {len(cleared)} lock(s)."))


def _show_json(info: LockInfo) -> dict[str, Any]:
    """``as_dict()`` (holders with exactly the documented keys, the kind and its details) plus
    the raw hash, or the raw value of a string kind; the table form of ``show`` also gives
    each holder's OS thread id."""
    data = info.as_dict()
    if info.value is not None:
        data["raw"] = info.value
    else:
        data["hash"] = info.fields
    return data


def _holder_cells(h: Holder | None) -> tuple[str, ...]:
    """HOLDER .. HELD of a list row; a kind without owners (semaphore, latch) has none."""
    if h is None:
        return (UNKNOWN,) * 7
    return (h.field, str(h.hold_count), _cell(h.host), _cell(h.pid), _cell(h.process),
            _cell(h.thread), format_held(h.held_for))


def _show_details(info: LockInfo) -> list[str]:
    """The kind's details, one line each (``show``'s table form): the kind says how."""
    kind = kinds.get(info.kind)
    if kind is not None and kind.lines is not None:
        return kind.lines(info.details)
    return [f"{key}: {_cell(value)}" for key, value in info.details.items()]


def _show_holder(h: Holder) -> str:
    lines = [("holder", h.field), ("  hold count", h.hold_count),
             ("  host", h.host), ("  pid", h.pid), ("  process", h.process), ("  thread", h.thread),
             ("  os thread id", h.os_thread_id), ("  held for", format_held(h.held_for))]
    return "\n".join(f"{label + ':':<16}{_cell(value)}" for label, value in lines)


def _show_waiter(w: Any) -> str:
    """One waiter (``waiters.Waiter``): who, where, since when (server time)."""
    since = datetime.datetime.fromtimestamp(w.since, datetime.UTC)
    lines = [("waiter", w.owner), ("  host", w.host), ("  pid", w.pid),
             ("  process", w.process), ("  thread", w.thread),
             ("  since", since.isoformat(timespec="milliseconds")),
             ("  waiting for", format_held(w.waiting_for))]
    return "\n".join(f"{label + ':':<16}{_cell(value)}" for label, value in lines)


def _row(cells: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _preview(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(map(printable, names[:limit]))
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
