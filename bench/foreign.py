"""(F) A foreign waiter: three django-rlock processes and one Redisson-style client on one key.

Issue #11's compatibility constraint, measured: a Java or Node Redisson client that waits on a
lock django-rlock processes also take must still be woken and get the lock, and django-rlock's
waiters must still wake on its release. Four spawned processes, one contender thread each,
contend for one key for the run's duration, each holding it ~1 ms (bench/contention.py's
harness: the same loop, counter, records and exclusion checks):

- processes 0-2 run django-rlock's ``RLock`` in watchdog mode;
- process 3 calls nothing of django-rlock and does what Redisson's ``RLock.tryLock(waitTime)``
  does: it runs Redisson's acquire script (``tryLockInnerAsync``; field ``<uuid>:<thread>``,
  lease 30 s); when that returns the holder's PTTL it SUBSCRIBEs (classic pub/sub, on a
  connection of its own) to ``redisson_lock__channel:{key}``, tries once more, then waits for a
  ``0`` there, or the PTTL, before each retry; once it holds the lock it UNSUBSCRIBEs without
  waiting for the reply, as Redisson does; it releases with Redisson's unlock script (``del`` and
  ``publish 0`` on the last hold). Redisson's lease renewal is left out: a ~1 ms hold never
  comes near the 30 s lease. That client is bench/redisson.py.

Reported: acquisitions per process; the foreign process's share against the mean of the
django-rlock processes (1.0: as many as each of them), and theirs; each side's worst and p99
wait; client commands per acquisition; hand-off gaps by direction. "Neither starved nor
starving": the foreign share and the django-rlock min-max shares within 0.5-2.0.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from . import contention
from .clients import FOREIGN, RLOCK
from .server import RedisServer
from .stats import percentile


@dataclass
class FResult:
    """All rounds of the foreign-waiter run; processes 0..rlock_procs-1 are django-rlock's,
    process ``rlock_procs`` the foreign one. Counts are totals over rounds (equal lengths)."""

    runs: list[contention.RunResult]
    rlock_procs: int

    @property
    def foreign(self) -> int:
        return self.rlock_procs

    @property
    def procs(self) -> list[int]:
        return [*range(self.rlock_procs), self.foreign]

    def label(self, proc: int) -> str:
        return FOREIGN if proc == self.foreign else f"{RLOCK} #{proc + 1}"

    def _records(self, procs: list[int]) -> list[contention.Record]:
        return [rec for r in self.runs for rec in r.records if rec[0] // 1000 in procs]

    def acquisitions(self, proc: int) -> int:
        return len(self._records([proc]))

    @property
    def rlock_mean(self) -> float:
        return sum(self.acquisitions(p) for p in range(self.rlock_procs)) / self.rlock_procs

    def share(self, proc: int) -> float:
        mean = self.rlock_mean
        return self.acquisitions(proc) / mean if mean else float("nan")

    @property
    def foreign_share(self) -> float:
        return self.share(self.foreign)

    @property
    def rlock_spread(self) -> tuple[float, float]:
        shares = [self.share(p) for p in range(self.rlock_procs)]
        return min(shares), max(shares)

    def waits_ms(self, procs: list[int]) -> list[float]:
        return sorted((rec[2] - rec[1]) / 1e6 for rec in self._records(procs))

    def max_wait_ms(self, procs: list[int]) -> float:
        w = self.waits_ms(procs)
        return w[-1] if w else float("nan")

    def wait_p99_ms(self, procs: list[int]) -> float:
        return percentile(self.waits_ms(procs), 99)

    def straight_back(self, proc: int) -> float:
        """Share of ``proc``'s acquisitions that followed its own release (nobody in between)."""
        own = back = 0
        for r in self.runs:
            for prev, nxt in itertools.pairwise(r.records):
                if nxt[0] // 1000 == proc:
                    own += 1
                    back += prev[0] == nxt[0]
        return back / own if own else float("nan")

    def client_per_acq(self, procs: list[int]) -> float:
        sent = sum(n for r in self.runs for p in procs for n in r.client_by_proc.get(p, {}).values())
        acq = len(self._records(procs))
        return sent / acq if acq else float("nan")

    def handoffs_ms(self, to_foreign: bool | None, from_foreign: bool | None) -> list[float]:
        """Gaps (next acquire returning - previous release called) where the process changed,
        filtered by whether the previous / next holder is the foreign one (None: either)."""
        out = []
        for r in self.runs:
            for prev, nxt in itertools.pairwise(r.records):
                p, n = prev[0] // 1000, nxt[0] // 1000
                if p == n or (from_foreign is not None and (p == self.foreign) != from_foreign) \
                        or (to_foreign is not None and (n == self.foreign) != to_foreign):
                    continue
                out.append((nxt[2] - prev[3]) / 1e6)
        return sorted(out)

    @property
    def checks_ok(self) -> bool:
        return all(r.counter_ok and not r.errors for r in self.runs)

    @property
    def errors(self) -> list[str]:
        return [e for r in self.runs for e in r.errors]


def run(server: RedisServer, rounds: int, duration_s: float, hold_s: float,
        rlock_procs: int = 3) -> FResult:
    mix = [RLOCK] * rlock_procs + [FOREIGN]
    runs = [contention.run_one(server, f"{RLOCK} + {FOREIGN}", len(mix), 1, duration_s, hold_s,
                               f"foreign:{r}", mix=mix)
            for r in range(rounds)]
    return FResult(runs, rlock_procs)
