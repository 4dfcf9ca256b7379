"""(W, inline) The watchdog's renewals against its floor, sent at the watchdog's own pace.

``bench.renewal`` runs the floor in a process of its own, which sends its 100 pipelines back
to back; the watchdog sends them ~4-7 ms apart (its client work between two pipelines), and
the variants take turns of a minute each, on a machine whose load moves more than that. Here
one spawned process holds the locks in watchdog mode and its watchdog, as it runs, sends in
turn (switched every few periods, rotated each round):

- ``PEXPIRE`` per key: the floor, in the watchdog's pipelines, at its pace;
- this tree's ``renew_many.lua``;
- with ``--baseline REF``, REF's ``renew_many.lua`` (same arguments and reply).

Only what a pipeline carries changes (the locks' client queues a ``PEXPIRE`` per key where
the watchdog queues a script, or ``RENEW_MANY_SCRIPT`` is swapped; the sweep, the batching
and the pacing are the watchdog's own). Server CPU (``INFO cpu``) per key renewed, over
whole periods after a period of warm-up; the commands the server ran per key, to check that
each variant sent what it says::

    python -m bench.renewal_inline [--locks 100000] [--rounds 10] [--baseline REF]
"""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

import redis
import redis.client

from .baseline import extract
from .renewal import commands, server_sample, spawn
from .server import RedisServer

FLOOR = "PEXPIRE per key (floor, the watchdog's pace)"


class Switch:
    """Whether the watchdog's renew scripts go out as ``PEXPIRE`` per key (the floor)."""

    floor = False


class FloorPipeline(redis.client.Pipeline):
    """A pipeline that, while ``Switch.floor``, queues a ``renew_many.lua`` call (KEYS, then
    owner, lease, count per run) as one ``PEXPIRE`` per key instead, and answers it as the
    script does when nothing is lost: ``[]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shapes: list[int] = []  # per command queued: 0 itself, n: n PEXPIREs as one

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        if not Switch.floor:
            self.shapes.append(0)
            return super().evalsha(sha, numkeys, *keys_and_args)
        lease = keys_and_args[numkeys + 1]
        for key in keys_and_args[:numkeys]:
            super().pexpire(key, lease)
        self.shapes.append(numkeys)
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies = super().execute(raise_on_error)
        if not any(self.shapes):
            self.shapes = []
            return replies
        out, i = [], 0
        for n in self.shapes:
            out.append(replies[i] if not n else [])
            i += n or 1
        out.extend(replies[i:])  # anything queued otherwise (a WAIT)
        self.shapes = []
        return out


class Client(redis.Redis):
    """A client whose pipelines are ``FloorPipeline`` objects."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return FloorPipeline(self.connection_pool, self.response_callbacks, transaction,
                             shard_hint)


def _child(socket_path: str, n: int, watchdog_timeout: float, rounds: int, warm: float,
           measure: float, baseline: str | None, out: Any, code: str | None = None) -> None:
    try:
        from django_rlock import RLock
        from django_rlock.engine import renewal
        from django_rlock.engine.scripts import Script
        from django_rlock.engine.watchdog import watchdog

        client = Client(unix_socket_path=socket_path)
        stats = redis.Redis(unix_socket_path=socket_path)
        locks = [RLock(client, f"bench:i:{i}", watchdog_timeout=watchdog_timeout)
                 for i in range(n)]
        for lk in locks:
            lk.lock()
        period = watchdog_timeout / 3.0
        scripts = {"renew_many.lua (this tree)": renewal.RENEW_MANY_SCRIPT}
        if baseline is not None:
            scripts["renew_many.lua (baseline)"] = Script(baseline)

        def use(variant: str) -> None:
            Switch.floor = variant == FLOOR
            if not Switch.floor:
                renewal.RENEW_MANY_SCRIPT = scripts[variant]

        names = [FLOOR, *scripts]
        res: dict[str, list[float]] = {v: [] for v in names}
        ran: dict[str, dict[str, float]] = {}  # per variant, its last turn's commands per key
        wd = watchdog()
        time.sleep(2 * period)  # the acquires' burst settles into the sweep's schedule
        for rnd in range(rounds):
            for v in names[rnd % len(names):] + names[:rnd % len(names)]:
                use(v)
                time.sleep(warm * period)
                n0, c0, cpu0 = wd.renewed, commands(stats), server_sample(stats)[2]
                time.sleep(measure * period)
                n1, cpu1, c1 = wd.renewed, server_sample(stats)[2], commands(stats)
                res[v].append((cpu1 - cpu0) * 1e3 / max(1, n1 - n0))  # us per key
                ran[v] = {k: (c - c0.get(k, 0)) / max(1, n1 - n0) for k, c in c1.items()
                          if c > c0.get(k, 0) and k != "info"}
        use(names[1])
        lost = sum(1 for lk in locks if lk.is_lost())
        for lk in locks:
            lk.unlock()
        out.put(("ok", (res, ran, lost)))
    except Exception:
        out.put(("error", traceback.format_exc()))


def main(argv: list[str] | None = None) -> int:
    import argparse
    import statistics

    from bench import renewal_inline  # by its importable name (the spawned child)

    from .renewal import baseline_source

    ap = argparse.ArgumentParser(description="watchdog renewals vs PEXPIRE, at its own pace")
    ap.add_argument("--locks", type=int, default=100_000)
    ap.add_argument("--timeout", type=float, default=3.0, help="watchdog_timeout (s)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warm", type=float, default=1.0, help="periods left out after a switch")
    ap.add_argument("--measure", type=float, default=2.0, help="periods measured per turn")
    ap.add_argument("--baseline", metavar="REF", help="also REF's renew_many.lua")
    args = ap.parse_args(argv)
    base_src = baseline_source(extract(args.baseline)) if args.baseline else None
    with RedisServer() as server:
        res, ran, lost = spawn(renewal_inline._child,
                          (server.socket_path, args.locks, args.timeout, args.rounds,
                           args.warm, args.measure, base_src),
                          300 + args.locks / 300 + args.rounds * 3 * (args.warm + args.measure)
                          * args.timeout / 3, None)
    floor = res[FLOOR]
    print(f"{args.locks:,} held locks, watchdog_timeout {args.timeout:g} s, {args.rounds} "
          f"rounds of {args.measure:g} measured periods per variant (after {args.warm:g} of "
          f"warm-up), in turns in one watchdog process, unix socket; {lost} locks lost\n")
    print("| sent by the watchdog | server CPU us/key | x floor (median of rounds) | each round |")
    print("|---|---|---|---|")
    for v, xs in res.items():
        ratios = [x / f for x, f in zip(xs, floor, strict=True)]
        print(f"| {v} | {statistics.median(xs):.2f} | {statistics.median(ratios):.2f} | "
              f"{', '.join(f'{r:.2f}' for r in ratios)} |")
    print("\nCommands the server ran per key renewed (a variant's last turn):\n")
    for v, per in ran.items():
        print(f"- {v}: " + ", ".join(f"{k} {x:.3f}" for k, x in sorted(per.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
