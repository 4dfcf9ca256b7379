"""What ``@locked`` costs per call, next to ``with get_lock(...)`` around the same view (#22).

    python bench/decorator.py [--rounds 7] [--seconds 1.0] [--baseline REF] [--markdown FILE]

``--markdown docs/benchmarks.md`` adds the tables as a section at the end of that page's Notes
(kept by ``bench/run.py`` when it regenerates the rest).

A Django project set up in this process as the tests' is (django-redis cache, an in-memory
SQLite database whose connection is open, ``django_rlock`` and so its Celery glue installed),
on a private redis-server reached on a unix socket and on loopback TCP. Each call is one
uncontended lock, the view, one release, with a ``RequestFactory`` request:

- ``floor``: two ``EVALSHA`` of ``return 1`` on the cache's client (the least a lock+unlock
  pair costs over it);
- ``bare view``: the view alone;
- ``with get_lock``: ``with get_lock(f"bench:{pk}"): view(request, pk=pk)``;
- ``@locked``: the view decorated with ``@locked("bench:{pk}")``, called as the URL resolver
  calls it (``view(request, pk=pk)``); ``until_commit=False``: the same without the check for
  an open database transaction (what that guarantee costs);
- ``(baseline)`` rows, with ``--baseline REF``: the same calls through ``django_rlock``'s
  ``decorators.py``, ``connection.py`` and ``transaction.py`` as they are at git revision REF
  (loaded beside the current ones; engine and settings are shared), for before/after in one
  run; their "+us" is against the baseline's own ``with get_lock``;
- the same for a plain function (``@locked("job:{n}")``, ``job(n)``), and for an async view
  (``@locked`` on ``async def``, vs ``async with`` the ``AsyncRLock`` the decorator builds).

The variants take turns in blocks of 50 calls (rotated order each round) so that load coming
and going on a shared machine lands on all alike; "+us" is the median over rounds of each
round's p50 minus that round's p50 of the same call made by hand (``with get_lock``, or
``async with``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make ``bench`` and ``django_rlock`` importable

from bench.stats import median, percentile  # noqa: E402
from django_rlock.testing import RedisServer, free_port  # noqa: E402

BLOCK = 50
#: Targets from the issue: ``@locked`` within this many us of ``with get_lock`` (p50).
MAX_OVERHEAD_US = 10.0


def setup_django(server: RedisServer) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench",
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_rlock"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        CACHES={
            "default": {"BACKEND": "django_redis.cache.RedisCache",
                        "LOCATION": f"{server.url}?db=1", "KEY_PREFIX": "bench"},
            "tcp": {"BACKEND": "django_redis.cache.RedisCache",
                    "LOCATION": f"redis://127.0.0.1:{server.port}/1", "KEY_PREFIX": "bench"},
        },
        RLOCK={},
        USE_TZ=True,
    )
    django.setup()
    from django.db import connection

    connection.ensure_connection()  # a project's request has usually touched the database


#: The modules of the Django layer a ``@locked`` call runs through, in import order.
BASELINE_MODULES = ("transaction", "decorators", "connection")


def load_baseline(ref: str) -> dict[str, Any]:
    """``django_rlock/{transaction,connection,decorators}.py`` as they are at git revision
    ``ref``, loaded beside the current ones as ``django_rlock._ref_<name>`` (importing each
    other, and the current engine and conf), the Celery hooks installed in the old
    decorators too. Returns name -> module."""
    loaded: dict[str, Any] = {}
    for base in BASELINE_MODULES:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:django_rlock/{base}.py"],
                                capture_output=True, text=True, check=True).stdout
        for other in BASELINE_MODULES:
            source = source.replace(f"from .{other} import", f"from ._ref_{other} import")
        name = f"django_rlock._ref_{base}"
        spec = importlib.util.spec_from_loader(name, loader=None, origin=f"{ref}:{base}.py")
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        module.__package__ = "django_rlock"
        sys.modules[name] = module
        exec(compile(source, f"<{ref}:django_rlock/{base}.py>", "exec"), module.__dict__)
        loaded[base] = module
    from django_rlock import decorators

    loaded["decorators"].register_task_hooks(decorators._task_hooks)
    return loaded


def sync_variants(transport: str, baseline: dict[str, Any] | None) -> dict[str, Callable[[], object]]:
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django_redis import get_redis_connection

    from django_rlock import get_lock, locked

    cache = None if transport == "unix" else "tcp"
    client = get_redis_connection(cache or "default", write=True)
    sha = client.script_load("return 1")
    request = RequestFactory().get("/report/1/")

    def view(request: Any, pk: int) -> HttpResponse:
        return HttpResponse(b"ok")

    def job(n: int) -> int:
        return n

    decorated = locked("bench:{pk}", cache=cache)(view)
    no_commit_wait = locked("bench:{pk}", cache=cache, until_commit=False)(view)
    decorated_job = locked("job:{n}", cache=cache)(job)

    def floor() -> None:
        client.evalsha(sha, 1, "bench:floor")
        client.evalsha(sha, 1, "bench:floor")

    def bare() -> None:
        view(request, pk=1)

    def with_get_lock() -> None:
        pk = 1
        with get_lock(f"bench:{pk}", cache=cache):
            view(request, pk=pk)

    def at_locked() -> None:
        decorated(request, pk=1)

    def job_with_get_lock() -> None:
        n = 1
        with get_lock(f"job:{n}", cache=cache):
            job(n)

    def job_locked() -> None:
        decorated_job(1)

    out: dict[str, Callable[[], object]] = {
        "floor (2 EVALSHA)": floor, "bare view": bare, "view: with get_lock": with_get_lock,
        "view: @locked": at_locked,
        "view: @locked(until_commit=False)": lambda: no_commit_wait(request, pk=1)}
    if baseline is not None:
        old_get_lock = baseline["connection"].get_lock
        old = baseline["decorators"].locked("bench:{pk}", cache=cache)(view)

        def old_with_get_lock() -> None:
            pk = 1
            with old_get_lock(f"bench:{pk}", cache=cache):
                view(request, pk=pk)

        out["view: with get_lock (baseline)"] = old_with_get_lock
        out["view: @locked (baseline)"] = lambda: old(request, pk=1)
    out["function: with get_lock"] = job_with_get_lock
    out["function: @locked"] = job_locked
    if baseline is not None:
        old_job = baseline["decorators"].locked("job:{n}", cache=cache)(job)

        def old_job_with_get_lock() -> None:
            n = 1
            with old_get_lock(f"job:{n}", cache=cache):
                job(n)

        out["function: with get_lock (baseline)"] = old_job_with_get_lock
        out["function: @locked (baseline)"] = lambda: old_job(1)
    return out


def async_variants(transport: str, baseline: dict[str, Any] | None) -> dict[str, Callable[[], Any]]:
    from django.http import HttpResponse
    from django.test import RequestFactory

    from django_rlock import AsyncRLock, connection, locked
    from django_rlock.conf import lock_options
    from django_rlock.engine.clients import async_twin

    cache = None if transport == "unix" else "tcp"
    request = RequestFactory().get("/areport/1/")

    async def view(request: Any, pk: int) -> HttpResponse:
        return HttpResponse(b"ok")

    decorated = locked("abench:{pk}", cache=cache)(view)

    def by_hand(conn: Any) -> Callable[[], Any]:
        async def step() -> None:
            pk = 1
            client = conn.get_client(cache)
            async with AsyncRLock(async_twin(client), f"abench:{pk}", conn.get_prefix(cache),
                                  sync_client=client, **lock_options()):
                await view(request, pk=pk)

        return step

    async def at_locked() -> None:
        await decorated(request, pk=1)

    out: dict[str, Callable[[], Any]] = {"async view: async with AsyncRLock": by_hand(connection),
                                         "async view: @locked": at_locked}
    if baseline is not None:
        old = baseline["decorators"].locked("abench:{pk}", cache=cache)(view)

        async def at_old() -> None:
            await old(request, pk=1)

        out["async view: async with AsyncRLock (baseline)"] = by_hand(baseline["connection"])
        out["async view: @locked (baseline)"] = at_old
    return out


def timed_rounds(steps: dict[str, Callable[[], Any]], rounds: int, seconds: float,
                 run_async: bool) -> dict[str, list[tuple[float, float]]]:
    """Per variant, per round: (p50 us, mean us). Variants take turns in blocks of BLOCK."""
    names = list(steps)
    out: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    loop = asyncio.new_event_loop() if run_async else None

    async def ablock(step: Callable[[], Any], lat: list[int]) -> None:
        now = time.perf_counter_ns
        for _ in range(BLOCK):
            t = now()
            await step()
            lat.append(now() - t)

    def block(step: Callable[[], Any], lat: list[int]) -> None:
        if loop is not None:
            loop.run_until_complete(ablock(step, lat))
            return
        now = time.perf_counter_ns
        for _ in range(BLOCK):
            t = now()
            step()
            lat.append(now() - t)

    try:
        for name in names:  # warm-up: scripts loaded, clients and twins made
            block(steps[name], [])
            block(steps[name], [])
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            lat: dict[str, list[int]] = {n: [] for n in order}
            gc.collect()
            end = time.perf_counter() + seconds * len(order)
            while time.perf_counter() < end:
                for name in order:
                    block(steps[name], lat[name])
            for name in order:
                values = sorted(lat[name])
                out[name].append((percentile(values, 50) / 1e3, sum(values) / len(values) / 1e3))
    finally:
        if loop is not None:
            loop.close()
    return out


def reference_of(name: str) -> str | None:
    """The variant a row's "+us" is taken against (None: no "+us"): the same call made by
    hand, with the same code (a baseline row against the baseline's ``get_lock``)."""
    tail = " (baseline)" if name.endswith(" (baseline)") else ""
    for kind, ref in (("view: @locked", "view: with get_lock"),
                      ("function: @locked", "function: with get_lock"),
                      ("async view: @locked", "async view: async with AsyncRLock")):
        if name.startswith(kind):
            return ref + tail
    return None


def summarize(results: dict[str, list[tuple[float, float]]],
              ) -> list[tuple[str, float, float, float | None, int]]:
    """Rows: variant, p50 us, mean us (medians of rounds), +us p50 vs its reference, rounds."""
    rows = []
    for name, per_round in results.items():
        p50s = [p for p, _ in per_round]
        ref = reference_of(name)
        delta = None if ref is None else median(
            [p - q for p, (q, _) in zip(p50s, results[ref], strict=True)])
        rows.append((name, median(p50s), median([m for _, m in per_round]), delta, len(per_round)))
    return rows


def render(tables: list[tuple[str, list[tuple[str, float, float, float | None, int]]]],
           markdown: bool) -> str:
    parts = []
    for title, rows in tables:
        if markdown:
            lines = [f"**{title}**", "",
                     "| call | p50 us | mean us | +us p50 |", "|---|---:|---:|---:|"]
            lines += [f"| {n} | {p:,.1f} | {m:,.1f} | {'' if d is None else f'{d:+.1f}'} |"
                      for n, p, m, d, _ in rows]
        else:
            w = max(len(n) for n, *_ in rows)
            lines = [title,
                     f"{'call':{w}}  {'p50 us':>8}  {'mean us':>8}  {'+us p50':>8}"]
            lines += [f"{n:{w}}  {p:8.1f}  {m:8.1f}  {'' if d is None else f'{d:+8.1f}':>8}"
                      for n, p, m, d, _ in rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def write_section(path: Path, section: str) -> None:
    """Put ``section`` at the end of the page's hand-written Notes (which ``bench/run.py``
    keeps when it regenerates the page), or at the end of the file if it has none."""
    from bench.report import NOTES_END

    text = path.read_text() if path.exists() else ""
    if NOTES_END in text:
        at = text.rindex(NOTES_END)
        text = text[:at].rstrip("\n") + "\n" + section.rstrip("\n") + "\n" + text[at:]
    else:
        text += section
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=1.0, help="per variant per round")
    ap.add_argument("--transport", choices=["unix", "tcp", "both"], default="both")
    ap.add_argument("--no-async", action="store_true", help="skip the async view")
    ap.add_argument("--baseline", metavar="REF",
                    help="also time @locked from django_rlock/decorators.py at this git revision")
    ap.add_argument("--markdown", metavar="FILE",
                    help="add the tables as a section at the end of FILE's Notes")
    args = ap.parse_args(argv)
    command = shlex.join(["python", "bench/decorator.py", *(argv if argv is not None else sys.argv[1:])])
    transports = ["unix", "tcp"] if args.transport == "both" else [args.transport]
    tables = []
    with RedisServer(port=free_port()) as server:
        setup_django(server)
        import redis

        baseline = load_baseline(args.baseline) if args.baseline else None
        version = server.client().info("server")["redis_version"]
        for transport in transports:
            print(f"[{transport}] sync variants ...", file=sys.stderr, flush=True)
            res = timed_rounds(sync_variants(transport, baseline), args.rounds, args.seconds, False)
            tables.append((f"{transport}: sync", summarize(res)))
            if not args.no_async:
                print(f"[{transport}] async variants ...", file=sys.stderr, flush=True)
                ares = timed_rounds(async_variants(transport, baseline), args.rounds,
                                    args.seconds, True)
                tables.append((f"{transport}: async", summarize(ares)))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip() or "?"
    head = (f"redis-server {version}, redis-py {redis.__version__}, Python "
            f"{platform.python_version()}, django-rlock git {rev}; {args.rounds} rounds x "
            f"{args.seconds:g} s per variant, blocks of {BLOCK} calls; `@locked` target: "
            f"<= +{MAX_OVERHEAD_US:g} us p50 over `with get_lock`.")
    print(head + "\n")
    print(render(tables, markdown=False))
    if args.markdown:
        section = ["", "### `@locked` per call (bench/decorator.py, issue #22)", "",
                   "```", command, "```", "", head, "", render(tables, markdown=True), ""]
        write_section(Path(args.markdown), "\n".join(section))
        print(f"\nwrote a section into {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
