"""``@rate_limited`` and ``get_rate_limiter``: a global rate limit on a view, a task or a function.

Celery's own ``rate_limit`` is per worker process; this one is one budget for every process
and host on the Redis server (and for Java or Node Redisson clients of the same name): at most
``rate`` calls per interval in any sliding window (``engine.ratelimit``).

``@rate_limited`` runs through ``@locked``'s code path, as ``@limited`` does: ``RateSpec`` is a
``LockSpec`` whose "lock" is one grant of a ``RateLimiter`` (``RateCall``, behind the lock API
that path uses: ``try_lock``, ``unlock`` (nothing to give back: permits are spent),
``remaining_ttl`` = seconds until a permit). So the template is formatted as ``@locked``'s and
calls over budget are answered as ``@locked``'s busy calls are: a view gets 429 Too Many
Requests with ``Retry-After`` (seconds until a permit, rounded up), a Celery task skips or
(``on_busy="retry"``) retries with that countdown, any other callable raises ``RateLimited``.

The rate is set by the limiter's first attempt when the name has none (in the same round
trip: a template per user costs no extra command per new user). A limiter made by the
decorator expires after one idle interval (Redisson's ``keepAliveTime``; its budget would be
full again by then), so per-user names do not pile up. A name that already has another rate
(the decorator's rate changed in a deploy, or someone's ``set_rate``) keeps it, with a
warning once per decorator: old and new code run side by side during a deploy, and two rates
fighting over one key would limit nothing. Change it with ``get_rate_limiter(name).set_rate``.

A stored rate below the decorator's ``permits`` (an operator lowered it) can never grant one
call: the engine refuses such an attempt (``RateLimiterError``). A decorated call takes that
as a spent budget, not an error: the operator asked for fewer calls, so none of this
decorator's get through (a view's 429 with ``Retry-After`` = the interval, a task's skip or
retry with that countdown, a function's ``RateLimited``) until the rate is raised to
``permits`` or more, and one ERROR per decorator names the ``set_rate`` call that would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .decorators import LockSpec, decorator
from .engine.ratelimit import REFUSED, Grant, RateLimited, RateLimiter, RateLimiterError, parse_rate

logger = logging.getLogger("django_rlock")

F = TypeVar("F", bound=Callable[..., Any])


class RateCall:
    """One call's grant of a ``RateLimiter``, behind the lock API of ``@locked``."""

    def __init__(self, spec: RateSpec, limiter: Any, client: Any) -> None:
        self._spec = spec
        self._limiter = limiter
        self.name: str = limiter.name
        self.key: str = limiter.key
        self.prefix: str = limiter.prefix
        self._client = client
        self.grant: Grant | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self._spec.rate_text}>"

    @property
    def client(self) -> Any:
        return self._client

    def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        try:
            self.grant = self._limiter.attempt(self._spec.permits, wait_time)
        except RateLimiterError as exc:
            self.grant = self._spec.below_permits(exc, self._limiter.get_rate(), self.name)
            return False
        self._spec.check_rate(self._limiter)
        return self.grant.granted

    def unlock(self) -> None:
        """Nothing to give back: a grant is spent once the call started."""

    def remaining_ttl(self) -> float | None:
        """Seconds until the permits could be had: what ``Retry-After`` says."""
        return None if self.grant is None else self.grant.retry_after

    def describe_holders(self) -> str:
        """For the skip log line."""
        g = self.grant
        return (f"its budget of {self._spec.rate_text} is spent"
                f"{'' if g is None else f' (next permit in {g.retry_after:.3f} s)'}")


class AsyncRateCall(RateCall):
    """``RateCall`` on an ``AsyncRateLimiter`` (async views)."""

    async def try_lock(self, wait_time: float = 0.0,  # type: ignore[override]
                       lease_time: float | None = None) -> bool:
        try:
            self.grant = await self._limiter.attempt(self._spec.permits, wait_time)
        except RateLimiterError as exc:
            self.grant = self._spec.below_permits(exc, await self._limiter.get_rate(), self.name)
            return False
        self._spec.check_rate(self._limiter)
        return self.grant.granted

    async def unlock(self) -> None:  # type: ignore[override]
        """Nothing to give back."""

    async def remaining_ttl(self) -> float | None:  # type: ignore[override]
        return None if self.grant is None else self.grant.retry_after


class RateSpec(LockSpec):
    """A parsed ``@rate_limited(...)``: a ``LockSpec`` whose locks are grants of a limiter."""

    decorator = "@rate_limited"
    drop_redelivered = False  # a spent budget says nothing about this message's first delivery
    busy_error = RateLimited

    def __init__(self, template: str | Callable[..., str], rate: Any, permits: int, wait: float,
                 on_busy: str | Callable[..., Any] | None, cache: str | None, client: Any,
                 prefix: str | None, status: int | None) -> None:
        label = template if isinstance(template, str) else getattr(template, "__name__", "callable")
        if isinstance(cache, (list, tuple)):
            raise ValueError(f"@rate_limited takes one cache alias, not a list (rate limiter "
                             f"{label!r})")
        self.rate, self.interval = parse_rate(rate, f"rate of rate limiter {label!r}")
        if isinstance(permits, bool) or not isinstance(permits, int):
            raise TypeError(f"permits must be an int, not {type(permits).__name__} "
                            f"(rate limiter {label!r})")
        if not 1 <= permits <= self.rate:
            raise ValueError(f"permits must be 1 .. the rate ({self.rate}), got {permits!r} "
                             f"(rate limiter {label!r})")
        self.permits = permits
        self.rate_text = f"{self.rate} per {self.interval:g} s"
        self._warned = False
        self._below = False
        super().__init__(template, wait, None, on_busy, cache, client, prefix, status, False,
                         until_commit=False)
        self.hold_times = None  # Retry-After is the limiter's own exact wait

    def _limiter_options(self) -> dict[str, Any]:
        # Expires one interval after its last grant (plus a second: the grant still counts
        # for a moment after that interval ends).
        return {"rate": (self.rate, self.interval), "keep_alive": self.interval + 1.0}

    def sync_lock(self, name: str) -> RateCall:
        client, prefix, _ = self.where()
        return RateCall(self, RateLimiter(client, name, prefix, **self._limiter_options()),
                        client)

    def async_lock(self, name: str) -> AsyncRateCall:
        from .engine.aioratelimit import AsyncRateLimiter
        from .lockkinds import async_clients

        client, prefix, _ = self.where()
        aclient, sync, engine_sync = async_clients(client)
        limiter = AsyncRateLimiter(aclient, name, prefix, sync_client=engine_sync,
                                   **self._limiter_options())
        return AsyncRateCall(self, limiter, sync)

    def check_rate(self, limiter: Any) -> None:
        """Warn once if the name keeps a rate other than the decorator's (see the module)."""
        seen = limiter.seen_rate
        if self._warned or seen is None or seen == (self.rate, self.interval):
            return
        self._warned = True
        logger.warning(
            "django-rlock: rate limiter %r has a rate of %d per %g s, not the %s of "
            "@rate_limited(%r); it keeps its own (change it with get_rate_limiter(%r)"
            ".set_rate(%d, %g))", limiter.name, seen[0], seen[1], self.rate_text, self.label,
            limiter.name, self.rate, self.interval)

    def below_permits(self, exc: RateLimiterError, stored: tuple[int, float] | None,
                      name: str) -> Grant:
        """The engine refused an attempt: if the stored rate is below ``permits`` (lowered by
        ``set_rate``), a spent budget for a whole interval, with one ERROR per decorator (see
        the module); any other refusal (no rate, a ``PER_CLIENT`` limiter) is raised."""
        if stored is None or stored[0] >= self.permits:
            raise exc
        rate, interval = stored
        if not self._below:
            self._below = True
            logger.error(
                "django-rlock: rate limiter %r has a rate of %d per %g s, below the %d permits "
                "one call of @rate_limited(%r) costs: every call is turned away as over budget "
                "until the rate is raised (get_rate_limiter(%r).set_rate(%d, %g) restores the "
                "decorator's; any rate of %d or more serves it)", name, rate, interval,
                self.permits, self.label, name, self.rate, self.interval, self.permits)
        return Grant(False, None, interval, 0, REFUSED)

    def busy_status(self) -> int:
        return 429 if self.status is None else self.status

    def busy_text(self, name: str, ttl: float | None) -> str:
        return (f"rate limiter {name!r}: no permit left of {self.rate_text}"
                f"{'' if ttl is None else f', the next in {ttl:.3f} s'}; gave up after "
                f"{self.wait:g} s")

    busy_code = "rate_limited"

    def busy_body(self, name: str | None, retry_after: int) -> str:
        what = "this resource" if name is None else repr(name)
        return f"Too Many Requests: {what} allows {self.rate_text}. Retry after {retry_after} s.\n"

    def busy_status_text(self) -> str:
        return "429" if self.status is None else str(self.status)


def rate_limited(template: str | Callable[..., str], rate: Any = "100/m", *, permits: int = 1,
                 wait: float = 0, on_busy: str | Callable[..., Any] | None = None,
                 cache: str | None = None, client: Any = None, prefix: str | None = None,
                 status: int | None = None) -> Callable[[F], F]:
    """Run the decorated callable at most ``rate`` times per interval, across every thread,
    process and host: ``"100/s"``, ``"100/m"``, ``"100/h"``, ``"100/d"``, ``"10/30s"`` or
    ``(permits, seconds)``. The limiter is named by ``template`` (formatted as ``@locked``'s:
    ``"api:{request.user.pk}"`` is one budget per user).

    ``permits``: what one call costs. ``wait``: seconds a call may wait for its permits (0: one
    attempt; a call whose permits cannot come within ``wait`` is turned away at once).
    ``on_busy``: ``None`` = the context's default (views: 429 with ``Retry-After``, or
    ``status``; Celery tasks: skip; other callables: raise ``RateLimited``), ``"raise"``,
    ``"skip"`` (return None, logged), ``"retry"`` (Celery: ``self.retry`` with the countdown
    until a permit), or a callable ``on_busy(limited, *args, **kwargs)``. ``cache``,
    ``client``, ``prefix``: as ``@locked``'s.
    """
    return decorator(RateSpec(template, rate, permits, wait, on_busy, cache, client, prefix,
                              status))


def get_rate_limiter(name: str, rate: Any = None, *, cache: str | None = None) -> RateLimiter:
    """A ``RateLimiter`` on the cache's Redis connection, at the configured prefix.

    ``rate`` (``"100/m"`` or ``(permits, seconds)``): set it if the name has none yet
    (``try_set_rate``, one command now); an existing limiter keeps its own rate. None: leave it
    alone (``set_rate`` changes it).
    """
    from .connection import get_client, get_prefix
    from .engine.lock import check_name
    from .factory import one_cache

    check_name(name)
    one_cache(cache, f"rate limiter {name!r}")
    parsed = None if rate is None else parse_rate(rate, f"rate of rate limiter {name!r}")
    limiter = RateLimiter(get_client(cache), name, get_prefix(cache))
    if parsed is not None:
        limiter.try_set_rate(*parsed)
    return limiter


__all__ = ["AsyncRateCall", "RateCall", "RateSpec", "get_rate_limiter", "rate_limited"]
