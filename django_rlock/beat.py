"""Celery beat on every replica, only the leader sending (issue #20).

    celery -A proj beat -l info --scheduler django_rlock.beat:LeaderScheduler
    celery -A proj beat -l info --scheduler django_rlock.beat:LeaderDatabaseScheduler

``LeaderScheduler`` sends the app's ``beat_schedule`` (Celery's default schedule, without its
shelve file); ``LeaderDatabaseScheduler`` is django-celery-beat's ``DatabaseScheduler``. Run
the same command on every replica: each campaigns for one ``Leader`` group; the leader sends,
the others stand by (they wait on the election, not on a timer, and take over as soon as they
are elected: at once after a stand-down, within the watchdog timeout after a crash).

What each entry has sent lives in Redis (``engine.ticks``): the last tick's scheduled time,
advanced by the script that decides the tick is due, which refuses a term that is no longer
current. A new leader therefore never sends again what the last one sent, and a leader that
was paused past its lease sends nothing. Ticks that fell inside a takeover gap are coalesced:
the new leader sends each entry once, for the latest tick due, and keeps the schedule's grid
(Celery's own behaviour after a beat was down, without its drift). Every message carries the
headers ``rlock_beat_term`` (the leadership's fencing token) and ``rlock_beat_tick`` (the
tick's scheduled time, ISO 8601 UTC, server clock).

Settings (``app.conf``; with ``namespace="CELERY"``: ``CELERY_RLOCK_BEAT_URL``, ...):
``rlock_beat_url`` (Redis for the election and the progress), else the RLOCK cache when
Django is configured with ``django_rlock`` installed, else the broker URL when it is Redis;
``rlock_beat_group`` (default ``"celery-beat:<app.main>"``); ``rlock_beat_prefix`` (default:
RLOCK's prefix with Django, else ``"rlock:"``); ``rlock_beat_watchdog_timeout`` (default
``RLOCK['WATCHDOG_TIMEOUT']`` with Django, else 30 s). See docs/beat.md.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from celery.beat import Scheduler
from celery.exceptions import ImproperlyConfigured
from redis.exceptions import RedisError

from .beatticks import from_us, latest_tick, local, next_after, server_clock, to_us
from .engine import Leader, LeaderInfo
from .engine.ticks import NOT_YET, SEND, STALE, TickProgress

logger = logging.getLogger("django_rlock.beat")

#: A process that is not elected within this long of its first tick logs that it stands by.
STANDBY_GRACE = 1.0

#: How long a leader whose last step failed (Redis unreachable, a stale term) waits before
#: the next (s).
RETRY_PAUSE = 0.5


@dataclass(frozen=True)
class BeatConfig:
    """Where the beat's leadership and progress live, and the campaign's settings."""

    client: Any
    group: str
    prefix: str
    watchdog_timeout: float
    source: str  # "rlock_beat_url", "RLOCK", "broker_url": where the client came from


def redis_url_of_broker(url: str) -> str | None:
    """A redis-py URL for a Celery broker URL (the first of a failover list) that is Redis
    (``redis://``, ``rediss://``, ``redis+socket://``, ``socket://``), else None.

    kombu's ``virtual_host`` is the database number."""
    first = url.split(";")[0].strip()
    parts = urlsplit(first)
    query = parse_qs(parts.query)
    vhost = query.pop("virtual_host", [None])[0]
    if parts.scheme in ("redis+socket", "socket"):
        query.setdefault("db", [vhost or "0"])
        auth = f"{parts.netloc}@" if "@" in parts.netloc else ""
        return f"unix://{auth}{parts.path}?{urlencode(query, doseq=True)}"
    if parts.scheme in ("redis", "rediss"):
        path = parts.path if parts.path not in ("", "/") or vhost is None else f"/{vhost}"
        rest = f"?{urlencode(query, doseq=True)}" if query else ""
        return f"{parts.scheme}://{parts.netloc}{path}{rest}"
    return None


def _django() -> tuple[Any, str, float] | None:
    """(client, prefix, watchdog timeout) of the RLOCK settings when Django is configured
    with ``django_rlock`` installed, else None."""
    try:
        from django.conf import settings
    except ImportError:
        return None
    if not (settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE")):
        return None
    apps = getattr(settings, "INSTALLED_APPS", ())
    if not any(a == "django_rlock" or a.startswith("django_rlock.") for a in apps):
        return None
    from .conf import get_config
    from .connection import get_client, get_prefix

    return get_client(), get_prefix(), float(get_config()["WATCHDOG_TIMEOUT"])


def beat_config(app: Any) -> BeatConfig:
    """The beat's ``BeatConfig`` from the app's settings (see the module docstring);
    ``ImproperlyConfigured`` if no Redis can be found."""
    conf = app.conf
    group = conf.get("rlock_beat_group") or f"celery-beat:{app.main or 'celery'}"
    prefix = conf.get("rlock_beat_prefix")
    timeout = conf.get("rlock_beat_watchdog_timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or timeout <= 0):
        raise ImproperlyConfigured(f"rlock_beat_watchdog_timeout must be a number of seconds "
                                   f"> 0, got {timeout!r}")
    if prefix is not None and not isinstance(prefix, str):
        raise ImproperlyConfigured(f"rlock_beat_prefix must be a str, got {prefix!r}")
    url = conf.get("rlock_beat_url")
    if url is not None and not isinstance(url, str):
        raise ImproperlyConfigured(f"rlock_beat_url must be a Redis URL (str), got {url!r}")
    source = "rlock_beat_url"
    default_timeout = 30.0
    if url is None:
        django = _django()
        if django is not None:
            client, django_prefix, default_timeout = django
            return BeatConfig(client, group, django_prefix if prefix is None else prefix,
                              float(timeout or default_timeout), "RLOCK")
        broker = conf.broker_write_url or conf.broker_url or ""
        url = redis_url_of_broker(broker) if isinstance(broker, str) else None
        if url is None:
            raise ImproperlyConfigured(
                f"django-rlock beat needs Redis: set rlock_beat_url (the broker "
                f"{str(broker).split('://')[0] or 'URL'}:// is not Redis, and Django with "
                f"django_rlock is not configured)")
        source = "broker_url"
    import redis

    wd = float(timeout or default_timeout)
    client = redis.Redis.from_url(url, socket_timeout=max(wd, 1.0),
                                  socket_connect_timeout=max(wd, 1.0))
    return BeatConfig(client, group, "rlock:" if prefix is None else prefix, wd, source)


def describe(info: LeaderInfo | None) -> str:
    if info is None:
        return "none yet"
    where = f"{info.host} pid {info.pid}" if info.pid is not None else info.owner
    return f"{where} ({info.process}), term {info.term}" if info.process else \
        f"{where}, term {info.term}"


#: The signals whose handlers ``signals_deferred`` holds back.
DEFERRED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT that arrive inside the block are handled as it ends (each once, in
    the order they came): beat's handler raises ``SystemExit`` from wherever the main thread
    is, and between advancing a tick and sending it that would lose the tick.

    The Python handlers are swapped for a recorder over the block, then put back and the
    recorded signals raised again. Blocking the signals (``pthread_sigmask``) would not do:
    it holds them back from the calling thread only, the kernel hands them to another of the
    process's threads (the Leader's, the watchdog, pub/sub), and Python then runs the handler
    in the main thread at its next bytecode, inside the block. Only the main thread can swap
    handlers; in any other thread the block defers nothing (and no handler runs there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def record(signum: int, _frame: Any) -> None:
        if signum not in pending:
            pending.append(signum)

    saved: dict[int, Any] = {}
    try:
        for sig in DEFERRED_SIGNALS:
            if signal.getsignal(sig) is not None:  # None: set outside Python, left alone
                saved[sig] = signal.signal(sig, record)
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sig in pending:
            signal.raise_signal(sig)  # its handler runs here, after the block


class LeaderMixin:
    """What makes a Celery ``Scheduler`` send from the leader only (see the module
    docstring). Put it first: ``class S(LeaderMixin, SomeScheduler)``."""

    #: Run the scheduler's ``setup_schedule`` on first election instead of at start (it
    #: writes to a shared database: one writer, not every replica at once).
    setup_when_elected = False

    app: Any
    max_interval: float
    schedule: Any
    old_schedulers: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.leadership: Leader | None = None
        self.progress: TickProgress | None = None
        self.beat: BeatConfig | None = None
        self._term: int | None = None  # the term whose progress is loaded
        self._announced: int | None = None  # the last term logged
        self._standby_logged = False
        self._setup_pending = False
        self._marks: dict[str, int] = {}
        self._due: dict[str, int] = {}
        self._closed = False
        lazy = bool(kwargs.get("lazy", False))
        self._lazy = lazy
        super().__init__(*args, **kwargs)
        if not lazy:
            self.beat = beat_config(self.app)
            leader = Leader(self.beat.client, self.beat.group, self.beat.prefix,
                            watchdog_timeout=self.beat.watchdog_timeout)
            self.progress = TickProgress(leader.client, leader.key, leader.token_key)
            self.leadership = leader.start()

    def setup_schedule(self) -> None:
        if self.setup_when_elected and not getattr(self, "_lazy", True):
            self._setup_pending = True
            return
        super().setup_schedule()  # type: ignore[misc]

    @property
    def info(self) -> str:
        beat = self.beat
        if beat is None:  # the banner's (lazy) instance: say what the beat will use
            try:
                beat = beat_config(self.app)
            except Exception as exc:
                return f"    . leader group -> not configured: {exc}"
        return (f"    . leader group -> {beat.group!r} (watchdog {beat.watchdog_timeout:g} s, "
                f"Redis from {beat.source})")

    # -- the loop --------------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: a standby waits for the election (up to ``max_interval``); the leader
        sends what is due and returns how long to sleep."""
        leader = self.leadership
        if leader is None or self._closed:
            return float(self.max_interval)
        current = self._current()
        if current is None:
            return self._stand_by(leader)
        term, owner = current
        try:
            if term != self._term:
                self._take_office(term)
            return self._lead(term, owner)
        except Exception as exc:  # Redis unreachable, a schedule that fails: try again soon
            logger.warning("django-rlock beat: %s: %s; trying again in %s s",
                           type(exc).__name__, exc, RETRY_PAUSE,
                           exc_info=not isinstance(exc, RedisError))
            self._term = None
            return RETRY_PAUSE

    def _current(self) -> tuple[int, str] | None:
        leader = self.leadership
        assert leader is not None
        term, owner = leader.term, leader.owner
        if term is None or owner is None or leader.term != term:
            return None
        return term, owner

    def _stand_by(self, leader: Leader) -> float:
        if self._term is not None:
            logger.info("django-rlock beat: no longer leading %r (term %s)", leader.group,
                        self._term)
            self._term = None
            self._standby_logged = False
        if not self._standby_logged:
            if leader.wait_elected(STANDBY_GRACE):
                return 0.0
            try:
                who = describe(leader.leader())
            except Exception as exc:
                who = f"unknown ({type(exc).__name__}: {exc})"
            logger.info("django-rlock beat: standing by in group %r; the leader: %s",
                        leader.group, who)
            self._standby_logged = True
        leader.wait_elected(float(self.max_interval))
        return 0.0

    def _take_office(self, term: int) -> None:
        assert self.progress is not None and self.leadership is not None
        self._marks = self.progress.load()
        self._due.clear()
        self._term = term
        self._standby_logged = False
        if self._setup_pending:
            self._setup_pending = False
            super().setup_schedule()  # type: ignore[misc]
        if self._announced != term:
            self._announced = term
            logger.info("django-rlock beat: leading %r, term %d; sending from here (%d entries "
                        "with progress in Redis)", self.leadership.group, term, len(self._marks))

    def _lead(self, term: int, owner: str) -> float:
        progress = self.progress
        assert progress is not None
        schedule = self.schedule
        if not self.schedules_equal(self.old_schedulers, schedule):  # type: ignore[attr-defined]
            self.old_schedulers = copy.copy(schedule)
            self._due.clear()
        now = progress.now()
        wake = now + int(float(self.max_interval) * 1e6)
        for name, entry in list(schedule.items()):
            at = self._due.get(name)
            if at is None or at <= now:
                at = self._visit(entry, term, owner)
                if at is None:
                    return RETRY_PAUSE
                self._due[name] = at
            wake = min(wake, at)
        return max(0.0, (wake - progress.now()) / 1e6)

    def _visit(self, entry: Any, term: int, owner: str) -> int | None:
        """Send ``entry`` if a tick of it is due; returns when to look at it next (server µs),
        None if the term was refused."""
        progress = self.progress
        assert progress is not None
        name = entry.name
        now = progress.now()
        base = self._marks.get(name)
        if base is None:  # never sent by any leader: anchored where the scheduler has it
            base = min(to_us(entry.last_run_at), now)
        entry.last_run_at = local(entry.schedule, base)  # in its timezone (beatticks)
        server_clock(entry.schedule, progress.now)
        try:
            due, next_s = self.is_due(entry)  # type: ignore[attr-defined]
        except Exception:
            logger.exception("django-rlock beat: cannot tell when %r is due; looking again "
                             "in %s s", name, self.max_interval)
            return now + int(float(self.max_interval) * 1e6)
        if not due:
            return now + int(max(0.0, min(float(next_s), float(self.max_interval))) * 1e6)
        tick = latest_tick(entry.schedule, base, now)
        if tick is None:  # due by the scheduler's reckoning, not yet by the tick's
            first = next_after(entry.schedule, base)
            return first if first is not None and first > now else now + 100_000
        with signals_deferred():
            result = progress.advance(term, owner, name, tick, base)
            if result.code == STALE:
                # Deposed, or the term's token key lost (evicted, deleted) while the hash is
                # still renewed: either way the term is over. Given up for real, so the key is
                # released and a leader (maybe this process) elected with a valid term.
                logger.warning("django-rlock beat: term %d refused by Redis (no longer the "
                               "leader of %r, or its token key %r is gone); sending nothing, "
                               "giving the term up and campaigning again", term,
                               self.leadership and self.leadership.group,
                               progress.token_key)
                if self.leadership is not None:
                    self.leadership.abandon(term)
                return None
            self._marks[name] = result.progress if result.progress is not None else base
            if result.code == SEND:
                self._send(entry, term, tick)
        if result.code == SEND:
            after = next_after(entry.schedule, tick)
            return after if after is not None and after > tick else result.now + 1_000_000
        if result.code == NOT_YET:
            return tick
        return result.now  # PAST: the progress was ahead of ours; look again from it

    def _send(self, entry: Any, term: int, tick: int) -> None:
        leader = self.leadership
        assert leader is not None
        when = from_us(tick)
        following = self.reserve(entry)  # type: ignore[attr-defined]  # run count; DB: dirty
        following.last_run_at = when
        model = getattr(following, "model", None)
        if model is not None:
            model.last_run_at = when
        if leader.term != term:  # paused or cut off since the script ran: at most once
            logger.warning("django-rlock beat: tick %s of %r not sent: leadership of term %d "
                           "in doubt", when.isoformat(), entry.name, term)
            return
        options = entry.options
        headers = dict(options.get("headers") or {})
        headers.update(rlock_beat_term=term, rlock_beat_tick=when.isoformat(
            timespec="microseconds"))
        # For this send only (an entry cannot always be copied: django-celery-beat's).
        entry.options = {**options, "headers": headers}
        try:
            self.apply_entry(entry, producer=self.producer)  # type: ignore[attr-defined]
        finally:
            entry.options = options

    # -- shutdown --------------------------------------------------------------------------
    def close(self) -> None:
        """Stand down first (a standby is elected at once), then close as the scheduler
        does. Called again by beat after its signal handler: only the first stops."""
        leader = self.leadership
        if leader is not None and not self._closed:
            self._closed = True
            leader.stop(timeout=max(2.0, self.beat.watchdog_timeout if self.beat else 2.0))
        super().close()  # type: ignore[misc]


class LeaderScheduler(LeaderMixin, Scheduler):
    """Celery's scheduler of the app's ``beat_schedule``, sending from the leader only; no
    schedule file (the progress is in Redis)."""


_database_scheduler: type | None = None
_database_lock = threading.Lock()


def database_scheduler() -> type:
    """``LeaderDatabaseScheduler``, made on first use (importing django-celery-beat needs
    Django set up); ImportError naming the package when it is not installed."""
    global _database_scheduler
    with _database_lock:
        if _database_scheduler is None:
            try:
                from django_celery_beat.schedulers import DatabaseScheduler
            except ImportError as exc:
                raise ImportError(
                    "django_rlock.beat.LeaderDatabaseScheduler needs django-celery-beat: "
                    "pip install django-celery-beat (and add 'django_celery_beat' to "
                    f"INSTALLED_APPS); importing it failed: {exc}") from exc

            class LeaderDatabaseScheduler(LeaderMixin, DatabaseScheduler):  # type: ignore[misc]
                """django-celery-beat's ``DatabaseScheduler``, sending from the leader only:
                entries are read from the database by the leader; the last run recorded there
                is the tick's scheduled time (Redis holds the progress that decides)."""

                setup_when_elected = True

            LeaderDatabaseScheduler.__module__ = __name__
            LeaderDatabaseScheduler.__qualname__ = "LeaderDatabaseScheduler"
            _database_scheduler = LeaderDatabaseScheduler
        return _database_scheduler


def __getattr__(name: str) -> Any:
    if name == "LeaderDatabaseScheduler":
        return database_scheduler()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BeatConfig", "LeaderMixin", "LeaderScheduler", "beat_config", "database_scheduler",
           "redis_url_of_broker"]
