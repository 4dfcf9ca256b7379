"""``@limited``: at most N concurrent runs of a view, a task or a function.

Each run takes one permit of a ``PermitExpirableSemaphore`` named from the template (the same
templating as ``@locked``) and gives it back when it ends (after the transaction around it,
as ``@locked`` does with ``until_commit``). A permit is held in watchdog mode: renewed while
the run lives, back within ``WATCHDOG_TIMEOUT`` if its process dies.

It runs through ``@locked``'s code path: ``LimitSpec`` is a ``LockSpec`` whose "lock" is one
permit (``PermitCall``) behind the lock API that path uses (``try_lock``, ``unlock``,
``remaining_ttl``), so busy calls are answered exactly as ``@locked``'s are: a view gets
429 Too Many Requests with ``Retry-After``, a Celery task skips, waits or retries.

The permits are set on first use in each process (``try_set_permits``: only where the
semaphore has none). A semaphore that already has a different number (``permits`` changed in
a deploy) keeps its own and a warning is logged once per process: old and new code run side
by side during a deploy, and two numbers fighting over one key would cap nothing. Change it
deliberately with ``get_semaphore(name).add_permits(new - old)``, or delete the key when idle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .decorators import LockSpec, decorator
from .engine.clients import for_key
from .engine.lock import check_seconds
from .engine.naming import suffix_name
from .lockkinds import async_clients, check_permits

#: The name this module gave ``lockkinds.async_clients`` first.
client_pair = async_clients

logger = logging.getLogger("django_rlock")

F = TypeVar("F", bound=Callable[..., Any])

#: Retry-After (seconds) when no permit has an expiry to point at.
DEFAULT_RETRY_AFTER = 1.0
#: Seconds an idle semaphore of ``@limited`` lives on (no permit taken).
IDLE_EXPIRY = 600.0
#: Redisson's score of a permit that never expires.
_NEVER_MS = 922337203685477

# (server, key) -> permits this process has set up; guarded by _init_lock.
_ready: dict[tuple[Any, str], int] = {}
_init_lock = threading.Lock()


def _server(client: Any) -> Any:
    from .engine.watchdog import server_id

    try:
        return server_id(client)
    except Exception:  # pragma: no cover - an odd client: one entry per client object
        return id(client)


def timeout_key(sem: Any) -> str:
    """The zset of a permit semaphore's taken permits (member: id, score: expiry in ms)."""
    return getattr(sem, "timeout_key", None) or suffix_name(sem.key, "timeout")


class PermitCall:
    """One call's permit of a ``PermitExpirableSemaphore``, behind the lock API of ``@locked``.

    ``try_lock`` takes a permit (its id kept in ``permit_id``), ``unlock`` gives it back,
    ``remaining_ttl`` is the nearest expiry of a taken permit (what ``Retry-After`` says).
    """

    def __init__(self, sem: Any, permits: int, sync_client: Any, async_client: Any = None) -> None:
        self._sem = sem
        self._async = async_client
        self.permits = permits
        self.permit_id: str | None = None
        self.name: str = sem.name
        self.key: str = sem.key
        self.prefix: str = sem.prefix
        self._sync = sync_client
        self._k = (_server(sync_client), self.key)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} permits={self.permits} id={self.permit_id}>"

    @property
    def client(self) -> Any:
        return self._sync

    # -- permits set on first use --------------------------------------------------------------
    def _first_use(self) -> bool:
        with _init_lock:
            return _ready.get(self._k) != self.permits

    def _set_up(self, created: bool) -> None:
        """After ``try_set_permits``: remember it, and say so if another count is stored."""
        with _init_lock:
            _ready[self._k] = self.permits
        if created:
            return
        free, taken = self._counts()
        total = None if free is None else free + taken
        if total is not None and total != self.permits:
            logger.warning(
                "django-rlock: semaphore %r has %d permits, not the %d of @limited(permits=%d);"
                " it keeps %d (change it with get_semaphore(%r).add_permits(%d))", self.name,
                total, self.permits, self.permits, total, self.name, self.permits - total)

    def _counts(self) -> tuple[int | None, int]:
        """Permits free (None: no semaphore) and taken, as stored (on a cluster, sent on the
        key's master: redis-py 5's cluster pipeline refuses a transaction)."""
        pipe = for_key(self._sync, self.key).pipeline(transaction=True)
        pipe.get(self.key)
        pipe.zcard(timeout_key(self._sem))
        free, taken = pipe.execute()
        return (None if free is None else int(free)), int(taken)

    # -- the lock API -------------------------------------------------------------------------
    def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        if self._first_use():
            self._set_up(bool(self._sem.try_set_permits(self.permits)))
        self.permit_id = self._sem.try_acquire(wait_time, lease_time)
        if self.permit_id is None and self._sem.try_set_permits(self.permits):
            # The semaphore was gone (deleted, e.g. by `locks clear`): set up again, one more go.
            self.permit_id = self._sem.try_acquire(0.0, lease_time)
        return self.permit_id is not None

    def unlock(self) -> None:
        permit, self.permit_id = self.permit_id, None
        if permit is not None:
            self._sem.release(permit)

    def remaining_ttl(self) -> float | None:
        """Seconds to the nearest expiry of a taken permit (renewed ones: about the watchdog
        timeout), or ``DEFAULT_RETRY_AFTER``.

        Sent on the semaphore's own client: on a cluster, its slot's master (a cluster client
        refuses TIME in a pipeline, which would make every busy call an error)."""
        pipe = self._sem.client.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(timeout_key(self._sem), 0, 0, withscores=True)
        now, first = pipe.execute()
        return _ttl(now, first)

    def describe_holders(self) -> str:
        """For the skip log line: how many permits are taken."""
        try:
            free, taken = self._counts()
        except Exception:
            return "?"
        return f"{taken} permit holders ({free or 0} of {(free or 0) + taken} permits free)"


def _ttl(now: Any, first: list[tuple[Any, float]]) -> float:
    if not first or first[0][1] >= _NEVER_MS:
        return DEFAULT_RETRY_AFTER
    now_ms = now[0] * 1000 + now[1] / 1000
    return max(0.0, (first[0][1] - now_ms) / 1000)


class AsyncPermitCall(PermitCall):
    """``PermitCall`` on an ``AsyncPermitExpirableSemaphore`` (async views)."""

    async def try_lock(self, wait_time: float = 0.0,  # type: ignore[override]
                       lease_time: float | None = None) -> bool:
        if self._first_use():
            self._set_up(bool(await self._sem.try_set_permits(self.permits)))
        self.permit_id = await self._sem.try_acquire(wait_time, lease_time)
        if self.permit_id is None and await self._sem.try_set_permits(self.permits):
            self.permit_id = await self._sem.try_acquire(0.0, lease_time)
        return self.permit_id is not None

    async def unlock(self) -> None:  # type: ignore[override]
        permit, self.permit_id = self.permit_id, None
        if permit is not None:
            await self._sem.release(permit)

    async def remaining_ttl(self) -> float | None:  # type: ignore[override]
        pipe = self._sem.client.pipeline(transaction=False)  # (as the sync one's)
        pipe.time()
        pipe.zrange(timeout_key(self._sem), 0, 0, withscores=True)
        now, first = await pipe.execute()
        return _ttl(now, first)


class LimitSpec(LockSpec):
    """A parsed ``@limited(...)``: a ``LockSpec`` whose locks are permits."""

    decorator = "@limited"
    drop_redelivered = False  # busy permits say nothing about this message's first delivery

    def __init__(self, template: str | Callable[..., str], permits: int, wait: float,
                 on_busy: str | Callable[..., Any] | None, cache: str | None, client: Any,
                 prefix: str | None, status: int | None, until_commit: bool,
                 idle_expiry: float | None = None) -> None:
        label = template if isinstance(template, str) else getattr(template, "__name__", "callable")
        if isinstance(cache, (list, tuple)):
            raise ValueError(f"@limited takes one cache alias, not a list (semaphore {label!r})")
        self.permits = check_permits(permits, str(label))
        self.idle_expiry = None if idle_expiry is None else check_seconds(
            idle_expiry, "idle_expiry", str(label), zero_ok=False)
        super().__init__(template, wait, None, on_busy, cache, client, prefix, status, False,
                         until_commit)

    def _watchdog(self) -> float:
        return float(self._options().get("watchdog_timeout", 30.0))

    def sync_lock(self, name: str) -> PermitCall:
        from .engine.semaphore import PermitExpirableSemaphore

        client, prefix, _ = self.where()
        sem = PermitExpirableSemaphore(client, name, prefix, watchdog_timeout=self._watchdog(),
                                       idle_expiry=self.idle_expiry, label=self.label)
        return PermitCall(sem, self.permits, client)

    def async_lock(self, name: str) -> AsyncPermitCall:
        from .engine.semaphore import AsyncPermitExpirableSemaphore

        client, prefix, _ = self.where()
        aclient, sync, engine_sync = async_clients(client)
        sem = AsyncPermitExpirableSemaphore(aclient, name, prefix,
                                            watchdog_timeout=self._watchdog(),
                                            sync_client=engine_sync, idle_expiry=self.idle_expiry,
                                            label=self.label)
        return AsyncPermitCall(sem, self.permits, sync, aclient)

    def busy_status(self) -> int:
        return 429 if self.status is None else self.status

    def busy_text(self, name: str, ttl: float | None) -> str:
        return (f"semaphore {name!r} has no free permit (all {self.permits} taken"
                f"{'' if ttl is None else f', the first expires in {ttl:.3f} s'}); gave up "
                f"after {self.wait:g} s")

    busy_code = "too_many_requests"

    def busy_body(self, name: str | None, retry_after: int) -> str:
        what = "this resource" if name is None else repr(name)
        return (f"Too Many Requests: {what} runs at most {self.permits} at once, try again in "
                f"{retry_after} s.\n")

    def busy_status_text(self) -> str:
        return "429" if self.status is None else str(self.status)


def limited(template: str | Callable[..., str], *, permits: int, wait: float = 0,
            on_busy: str | Callable[..., Any] | None = None, cache: str | None = None,
            client: Any = None, prefix: str | None = None, status: int | None = None,
            until_commit: bool = True,
            idle_expiry: float | None = IDLE_EXPIRY) -> Callable[[F], F]:
    """Run the decorated callable only while holding one of ``permits`` permits of the
    semaphore named by ``template`` (formatted as ``@locked``'s): at most ``permits`` runs
    at once, across threads, processes and hosts.

    ``wait``: seconds to wait for a permit (0: one attempt). ``on_busy``: as ``@locked``'s
    (views: a 429 response with ``Retry-After``, or ``status``; Celery tasks: skip;
    ``"wait"``/``"retry"``/``"raise"``/``"skip"``/a callable). ``cache``, ``client``,
    ``prefix``, ``until_commit``: as ``@locked``'s (one cache alias only).
    ``idle_expiry``: seconds the semaphore lives on once no permit is taken (a per-user
    template leaves no key behind per user); a permit taken makes it persistent again. None:
    it lives until deleted.
    """
    return decorator(LimitSpec(template, permits, wait, on_busy, cache, client, prefix, status,
                               until_commit, idle_expiry))


__all__ = ["AsyncPermitCall", "LimitSpec", "PermitCall", "client_pair", "limited"]
