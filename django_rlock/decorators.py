"""``@locked``: one decorator for functions, sync and async views, class-based views and tasks.

The lock name comes from a template formatted with the call's bound arguments
(``"report:{pk}"``, ``"user:{request.user.pk}"``) or from a callable. Field names are checked
against the signature when decorating, so a typo fails at import, not at the first request.

Layering: the engine <- this module (Django glue) <- ``django_rlock.celery``. This module never
imports the Celery glue; that registers itself here (``register_task_hooks``) when imported,
which the app config does when Celery is installed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import string
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import redis
import redis.asyncio

from .engine import AsyncRLock, LockBusy, RLock, events
from .engine.clients import async_twin
from .engine.listing import describe_holders
from .engine.lock import check_seconds
from .transaction import TransactionRelease, in_transaction

logger = logging.getLogger("django_rlock")

F = TypeVar("F", bound=Callable[..., Any])

ON_BUSY = ("raise", "skip", "wait", "retry")


def _template_fields(template: str) -> list[str]:
    """The root names a template uses: ``"r:{request.user.pk}"`` -> ``["request"]``."""
    roots = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(f"lock template {template!r} uses a positional field {{{field}}}; "
                             f"name the argument instead, e.g. {{pk}}")
        roots.append(root)
    return roots


#: A value no call passes (``name_builder``'s "not given").
_MISSING: Any = object()


def template_picks(fields: Sequence[str],
                   sig: inspect.Signature) -> list[tuple[str, int | None, Any]] | None:
    """How to pick each root a template uses straight from a call: ``(name, position or None,
    default or _MISSING)``; None if some root cannot be picked so (positional-only, ``*args``
    or ``**kwargs`` itself), and ``Signature.bind`` must do it."""
    params = list(sig.parameters.values())
    picks = []
    for field in dict.fromkeys(fields):
        param = sig.parameters.get(field)
        if param is None:  # only through **kwargs (check_signature saw to that)
            picks.append((field, None, _MISSING))
        elif param.kind is param.POSITIONAL_OR_KEYWORD:
            picks.append((field, params.index(param),
                          _MISSING if param.default is param.empty else param.default))
        elif param.kind is param.KEYWORD_ONLY:
            picks.append((field, None, _MISSING if param.default is param.empty else param.default))
        else:
            return None
    return picks


#: ``conf.get_config`` once imported (Django settings are only read where a spec has no client).
_get_config: Callable[[], Any] | None = None


def _settings_reader() -> Callable[[], Any]:
    global _get_config
    from .conf import get_config

    _get_config = get_config
    return get_config


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
                 until_commit: bool = True, quorum: bool = False, kind: str | None = None) -> None:
        if isinstance(template, str):
            if not template:
                raise ValueError("lock template must not be empty")
            self.fields = _template_fields(template)
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
        if status is not None and not (isinstance(status, int) and 100 <= status <= 599):
            raise ValueError(f"status must be an HTTP status code, not {status!r} (lock {label!r})")
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str (lock {label!r})")
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
        self.cache = cache
        self.quorum = quorum
        self.client = client
        self.prefix = prefix
        self.status = status
        self.dedupe = dedupe
        self.until_commit = bool(until_commit)
        self._fixed_place: _Place | None = None
        self._settings_place: _Place | None = None

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
            values = bound_arguments(sig, args, kwargs)
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
        missing = _MISSING

        def build(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
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
                place = self._fixed_place = _Place(None, None, self.prefix or "", {}, 30.0,
                                                   self.client)
            return place
        config = (_get_config or _settings_reader())()
        place = self._settings_place
        if place is not None and place.config is config:
            return place
        from .conf import lock_options
        from .connection import cache_alias, get_prefix

        cache = self.cache[0] if isinstance(self.cache, (list, tuple)) else self.cache
        alias = cache_alias(cache)
        prefix = self.prefix if self.prefix is not None else get_prefix(alias)
        place = _Place(config, alias, prefix, lock_options(),
                       float(config["WATCHDOG_TIMEOUT"]), None)
        self._settings_place = place
        return place

    def _where(self) -> tuple[Any, str, float]:
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
        return FencedCall(lock) if self.kind == "fenced" else lock

    def async_lock(self, name: str) -> Any:
        """The asyncio twin of ``sync_lock``'s lock (``AsyncRLock``, ``AsyncFairLock``, ...),
        or an ``AsyncMultiLock``/``AsyncRedLock`` over a list of caches."""
        if isinstance(self.cache, (list, tuple)):
            from .connection import get_client, get_prefix
            from .engine import AsyncMultiLock, AsyncRedLock

            options = self._options()
            members = [AsyncRLock(async_twin(get_client(a)), name, get_prefix(a),
                                  sync_client=get_client(a), label=self.label, **options)
                       for a in self.cache]
            return AsyncRedLock(*members) if self.quorum else AsyncMultiLock(*members)
        place = self._place()
        client = place.get_client()
        if is_async_client(client):
            options = place.options
        else:
            options = {**place.options, "sync_client": client}
            client = async_twin(client)
        if self.kind is None:
            return AsyncRLock(client, name, place.prefix, label=self.label, **options)
        lock = async_lock_of_kind(self.kind, client, name, place.prefix, label=self.label,
                                  **options)
        return AsyncFencedCall(lock) if self.kind == "fenced" else lock

    def check_function(self, func: Callable[..., Any], sig: inspect.Signature) -> None:
        """What a decorated function must look like beyond the template's fields."""
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

    def busy_body(self, busy: LockBusy) -> str:
        """The body of a busy view's response."""
        return f"Locked: {busy.name} is busy, try again later.\n"

    def busy_status(self) -> int:
        if self.status is not None:
            return self.status
        from .conf import get_config

        return int(get_config()["BUSY_STATUS"])


def is_async_client(client: Any) -> bool:
    if isinstance(client, redis.Redis):  # the common case, without inspecting a method
        return False
    if isinstance(client, redis.asyncio.Redis):
        return True
    return hasattr(client, "connection_pool") and inspect.iscoroutinefunction(
        getattr(client, "execute_command", None))


# -- lock kinds ---------------------------------------------------------------------------------
#: The lock kinds ``get_lock`` and ``@locked`` build: None is Redisson's RLock.
KINDS: tuple[str | None, ...] = (None, "fair", "read", "write", "fenced")


def check_kind(kind: Any, name: str) -> str | None:
    """``kind`` if it is one of ``KINDS``; ValueError naming the lock, before any Redis command."""
    if kind is not None and (not isinstance(kind, str) or kind not in KINDS):
        raise ValueError(f"kind must be None, 'fair', 'read', 'write' or 'fenced', not {kind!r} "
                         f"(lock {name!r})")
    return kind


def lock_of_kind(kind: str | None, client: Any, name: str, prefix: str,
                 **options: Any) -> Any:
    """A lock with the ``RLock`` API of one kind (see ``KINDS``) on a redis-py client.

    ``options``: what the constructors share (``watchdog_timeout``, ``label``, ``on_lost``,
    ``sync_replicas``, ``sync_timeout``). The kinds' modules are imported on first use.
    """
    check_kind(kind, name)
    if kind is None:
        return RLock(client, name, prefix, **options)
    if kind == "fair":
        from .engine.fair import FairLock

        return FairLock(client, name, prefix, **options)
    if kind == "fenced":
        from .engine.fenced import FencedLock

        return FencedLock(client, name, prefix, **options)
    from .engine.rwlock import ReadWriteLock

    rw = ReadWriteLock(client, name, prefix, **options)
    return rw.read_lock() if kind == "read" else rw.write_lock()


def async_lock_of_kind(kind: str | None, client: Any, name: str, prefix: str,
                       **options: Any) -> Any:
    """``lock_of_kind`` for asyncio: ``client`` is a ``redis.asyncio`` client; ``options`` may
    carry ``sync_client`` (the sync twin that renews and waits)."""
    check_kind(kind, name)
    if kind is None:
        return AsyncRLock(client, name, prefix, **options)
    if kind == "fair":
        from .engine.fair import AsyncFairLock

        return AsyncFairLock(client, name, prefix, **options)
    if kind == "fenced":
        from .engine.fenced import AsyncFencedLock

        return AsyncFencedLock(client, name, prefix, **options)
    from .engine.rwlock import AsyncReadWriteLock

    rw = AsyncReadWriteLock(client, name, prefix, **options)
    return rw.read_lock() if kind == "read" else rw.write_lock()


def check_permits(permits: Any, name: str) -> int:
    """A number of permits: an int >= 1 (TypeError/ValueError naming the semaphore)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__} "
                        f"(semaphore {name!r})")
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r} (semaphore {name!r})")
    return permits


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


def bound_arguments(sig: inspect.Signature, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults applied, ``**kwargs`` flattened in."""
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            values.update(values.pop(p.name, {}))
    return values


# -- tasks ----------------------------------------------------------------------------------------
class TaskHooks(NamedTuple):
    """How ``@locked`` recognises, runs and retries a task; ``django_rlock.celery`` provides them.

    ``task_of(args, wrapper)``: the task this call runs as, or None. ``run(spec, wrapper, func,
    name, task, args, kwargs, on_busy)``: the whole locked run of a task. ``retry(busy, task)``:
    ``on_busy="retry"``.
    """

    task_of: Callable[[tuple[Any, ...], Callable[..., Any]], Any]
    run: Callable[..., Any]
    retry: Callable[[LockBusy, Any], Any]


_task_hooks: TaskHooks | None = None


def register_task_hooks(hooks: TaskHooks | None) -> TaskHooks | None:
    """Install the task-queue integration (None removes it); returns the one it replaces."""
    global _task_hooks
    previous, _task_hooks = _task_hooks, hooks
    return previous


def _task_of(args: tuple[Any, ...], wrapper: Callable[..., Any]) -> Any:
    """The task this call runs as, or None; a task without the integration fails loudly."""
    if _task_hooks is not None:
        return _task_hooks.task_of(args, wrapper)
    first = args[0] if args else None
    if hasattr(first, "apply_async") and hasattr(first, "request") and hasattr(first, "retry"):
        raise RuntimeError(
            f"@locked runs inside the Celery task {getattr(first, 'name', first)!r} but "
            f"django_rlock.celery is not loaded: add 'django_rlock' to INSTALLED_APPS or import "
            f"django_rlock.celery in your Celery app module")
    return None


@functools.cache
def _request_class() -> type | None:
    try:
        from django.http import HttpRequest
    except ImportError:  # pragma: no cover - Django is optional for plain functions
        return None
    return HttpRequest


def _is_request(obj: Any) -> bool:
    cls = _request_class()
    return cls is not None and isinstance(obj, cls)


def turned_away(spec: LockSpec, lock: Any, ttl: float | None) -> LockBusy:
    """The ``LockBusy`` of a call whose lock stayed busy; tells the ``busy`` event listeners
    (``lock_busy`` signal, metrics)."""
    if events.listeners:
        events.emit("busy", name=lock.name, key=lock.key, label=spec.label, ttl=ttl)
    return LockBusy(spec.busy_text(lock.name, ttl), lock.name, ttl)


def holders_of(lock: Any, client: Any = None) -> str:
    """Who holds ``lock`` (host, pid, process, thread, since when), for a log line."""
    describe = getattr(lock, "describe_holders", None)
    if describe is not None:  # a semaphore's permits (django_rlock.limits)
        return str(describe())
    members = getattr(lock, "locks", None)
    if members is not None:  # MultiLock / RedLock (or their asyncio twins): per server
        return "; ".join(f"[{i}] {holders_of(m, getattr(m, '_sync_client', None))}"
                         for i, m in enumerate(members))
    return describe_holders(client if client is not None else lock.client, lock.key, lock.prefix)


def busy_response(spec: LockSpec, busy: LockBusy) -> Any:
    from django.http import HttpResponse

    response = HttpResponse(spec.busy_body(busy),
                            status=spec.busy_status(), content_type="text/plain; charset=utf-8")
    if busy.ttl is not None and not math.isinf(busy.ttl):
        response["Retry-After"] = str(max(1, math.ceil(busy.ttl)))
    return response


def _on_busy(spec: LockSpec, wrapper: Callable[..., Any], busy: LockBusy, args: tuple[Any, ...],
             kwargs: dict[str, Any], holders: Callable[[], str]) -> Any:
    """What a call whose lock stayed busy returns (or raises)."""
    on_busy = spec.on_busy
    if callable(on_busy):
        return on_busy(busy, *args, **kwargs)
    if on_busy is None:
        if args and _is_request(args[0]):
            return busy_response(spec, busy)
        on_busy = "skip" if _task_of(args, wrapper) is not None else "raise"
    if on_busy == "raise":
        raise busy
    if on_busy == "retry":
        if _task_hooks is None:
            raise TypeError(f"on_busy='retry' needs Celery: import django_rlock.celery (lock "
                            f"{busy.name!r})")
        return _task_hooks.retry(busy, _task_hooks.task_of(args, wrapper))
    # "skip" and "wait" (which has already waited)
    logger.info("django-rlock: skipped %s: lock %r is held by %s",
                getattr(wrapper, "__qualname__", spec.label), busy.name, holders())
    return None


def _lost_warning(name: str, func: Callable[..., Any], exc: Exception) -> None:
    logger.warning("django-rlock: lock %r was lost while %s() ran (%s: %s); the call's result "
                   "stands", name, getattr(func, "__qualname__", func), type(exc).__name__, exc)


def release_after_call(lock: RLock, func: Callable[..., Any]) -> None:
    """Release after the call; a lost lock is logged, never raised over the call's outcome."""
    try:
        lock.unlock()
    except Exception as exc:
        _lost_warning(lock.name, func, exc)


class CallRelease(Protocol):
    """Ends one call's hold: ``done()`` releases now or later; True if later."""

    def done(self) -> bool: ...


class _ReleaseNow:
    """``until_commit=False``: released when the call ends, transaction or not."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release

    def done(self) -> bool:
        self._release()
        return False


def hold_for_call(spec: LockSpec, lock: RLock, func: Callable[..., Any]) -> CallRelease:
    """How the hold taken for one call ends; make it right after acquiring, ``done()`` after.

    With ``until_commit`` the release waits for the database transactions open around the
    call (its writes are not visible before they commit); see ``django_rlock.transaction``.
    If even this fails, the lock is released before the error propagates: it must never leak.
    """
    release = functools.partial(release_after_call, lock, func)
    if not spec.until_commit:
        return _ReleaseNow(release)
    try:
        return TransactionRelease(release, lock.name)
    except BaseException:
        release()
        raise


def _hold_past_call(spec: LockSpec, lock: RLock, func: Callable[..., Any]) -> CallRelease | None:
    """``hold_for_call`` where that matters: None when the lock is to be released as the call
    ends (``until_commit=False``, or no transaction open on this thread, the common case),
    without making a ``TransactionRelease`` for nothing."""
    if not spec.until_commit:
        return None
    try:
        if not in_transaction():
            return None
    except BaseException:
        release_after_call(lock, func)
        raise
    return hold_for_call(spec, lock, func)


def locked(template: str | Callable[..., str], *, wait: float = 0, lease: float | None = None,
           on_busy: str | Callable[..., Any] | None = None, cache: str | Sequence[str] | None = None,
           client: Any = None, prefix: str | None = None, status: int | None = None,
           dedupe: bool = False, until_commit: bool = True,
           quorum: bool = False, kind: str | None = None) -> Callable[[F], F]:
    """Run the decorated callable only while holding the lock named by ``template``.

    ``wait``: seconds to wait for a busy lock (0: one attempt). ``lease``: seconds, or None for
    watchdog mode (held as long as the call runs). ``on_busy``, after ``wait``: ``None`` =
    the context's default (views: a 423 response with Retry-After; Celery tasks: skip; other
    callables: raise ``LockBusy``), ``"raise"``, ``"skip"`` (return None, logged), ``"wait"``
    (skip after waiting), ``"retry"`` (Celery: ``self.retry``), or a callable
    ``on_busy(busy, *args, **kwargs)`` whose result is returned. ``cache``: the cache alias
    (default ``RLOCK["CACHE"]``); ``client``/``prefix``: use a redis-py client directly,
    without Django. ``status``: the busy response status (default ``RLOCK["BUSY_STATUS"]``).
    ``dedupe``: Celery tasks only, skip enqueueing a duplicate (see ``django_rlock.celery``).
    ``cache=["a", "b", "c"]``: a ``MultiLock`` over those caches' servers (sync callables), or
    with ``quorum=True`` a ``RedLock``.
    ``until_commit``: a sync call made inside ``transaction.atomic()`` (or ``ATOMIC_REQUESTS``)
    keeps its lock until that transaction commits or rolls back, so the next holder sees its
    writes; False releases when the call returns (async views are never in a transaction).
    ``kind``: the lock's kind, None (an ``RLock``), ``"fair"``, ``"read"``, ``"write"`` (the
    two sides of the ``ReadWriteLock`` of that name) or ``"fenced"``: a function with a
    ``fence_token`` parameter (which must have a default) then receives this acquire's token
    in it, for ``django_rlock.fencing.fenced_update``. Not with a list of caches.
    """
    return decorator(LockSpec(template, wait, lease, on_busy, cache, client, prefix, status,
                              dedupe, until_commit, quorum, kind))


def decorator(spec: LockSpec) -> Callable[[F], F]:
    """The decorator of a spec: ``@locked``'s, and ``@limited``'s with a ``LimitSpec`` (whose
    "lock" is one permit of a semaphore behind the same API)."""

    def decorate(func: F) -> F:
        if hasattr(func, "apply_async") and hasattr(func, "run"):
            raise TypeError(
                f"{spec.decorator} was applied to the Celery task {getattr(func, 'name', func)!r};"
                f" put the task decorator outermost:\n\n    @shared_task(bind=True)\n"
                f"    {spec.decorator}(...)\n"
                f"    def {getattr(func, '__name__', 'task')}(self, ...): ...")
        if not callable(func):
            raise TypeError(f"{spec.decorator} decorates callables, not {type(func).__name__}")
        # method_decorator hands us a partial of the bound method per request, with
        # __wrapped__ pointing at the unbound one: its own signature is the one called.
        sig = inspect.signature(func, follow_wrapped=not isinstance(func, functools.partial))
        spec.check_signature(func, sig)
        spec.check_function(func, sig)

        # Everything a call needs that depends on the function only is decided here, once.
        name_of = spec.name_builder(func, sig)
        fenced = spec.kind == "fenced"

        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                lock = spec.async_lock(name_of(args, kwargs))
                if not await lock.try_lock(spec.wait, spec.lease):
                    ttl = await lock.remaining_ttl()
                    return _on_busy(spec, async_wrapper, turned_away(spec, lock, ttl), args, kwargs,
                                    lambda: holders_of(lock, getattr(lock, "_sync_client", None)))
                try:
                    return await func(*args, **(call_args(lock, func, kwargs) if fenced else kwargs))
                finally:
                    try:
                        await lock.unlock()
                    except Exception as exc:
                        _lost_warning(lock.name, func, exc)

            wrapper: Any = async_wrapper
        else:
            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                name = name_of(args, kwargs)
                # A view's call (a request first) is never a task's: no task lookup for it.
                task = None if args and _is_request(args[0]) else _task_of(args, sync_wrapper)
                if task is not None and _task_hooks is not None:

                    def busy_in_task(busy: LockBusy) -> Any:
                        return _on_busy(spec, sync_wrapper, busy, args, kwargs,
                                        lambda: holders_of(spec.sync_lock(busy.name)))

                    return _task_hooks.run(spec, sync_wrapper, func, name, task, args, kwargs,
                                           busy_in_task)
                lock = spec.sync_lock(name)
                if not lock.try_lock(spec.wait, spec.lease):
                    busy = turned_away(spec, lock, lock.remaining_ttl())
                    return _on_busy(spec, sync_wrapper, busy, args, kwargs, lambda: holders_of(lock))
                hold = _hold_past_call(spec, lock, func)
                try:
                    return func(*args, **(call_args(lock, func, kwargs) if fenced else kwargs))
                finally:
                    if hold is None:
                        release_after_call(lock, func)
                    else:
                        hold.done()

            wrapper = sync_wrapper
        # Celery checks call arguments against this (it does not follow __wrapped__).
        wrapper.__signature__ = sig
        wrapper.__rlock_spec__ = spec
        return wrapper  # type: ignore[no-any-return]

    return decorate
