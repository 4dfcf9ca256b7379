"""``manage.py locks list|show|clear``: see and force-unlock the live locks in Redis."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from django_rlock.inspect import LockInspector


def format_ttl(ttl: float) -> str:
    return "no expiry" if ttl == float("inf") else f"{ttl:.3f}s"


class Command(BaseCommand):
    help = "List, show or force-unlock django-rlock locks held in Redis."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{list,show,clear}")

        def command(name: str, help: str) -> CommandParser:
            p = sub.add_parser(name, help=help, description=help)
            p.add_argument("--cache", default=None,
                           help="Cache alias whose Redis holds the locks (default: RLOCK['CACHE']).")
            return p

        p = command("list", "List every live lock: name, holders (client id, thread id, hold count), TTL.")
        p.add_argument("--match", default="*", help="Only names matching this Redis glob (default: *).")
        p.add_argument("--format", choices=["table", "json"], default="table")

        p = command("show", "Show the raw hash and TTL of one lock.")
        p.add_argument("name")
        p.add_argument("--format", choices=["table", "json"], default="table")

        p = command("clear", "Force-unlock locks (delete them and wake their waiters).")
        p.add_argument("names", nargs="*", metavar="NAME")
        p.add_argument("--all", action="store_true", help="Force-unlock every live lock.")
        p.add_argument("--noinput", "--no-input", action="store_false", dest="interactive",
                       help="Do not ask for confirmation.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            inspector = LockInspector(options["cache"])
            getattr(self, f"handle_{options['subcommand']}")(inspector, **options)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except RedisError as exc:
            raise CommandError(f"Redis error: {exc}") from exc

    def handle_list(self, inspector: LockInspector, *, match: str, format: str, **options: Any) -> None:
        locks = inspector.locks(match)
        if format == "json":
            self.stdout.write(json.dumps([info.as_dict() for info in locks], indent=2))
            return
        if not locks:
            self.stdout.write(f"No locks under prefix {inspector.prefix!r}.")
            return
        header = ("NAME", "CLIENT ID", "THREAD ID", "HOLDS", "TTL")
        rows = [(info.name, h.client_id, str(h.thread_id), str(h.hold_count), format_ttl(info.ttl))
                for info in locks for h in info.holders]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        self.stdout.write(self.style.MIGRATE_HEADING(_row(header, widths)))
        for row in rows:
            self.stdout.write(_row(row, widths))
        self.stdout.write(f"{len(locks)} lock(s) under prefix {inspector.prefix!r}.")

    def handle_show(self, inspector: LockInspector, *, name: str, format: str, **options: Any) -> None:
        info = inspector.show(name)
        if info is None:
            raise CommandError(f"No lock {name!r} (key {inspector.prefix + name!r}) is held.")
        if format == "json":
            self.stdout.write(json.dumps({**info.as_dict(), "hash": info.fields}, indent=2))
            return
        self.stdout.write(f"name: {info.name}\nkey:  {info.key}\nttl:  {format_ttl(info.ttl)}\nhash:")
        for f, v in info.fields.items():
            self.stdout.write(f"  {f} -> {v}")

    def handle_clear(self, inspector: LockInspector, *, names: list[str], all: bool, interactive: bool,
                     **options: Any) -> None:
        if all == bool(names):
            raise CommandError("Give lock names or --all (not both).")
        targets = inspector.names() if all else [i.name for i in inspector.fetch(dict.fromkeys(names))]
        for missing in sorted(set(names) - set(targets)):
            self.stderr.write(f"Not held: {missing!r}")
        if not targets:
            self.stdout.write("No locks to clear.")
            return
        if interactive:
            self.stdout.write(f"About to force-unlock {len(targets)} lock(s) under prefix "
                              f"{inspector.prefix!r}: {_preview(targets)}\nTheir holders keep running "
                              f"without exclusion.")
            answer = input("Type 'yes' to continue, or 'no' to cancel: ")
            if answer != "yes":
                self.stdout.write("Cancelled; nothing was unlocked.")
                return
        cleared = inspector.clear(targets)
        self.stdout.write(self.style.SUCCESS(f"Force-unlocked {len(cleared)} lock(s)."))


def _row(cells: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _preview(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
