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
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from . import answers
from .answers import backend_up, unreachable
from .engine import LockBusy, RLock, events
from .engine.base import ttl_seconds
from .engine.listing import describe_holders
from .lockkinds import is_async_client
from .lockspec import (  # the spec's names, where they always were
    FENCE_TOKEN,
    ON_BUSY,
    AsyncFencedCall,
    FencedCall,
    LockSpec,
    bound_arguments,
    call_args,
    template_picks,
)
from .transaction import TransactionRelease, in_transaction

logger = logging.getLogger("django_rlock")
F = TypeVar("F", bound=Callable[..., Any])

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
    error = getattr(spec, "busy_error", LockBusy)  # a LockBusy subclass (RateLimited)
    return error(spec.busy_text(lock.name, ttl), lock.name, ttl)


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


def busy_response(spec: LockSpec, busy: LockBusy, request: Any = None) -> Any:
    """The response of a view turned away (``django_rlock.answers``)."""
    return answers.busy_response(spec, busy, request)


def busy_ttl(lock: Any) -> float | None:
    """The holder's remaining lease as the failed attempt returned it (no round trip); a lock
    that does not keep it (a MultiLock, a permit) reads it now."""
    ms = getattr(lock, "busy_ttl_ms", None)
    return ttl_seconds(ms) if ms is not None else lock.remaining_ttl()


async def abusy_ttl(lock: Any) -> float | None:
    ms = getattr(lock, "busy_ttl_ms", None)
    return ttl_seconds(ms) if ms is not None else await lock.remaining_ttl()


def unavailable(spec: LockSpec, name: str | None, exc: BaseException,
                args: tuple[Any, ...]) -> Any:
    """A call whose lock backend did not answer: a view's response (503), or None to raise.

    Counted as an outage (one WARNING), and told to ``backend_unavailable`` listeners."""
    answers.backend_down(spec, name, exc)
    if args and _is_request(args[0]):
        status = answers.unavailable_status()
        if status != "raise":
            return answers.unavailable_response(spec, args[0], int(status))
    return None


def _on_busy(spec: LockSpec, wrapper: Callable[..., Any], busy: LockBusy, args: tuple[Any, ...],
             kwargs: dict[str, Any], holders: Callable[[], str]) -> Any:
    """What a call whose lock stayed busy returns (or raises)."""
    on_busy = spec.on_busy
    if callable(on_busy):
        return on_busy(busy, *args, **kwargs)
    if on_busy is None:
        if args and _is_request(args[0]):
            return answers.busy_response(spec, busy, args[0])
        on_busy = "skip" if _task_of(args, wrapper) is not None else "raise"
    if on_busy == "raise":
        raise busy
    if on_busy == "retry":
        if _task_hooks is None:
            raise TypeError(f"on_busy='retry' needs Celery: import django_rlock.celery (lock "
                            f"{busy.name!r})")
        return _task_hooks.retry(busy, _task_hooks.task_of(args, wrapper),
                                 answers.retry_after(spec, busy.ttl))
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


class WindowRelease:
    """``hold_at_least``: how one call's hold ends. Called (now, or when the transactions
    around the call end) it turns the hold into a server-side lease for the rest of the
    window, counted from when the acquire had returned (``got``, this host's monotonic
    clock: never before the server granted it, so the lease is never shorter than the
    window); a call that raised (``failed``) releases at once unless
    ``hold_at_least_on_error``. A lock lost meanwhile is logged, never raised."""

    __slots__ = ("spec", "lock", "func", "got", "failed")

    def __init__(self, spec: LockSpec, lock: Any, func: Callable[..., Any]) -> None:
        self.spec = spec
        self.lock = lock
        self.func = func
        self.got = time.monotonic()
        self.failed = False

    def left(self) -> float:
        """Seconds of the window still to hold (0: release)."""
        if self.failed and not self.spec.hold_at_least_on_error:
            return 0.0
        return max(0.0, self.spec.hold_at_least - (time.monotonic() - self.got))  # type: ignore[operator]

    def __call__(self) -> None:
        try:
            self.lock.release_as_lease(self.left())
        except Exception as exc:
            _lost_warning(self.lock.name, self.func, exc)

    async def aclose(self) -> None:
        try:
            await self.lock.release_as_lease(self.left())
        except Exception as exc:
            _lost_warning(self.lock.name, self.func, exc)


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


def hold_for_call(spec: LockSpec, lock: RLock, func: Callable[..., Any],
                  release: Callable[[], None] | None = None) -> CallRelease:
    """How the hold taken for one call ends; make it right after acquiring, ``done()`` after.

    With ``until_commit`` the release waits for the database transactions open around the
    call (its writes are not visible before they commit); see ``django_rlock.transaction``.
    If even this fails, the lock is released before the error propagates: it must never leak.
    ``release``: how it ends (a ``WindowRelease``); a plain release by default.
    """
    if release is None:
        release = functools.partial(release_after_call, lock, func)
    if not spec.until_commit:
        return _ReleaseNow(release)
    try:
        return TransactionRelease(release, lock.name)
    except BaseException:
        release()
        raise


def _hold_past_call(spec: LockSpec, lock: RLock, func: Callable[..., Any],
                    release: Callable[[], None] | None = None) -> CallRelease | None:
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
    return hold_for_call(spec, lock, func, release)


def run_windowed(spec: LockSpec, lock: Any, func: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], hold: Callable[..., CallRelease | None]) -> Any:
    """One ``hold_at_least`` call holding ``lock`` (sync; tasks too): ``hold(spec, lock,
    func, release)`` says how the hold ends (now, or at commit)."""
    window = WindowRelease(spec, lock, func)
    ends = hold(spec, lock, func, window)
    try:
        return func(*args, **call_args(lock, func, kwargs))
    except BaseException:
        window.failed = True
        raise
    finally:
        if ends is None:
            window()
        else:
            ends.done()


def locked(template: str | Callable[..., str], *, wait: float = 0, lease: float | None = None,
           on_busy: str | Callable[..., Any] | None = None, cache: str | Sequence[str] | None = None,
           client: Any = None, prefix: str | None = None, status: int | None = None,
           dedupe: bool = False, until_commit: bool = True,
           quorum: bool = False, kind: str | None = None, max_hold: float | None = None,
           warn_held_after: float | None = None, hold_at_least: float | None = None,
           hold_at_least_on_error: bool = False) -> Callable[[F], F]:
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
    ``max_hold`` / ``warn_held_after``: the lock's time windows (default ``RLOCK["MAX_HOLD"]``
    / ``RLOCK["WARN_HELD_AFTER"]``): never renewed past ``max_hold`` seconds (the call's
    lock is then lost); one WARNING and ``lock_held_long`` signal once held longer than
    ``warn_held_after``. ``hold_at_least``: seconds; a call that returns sooner leaves the
    lock held, as a lease on the server, for the rest of that window from its acquire, so a
    run on any host within it is turned away (ShedLock's lockAtLeastFor); a call that raises
    releases at once unless ``hold_at_least_on_error=True``. Not with ``kind="read"`` or a
    list of caches.
    """
    return decorator(LockSpec(template, wait, lease, on_busy, cache, client, prefix, status,
                              dedupe, until_commit, quorum, kind, max_hold=max_hold,
                              warn_held_after=warn_held_after, hold_at_least=hold_at_least,
                              hold_at_least_on_error=hold_at_least_on_error))


def _sync_only(exc: Exception) -> bool:
    """Django's ``SynchronousOnlyOperation`` (a query from the event loop's thread); Django is
    loaded if it was raised."""
    exceptions = sys.modules.get("django.core.exceptions")
    return exceptions is not None and isinstance(exc, exceptions.SynchronousOnlyOperation)


def decorator(spec: LockSpec) -> Callable[[F], F]:
    """The decorator of a spec: ``@locked``'s, and ``@limited``'s with a ``LimitSpec`` (whose
    "lock" is one permit of a semaphore behind the same API)."""

    def decorate(func: F) -> F:
        if inspect.isclass(func):
            hint = (f"\n\n    @method_decorator({spec.decorator}(...), name=\"dispatch\")\n"
                    f"    class {func.__name__}(...): ...") if hasattr(func, "as_view") else ""
            raise TypeError(f"{spec.decorator}({spec.label!r}) decorates functions and methods, "
                            f"not the class {func.__qualname__}{hint}")
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
        first = next(iter(sig.parameters), None)
        if spec.on_busy == "retry" and first == "request":
            raise TypeError(
                f"{spec.decorator}({spec.label!r}, on_busy='retry') on the view "
                f"{func.__qualname__}(): only a Celery task can retry; a view answers "
                f"{spec.busy_status_text()} with Retry-After by default (or use wait=, or "
                f"on_busy='raise')")
        times = spec.hold_times if spec.hold_at_least is None else None

        # Everything a call needs that depends on the function only is decided here, once.
        name_of = spec.name_builder(func, sig)
        fenced = spec.kind == "fenced"
        windowed = spec.hold_at_least is not None
        dedupe_untold = spec.dedupe  # a call outside any task: dedupe does nothing, told once

        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    name = name_of(args, kwargs)
                except Exception as exc:
                    if not _sync_only(exc):
                        raise
                    # The template reads something only sync code may load (a logged-in
                    # request.user: its session and user rows): build it in a thread.
                    from asgiref.sync import sync_to_async

                    name = await sync_to_async(name_of)(args, kwargs)
                lock = spec.async_lock(name)
                try:
                    got = await lock.try_lock(spec.wait, spec.lease)
                    ttl = None if got else await abusy_ttl(lock)
                except Exception as exc:
                    if not unreachable(exc):
                        raise
                    response = unavailable(spec, lock.name, exc, args)
                    if response is None:
                        raise
                    return response
                backend_up(spec)
                if not got:
                    return _on_busy(spec, async_wrapper, turned_away(spec, lock, ttl), args, kwargs,
                                    lambda: holders_of(lock, getattr(lock, "_sync_client", None)))
                t0 = time.monotonic()
                window = WindowRelease(spec, lock, func) if windowed else None
                try:
                    return await func(*args, **(call_args(lock, func, kwargs) if fenced else kwargs))
                except BaseException:
                    if window is not None:
                        window.failed = True
                    raise
                finally:
                    if times is not None:
                        times.add(time.monotonic() - t0)
                    if window is not None:
                        await window.aclose()
                    else:
                        try:
                            await lock.unlock()
                        except Exception as exc:
                            _lost_warning(lock.name, func, exc)

            wrapper: Any = async_wrapper
        else:
            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                nonlocal dedupe_untold
                name = name_of(args, kwargs)
                # A view's call (a request first) is never a task's: no task lookup for it.
                task = None if args and _is_request(args[0]) else _task_of(args, sync_wrapper)
                if dedupe_untold and task is None:
                    dedupe_untold = False
                    logger.warning("django-rlock: %s(%r, dedupe=True) does nothing for %s(), "
                                   "called outside any Celery task: it refuses a task's "
                                   "duplicate enqueues (@shared_task(bind=True, base=LockedTask) "
                                   "outermost)", spec.decorator, spec.label, func.__qualname__)
                if task is not None and _task_hooks is not None:

                    def busy_in_task(busy: LockBusy) -> Any:
                        return _on_busy(spec, sync_wrapper, busy, args, kwargs,
                                        lambda: holders_of(spec.sync_lock(busy.name)))

                    return _task_hooks.run(spec, sync_wrapper, func, name, task, args, kwargs,
                                           busy_in_task)
                lock = spec.sync_lock(name)
                try:
                    got = lock.try_lock(spec.wait, spec.lease)
                    ttl = None if got else busy_ttl(lock)
                except Exception as exc:
                    if not unreachable(exc):
                        raise
                    response = unavailable(spec, name, exc, args)
                    if response is None:
                        raise
                    return response
                backend_up(spec)
                if not got:
                    busy = turned_away(spec, lock, ttl)
                    return _on_busy(spec, sync_wrapper, busy, args, kwargs, lambda: holders_of(lock))
                if windowed:
                    return run_windowed(spec, lock, func, args, kwargs, _hold_past_call)
                hold = _hold_past_call(spec, lock, func)
                t0 = time.monotonic()
                try:
                    return func(*args, **(call_args(lock, func, kwargs) if fenced else kwargs))
                finally:
                    if times is not None:
                        times.add(time.monotonic() - t0)
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


__all__ = ["FENCE_TOKEN", "ON_BUSY", "AsyncFencedCall", "CallRelease", "FencedCall", "LockSpec",
           "TaskHooks", "WindowRelease", "abusy_ttl", "bound_arguments", "busy_response",
           "busy_ttl", "call_args", "unavailable",
           "decorator", "hold_for_call", "holders_of", "is_async_client", "locked",
           "register_task_hooks", "release_after_call", "run_windowed", "template_picks",
           "turned_away"]
