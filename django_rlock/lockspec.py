"""``LockSpec``: a parsed ``@locked(...)`` (and ``@limited``), built once per decorator.

Everything a call needs that does not depend on the call is worked out here, when decorating:
the template's fields and where each call's arguments are picked from, the options checked
(a bad one fails at import, naming the lock), and the cache's placement, read again only
after ``setting_changed``. ``decorators`` runs it per call.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from .answers import HoldTimes
from .callnames import MISSING, bound_arguments, call_fits, template_fields, template_picks
from .engine import AsyncRLock, RLock
from .engine.lock import check_seconds
from .engine.windows import check_lease, check_window
from .lockkinds import async_clients, async_lock_of_kind, check_kind, lock_of_kind

ON_BUSY = ("raise", "skip", "wait", "retry")


#: ``conf.get_config`` once imported (Django settings are only read where a spec has no client).
_get_config: Callable[[], Any] | None = None


def _settings_reader() -> Callable[[], Any]:
    global _get_config
    from .conf import get_config

    _get_config = get_config
    return get_config


def _settings_loaded() -> bool:
    """Django's settings are loaded (not merely findable: reading them here would load them
    at import, before ``django.setup()`` or ``settings.configure()``)."""
    try:
        from django.conf import settings
    except ImportError:  # pragma: no cover - Django is optional with client=
        return False
    return bool(settings.configured)


class _Place:
    """Where a spec's locks go: ``config`` is the settings dict it was resolved from (None
    for a spec with its own client); the client is looked up per call (Django's cache
    handlers are per thread, and rebuilt when CACHES change)."""

    __slots__ = ("alias", "client", "config", "get_client", "options", "prefix",
                 "watchdog_timeout")

    def __init__(self, config: Any, alias: str | None, prefix: str, options: dict[str, Any],
                 watchdog_timeout: float, client: Any) -> None:
        self.config = config
        self.alias = alias
        self.prefix = prefix
        self.options = options
        self.watchdog_timeout = watchdog_timeout
        self.client = client
        if client is not None:
            self.get_client: Callable[[], Any] = self._fixed
        else:
            from .connection import client_of

            self.get_client = functools.partial(client_of, alias)

    def _fixed(self) -> Any:
        return self.client


class LockSpec:
    """A parsed ``@locked(...)``: built once per decorator, shared by every call."""

    #: The decorator's name, for error messages.
    decorator = "@locked"
    #: A redelivered task message that finds the lock busy is a copy of the run holding it
    #: (broker visibility timeout shorter than the task): dropped. Not so for a semaphore.
    drop_redelivered = True

    def __init__(self, template: str | Callable[..., str], wait: float, lease: float | None,
                 on_busy: str | Callable[..., Any] | None, cache: str | Sequence[str] | None, client: Any,
                 prefix: str | None, status: int | None, dedupe: bool,
                 until_commit: bool = True, quorum: bool = False, kind: str | None = None,
                 *, max_hold: float | None = None, warn_held_after: float | None = None,
                 hold_at_least: float | None = None,
                 hold_at_least_on_error: bool = False) -> None:
        if isinstance(template, str):
            if not template:
                raise ValueError("lock template must not be empty")
            self.fields = template_fields(template)
        elif callable(template):
            self.fields = []
        else:
            raise TypeError(f"lock template must be a str or a callable, not {type(template).__name__}")
        label = template if isinstance(template, str) else getattr(template, "__name__", "callable")
        self.kind = check_kind(kind, str(label))
        self.wait = check_seconds(wait, "wait", str(label), zero_ok=True)
        self.lease = None if lease is None else check_seconds(lease, "lease", str(label), zero_ok=False)
        if not (on_busy is None or callable(on_busy) or on_busy in ON_BUSY):
            raise ValueError(f"on_busy must be one of {', '.join(map(repr, ON_BUSY))}, a callable "
                             f"or None, not {on_busy!r} (lock {label!r})")
        if on_busy == "wait" and not self.wait:
            raise ValueError(f"on_busy='wait' needs wait > 0 seconds (lock {label!r})")
        if status is not None and not (isinstance(status, int) and not isinstance(status, bool)
                                       and 400 <= status <= 599):
            raise ValueError(f"status must be a 4xx or 5xx HTTP status code, not {status!r} "
                             f"(lock {label!r})")
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str (lock {label!r})")
        for what, flag in (("dedupe", dedupe), ("until_commit", until_commit),
                           ("quorum", quorum)):
            if not (isinstance(flag, bool) or (type(flag) is int and flag in (0, 1))):
                # ('no' would be taken as yes; 1 and 0 mean what they say)
                raise TypeError(f"{what} must be True or False (or 1 or 0), not {flag!r} "
                                f"(lock {label!r})")
        if not (cache is None or isinstance(cache, (str, list, tuple))):
            raise TypeError(f"cache must be a cache alias (str) or a list of them, not "
                            f"{type(cache).__name__} (lock {label!r})")
        self.template = template
        self.label = str(label)
        self.on_busy = on_busy
        if isinstance(cache, (list, tuple)):
            if not cache or not all(isinstance(a, str) for a in cache) or len(set(cache)) != len(cache):
                raise ValueError(f"cache must be an alias or a non-empty list of distinct aliases, "
                                 f"not {cache!r} (lock {label!r})")
            if client is not None:
                raise ValueError(f"give client= or a list of caches, not both (lock {label!r})")
            if kind is not None:
                raise ValueError(f"kind={kind!r} cannot span several caches: a MultiLock/RedLock "
                                 f"is made of plain RLocks (lock {label!r})")
        elif quorum:
            raise ValueError(f"quorum=True needs cache=[...] with several aliases (lock {label!r})")
        #: The locks' time windows over the settings' (``engine.windows``), and
        #: ``hold_at_least``: a call that returns sooner leaves the lock held as a lease for
        #: the rest of that window (``WindowRelease``).
        self.windows: dict[str, float] = {}
        for what, value in (("max_hold", max_hold), ("warn_held_after", warn_held_after)):
            if value is not None:
                self.windows[what] = check_window(value, what, str(label))  # type: ignore[assignment]
        if self.lease is not None:  # refused when decorating, not on every call
            check_lease(self.lease, self.windows.get("max_hold"), str(label))
        self.hold_at_least = check_window(hold_at_least, "hold_at_least", str(label))
        if not isinstance(hold_at_least_on_error, bool):
            raise TypeError(f"hold_at_least_on_error must be True or False, not "
                            f"{hold_at_least_on_error!r} (lock {label!r})")
        if hold_at_least_on_error and self.hold_at_least is None:
            raise ValueError(f"hold_at_least_on_error=True needs hold_at_least (lock {label!r})")
        if self.hold_at_least is not None:
            if isinstance(cache, (list, tuple)):
                raise ValueError(f"hold_at_least cannot span several caches: a MultiLock/RedLock "
                                 f"has no lease of its own to leave (lock {label!r})")
            if kind == "read":
                raise ValueError(f"hold_at_least needs an exclusive lock: readers share a read "
                                 f"lock, so a window of one keeps no other reader out (lock "
                                 f"{label!r}); use kind='write' or the default")
            if max_hold is not None and self.hold_at_least > float(max_hold):
                raise ValueError(f"hold_at_least {self.hold_at_least:g} s is longer than max_hold "
                                 f"{float(max_hold):g} s (lock {label!r})")
        self.hold_at_least_on_error = hold_at_least_on_error
        self.cache = cache
        self.quorum = bool(quorum)
        self.client = client
        self.prefix = prefix
        self.status = status
        self.dedupe = bool(dedupe)
        self.until_commit = bool(until_commit)
        self._fixed_place: _Place | None = None
        self._settings_place: _Place | None = None
        #: Recent hold times of this template in this process: the busy answer's estimate.
        self.hold_times: HoldTimes | None = HoldTimes()
        if client is None and cache is not None and _settings_loaded():
            self.check_caches()  # a typo fails at import (else at the first call: ``_place``)

    def check_caches(self) -> None:
        """Each alias of ``cache=`` is one of settings.CACHES: ImproperlyConfigured naming
        the decorator, when decorating if Django's settings are loaded by then (decorators
        run at import), else when a call first resolves them."""
        from django.core.exceptions import ImproperlyConfigured

        from .connection import cache_alias

        for alias in [self.cache] if isinstance(self.cache, str) else self.cache or ():
            try:
                cache_alias(alias)
            except ImproperlyConfigured as exc:
                raise ImproperlyConfigured(
                    f"django-rlock: {self.decorator}({self.label!r}, cache={self.cache!r}): "
                    f"{str(exc).removeprefix('django-rlock: ')}") from None

    # -- names ------------------------------------------------------------------------------
    def check_signature(self, func: Callable[..., Any], sig: inspect.Signature) -> None:
        params = sig.parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return  # **kwargs may carry any name (class-based views' dispatch)
        missing = [f for f in self.fields if f not in params]
        if missing:
            raise ValueError(
                f"lock template {self.template!r} of {func.__qualname__}() uses "
                f"{', '.join(map(repr, missing))}, which is not a parameter of "
                f"{func.__qualname__}{sig}")

    def name_for(self, func: Callable[..., Any], sig: inspect.Signature,
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name of one call, the general way (``Signature.bind``)."""
        if not isinstance(self.template, str):
            name = self.template(*args, **kwargs)
            if not isinstance(name, str) or not name:
                raise ValueError(f"the lock name callable of {func.__qualname__}() must return a "
                                 f"non-empty str, not {name!r}")
            return name
        try:
            values = bound_arguments(sig, args, kwargs, self.fields)
            return self.template.format_map(values)
        except (KeyError, AttributeError, IndexError, TypeError) as exc:
            raise self.name_error(func, exc) from exc

    def name_error(self, func: Callable[..., Any], exc: Exception) -> ValueError:
        return ValueError(f"cannot build the lock name {self.template!r} for "
                          f"{func.__qualname__}(): {type(exc).__name__}: {exc}")

    def name_builder(self, func: Callable[..., Any],
                     sig: inspect.Signature) -> Callable[[tuple[Any, ...], dict[str, Any]], str]:
        """``name_for`` for ``func``, planned once when decorating: ``build(args, kwargs)``.

        When each field's root is a parameter that may be given by keyword (or comes through
        ``**kwargs``), its value is picked straight from the call: from ``kwargs``, else at its
        position in ``args``, else its default. Any other call (an argument missing, say) and
        any other template takes ``name_for``'s way, so names and errors are the same either way.
        """
        if not isinstance(self.template, str):
            return functools.partial(self.name_for, func, sig)
        picks = template_picks(self.fields, sig)
        if picks is None:
            return functools.partial(self.name_for, func, sig)
        fmt = self.template.format_map
        slow = self.name_for
        missing = MISSING
        fits = call_fits(sig)

        def build(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            if not fits(args, kwargs):
                return slow(func, sig, args, kwargs)  # raises bind's error, before any command
            values = {}
            for field, index, default in picks:
                value = kwargs.get(field, missing) if kwargs else missing
                if value is missing:
                    if index is not None and index < len(args):
                        value = args[index]
                    elif default is not missing:
                        value = default
                    else:
                        return slow(func, sig, args, kwargs)  # raises the same error
                values[field] = value
            try:
                return fmt(values)
            except (KeyError, AttributeError, IndexError, TypeError) as exc:
                raise self.name_error(func, exc) from exc

        return build

    # -- locks ------------------------------------------------------------------------------
    def _place(self) -> _Place:
        """Where this spec's locks go: resolved from the settings once, again after
        ``setting_changed`` for RLOCK or CACHES (``get_config`` then returns a new dict)."""
        if self.client is not None:
            place = self._fixed_place
            if place is None:
                place = self._fixed_place = _Place(None, None, self.prefix or "",
                                                   dict(self.windows), 30.0, self.client)
            return place
        config = (_get_config or _settings_reader())()
        place = self._settings_place
        if place is not None and place.config is config:
            return place
        from .conf import lock_options
        from .connection import cache_alias, get_prefix

        self.check_caches()
        cache = self.cache[0] if isinstance(self.cache, (list, tuple)) else self.cache
        alias = cache_alias(cache)
        prefix = self.prefix if self.prefix is not None else get_prefix(alias)
        place = _Place(config, alias, prefix, {**lock_options(), **self.windows},
                       float(config["WATCHDOG_TIMEOUT"]), None)
        self._settings_place = place
        return place

    def where(self) -> tuple[Any, str, float]:
        place = self._place()
        return place.get_client(), place.prefix, place.watchdog_timeout

    def _options(self) -> dict[str, Any]:
        """Watchdog and replica-sync options: the RLOCK settings, or the defaults without Django."""
        return dict(self._place().options)

    def sync_lock(self, name: str) -> Any:
        """A lock of ``kind`` (default an ``RLock``), or a ``MultiLock``/``RedLock`` over a
        list of caches. A fenced lock comes wrapped so the call can get its token."""
        if isinstance(self.cache, (list, tuple)):
            from .connection import get_client, get_prefix, multi_lock

            return multi_lock([RLock(get_client(a), name, get_prefix(a), label=self.label,
                                     **self._options()) for a in self.cache], self.quorum)
        place = self._place()
        if self.kind is None:
            return RLock(place.get_client(), name, place.prefix, label=self.label,
                         **place.options)
        lock = lock_of_kind(self.kind, place.get_client(), name, place.prefix, label=self.label,
                            **place.options)
        if self.kind == "non_reentrant":  # a call asking again is an error, not "busy"
            lock.refuse_reentry()
        return FencedCall(lock) if self.kind == "fenced" else lock

    def async_lock(self, name: str) -> Any:
        """The asyncio twin of ``sync_lock``'s lock (``AsyncRLock``, ``AsyncFairLock``, ...),
        or an ``AsyncMultiLock``/``AsyncRedLock`` over a list of caches."""
        if isinstance(self.cache, (list, tuple)):
            from .connection import get_client, get_prefix
            from .engine import AsyncMultiLock, AsyncRedLock

            options = self._options()
            members = []
            for a in self.cache:
                aclient, _, sync = async_clients(get_client(a))
                members.append(AsyncRLock(aclient, name, get_prefix(a), sync_client=sync,
                                          label=self.label, **options))
            return AsyncRedLock(*members) if self.quorum else AsyncMultiLock(*members)
        place = self._place()
        client, _, sync = async_clients(place.get_client())
        options = {**place.options, "sync_client": sync}
        if self.kind is None:
            return AsyncRLock(client, name, place.prefix, label=self.label, **options)
        lock = async_lock_of_kind(self.kind, client, name, place.prefix, label=self.label,
                                  **options)
        if self.kind == "non_reentrant":
            lock.refuse_reentry()
        return AsyncFencedCall(lock) if self.kind == "fenced" else lock

    def check_function(self, func: Callable[..., Any], sig: inspect.Signature) -> None:
        """What a decorated function must look like beyond the template's fields."""
        view = next(iter(sig.parameters), None) == "request"
        if self.dedupe and (view or inspect.iscoroutinefunction(func)):  # never a Celery task
            what = "view" if view else "coroutine function"
            raise TypeError(f"{self.decorator}({self.label!r}, dedupe=True) on the {what} "
                            f"{func.__qualname__}(): de-duplication is for Celery tasks "
                            f"(@shared_task(bind=True, base=LockedTask) outermost)")
        param = sig.parameters.get(FENCE_TOKEN)
        if self.kind == "fenced" and param is not None and (
                param.default is param.empty or param.kind is param.POSITIONAL_ONLY):
            raise ValueError(
                f"{func.__qualname__}() takes {FENCE_TOKEN!r} from {self.decorator}(kind="
                f"'fenced'): give it a default ({FENCE_TOKEN}: int | None = None) so callers "
                f"can leave it out")

    def busy_text(self, name: str, ttl: float | None) -> str:
        """The message of the ``LockBusy`` of a call turned away."""
        return (f"lock {name!r} is busy (held by someone else"
                f"{'' if ttl is None else f', {ttl:.3f} s left'}); gave up after "
                f"{self.wait:g} s")

    #: The ``error`` of a busy view's JSON body.
    busy_code = "locked"

    def busy_body(self, name: str | None, retry_after: int) -> str:
        """The body of a busy view's response; ``name`` only with ``BUSY_EXPOSE_NAME``."""
        what = "this resource" if name is None else repr(name)
        return f"Locked: {what} is busy, try again in {retry_after} s.\n"

    def busy_status_text(self) -> str:
        return "a busy status (RLOCK['BUSY_STATUS'], 423)" if self.status is None else str(
            self.status)

    def busy_status(self) -> int:
        if self.status is not None:
            return self.status
        from .conf import get_config

        return int(get_config()["BUSY_STATUS"])


# -- fenced locks ---------------------------------------------------------------------------------
#: The keyword a ``@locked(kind="fenced")`` function receives its fencing token in, if it
#: has a parameter of that name.
FENCE_TOKEN = "fence_token"


class FencedCall:
    """A ``FencedLock`` taken for one decorated call: ``try_lock`` keeps this acquire's token
    (``fence_token``); everything else is the lock's."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.fence_token: int | None = None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._lock, attr)

    def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        self.fence_token = self._lock.try_lock_and_get_token(wait_time, lease_time)
        return self.fence_token is not None


class AsyncFencedCall(FencedCall):
    """``FencedCall`` for an ``AsyncFencedLock``."""

    async def try_lock(self, wait_time: float = 0.0,  # type: ignore[override]
                       lease_time: float | None = None) -> bool:
        self.fence_token = await self._lock.try_lock_and_get_token(wait_time, lease_time)
        return self.fence_token is not None


def call_args(lock: Any, func: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the call made while holding ``lock``: plus ``fence_token``
    when the lock is fenced and ``func`` takes it (the decorator supplies it, overriding any
    value the caller passed)."""
    token = getattr(lock, "fence_token", None)
    if token is None:
        return kwargs
    try:
        takes = FENCE_TOKEN in inspect.signature(
            func, follow_wrapped=not isinstance(func, functools.partial)).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        takes = False
    return {**kwargs, FENCE_TOKEN: token} if takes else kwargs
