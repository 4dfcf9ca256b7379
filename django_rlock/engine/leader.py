"""Leader election: one leader per group among every process that campaigns, with fast
takeover, built on FencedLock held in watchdog mode (docs/engine.md, invariant 34).

A term is one FencedLock acquisition of the group's key: its token is the term, strictly
increasing across terms, processes and restarts. Standbys wait for the key like any waiter
(the one wait loop, pub/sub, no polling). The leader keeps the key through the process's
watchdog and believes it leads only while the last renewal Redis confirmed was *sent* less
than ``SAFE_FRACTION`` of the lease ago, by the monotonic clock (``is_leader``): a process
that was frozen, or cut off from Redis, stops believing before its lease can have run out, and
so before anyone else can be elected. A term that is in doubt is over: it is given back (if
Redis still has it) and the Leader campaigns again, for a new term.

The public attributes other modules read (``key``, ``token_key``, ``owner``, ``term``,
``client``) and what they promise: ``leadership``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .kinds import Kind, declare
from .leadership import (
    IN_DOUBT,
    LOST,
    RETRY_MAX,
    RETRY_MIN,
    STOPPED,
    CampaignStopped,
    LeaderBase,
    LeaderInfo,
    LeaderLock,
    Term,
    until,
)
from .wait import settings as wait_settings
from .wait.waiter import State

logger = logging.getLogger("django_rlock")


class Leader(LeaderBase):
    """One process's campaign for the leadership of ``group`` (see the module docstring).

    ``start()`` campaigns on a thread of its own and returns at once; ``stop()`` stands down
    and hands over. ``on_elected(term)`` and ``on_revoked(reason)`` run on that thread (never
    the watchdog's); an exception in one is logged and the campaign goes on.
    """

    def __init__(self, client: Any, group: str, prefix: str = "", *,
                 watchdog_timeout: float = 30.0, on_elected: Callable[[int], Any] | None = None,
                 on_revoked: Callable[[str], Any] | None = None) -> None:
        super().__init__(client, group, prefix, watchdog_timeout, on_elected, on_revoked,
                         LeaderLock)
        self._stop = threading.Event()
        self._elected = threading.Event()
        self._thread: threading.Thread | None = None

    # -- running ---------------------------------------------------------------------------
    def start(self) -> Leader:
        """Campaign in the background (returns at once). A stopped Leader may start again."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"leader {self.group!r} is already started")
        self._stop.clear()
        self._lock.stopping = False
        self._thread = threading.Thread(target=self._run, name=f"django-rlock leader {self.group}",
                                        daemon=True)
        _started.add(self)
        self._emit("leader_started")
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stand down: a leader ends its term (``is_leader()`` false, then
        ``on_revoked("stopped")``, which may wind the work down: the key waits for it) and
        releases the key, so a standby is elected at once; a standby stops waiting. Waits for
        the Leader's thread (up to ``timeout`` s; not when called from that thread, from a
        callback)."""
        self._stop.set()
        self._lock.stopping = True
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        end = None if timeout is None else time.monotonic() + timeout
        while thread.is_alive():
            self._lock.nudge()
            left = 0.05 if end is None else min(0.05, end - time.monotonic())
            if left <= 0:
                break
            thread.join(left)

    def wait_elected(self, timeout: float | None = None) -> bool:
        """Block until this process leads (True) or ``timeout`` s pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return self.is_leader()
            if self._elected.wait(left) and self.is_leader():
                return True
            if self._elected.is_set():  # elected, but that term is over already: wait on
                time.sleep(0.01)

    def leader(self) -> LeaderInfo | None:
        """Who leads the group now (any process's leadership; None: nobody)."""
        return self._lock.read(self.group)  # type: ignore[no-any-return]

    def __enter__(self) -> Leader:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- the Leader's thread ---------------------------------------------------------------
    def _call(self, fn: Callable[..., Any] | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:
            logger.exception("django-rlock: a callback of leader %r failed", self.group)

    def _run(self) -> None:
        lock = self._lock
        owner = lock.current_owner()
        pause = RETRY_MIN
        while not self._stop.is_set():
            try:
                token = lock.lock_and_get_token()
            except CampaignStopped:
                break
            except Exception as exc:
                logger.warning("django-rlock: leader %r campaign: %s: %s; trying again in "
                               "%.1f s", self.group, type(exc).__name__, exc, pause)
                if self._stop.wait(pause):
                    break
                pause = min(pause * 2, RETRY_MAX)
                continue
            pause = RETRY_MIN
            term = self._elect(token, owner)
            if term is None or self._stop.is_set():
                self._give_back()
                continue
            self._elected.set()
            self._announce(token)
            self._call(self.on_elected, token)
            try:
                reason = self._lead(term)
            except Exception:  # a bug here must not leave a believing leader without a thread
                logger.exception("django-rlock: leader %r: its watch failed", self.group)
                reason = self._end(term, IN_DOUBT)
            self._elected.clear()
            self._announce(token, reason)
            self._call(self.on_revoked, reason)
            self._give_back()

    def _give_back(self) -> None:
        """Release the key if Redis still has it ours (a standby is elected at once); nothing
        if it is gone. An error leaves it to expire: it is no longer renewed."""
        try:
            self._lock.unlock()
        except Exception:
            pass

    def _still_ours(self, term: Term) -> bool:
        """One HEXISTS, on a thread of its own so that a frozen Redis never holds the Leader's
        thread past the term's doubt (True: ours, or no answer in time)."""
        answer: list[bool] = []
        done = threading.Event()

        def look() -> None:
            try:
                answer.append(self._lock.holds(term.owner))
            except Exception:
                pass
            done.set()

        threading.Thread(target=look, name=f"django-rlock leader {self.group} look",
                         daemon=True).start()
        done.wait(max(0.0, until(term.hold) - time.monotonic()))
        return not answer or answer[0]

    def _lead(self, term: Term) -> str:
        """Wait until the term ends (stop, loss, doubt); returns the reason, latched."""
        lock = self._lock
        slot = lock.watch()
        try:
            if not slot.confirmed.is_set():
                # (Never past the doubt: a frozen Redis confirms nothing.)
                slot.confirmed.wait(max(0.0, min(wait_settings.SUBSCRIBE_TIMEOUT,
                                                 until(term.hold) - time.monotonic())))
            while True:
                if self._stop.is_set():
                    return self._end(term, STOPPED)
                with self._mu:
                    alive = term.confirmed()
                if not alive:
                    return self._end(term)
                slot.park(max(0.0, until(term.hold) - time.monotonic()) + 0.001)
                if slot.waiter.state is not State.SIGNALED:
                    continue
                # A message on the key's channel (a force-unlock), a reconnection (the key
                # may be gone with a restart) or a nudge: look, without waiting past the doubt.
                slot.leave()
                slot = lock.watch()
                if not self._stop.is_set() and not term.over and not self._still_ours(term):
                    return self._end(term, LOST)
        finally:
            slot.leave()


#: Started Leaders of this process: stopped at interpreter exit, so a normal exit hands over
#: at once instead of after the lease.
_started: weakref.WeakSet[Leader] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for leader in list(_started):
        try:
            leader.stop(timeout=2.0)
        except Exception:
            pass


def _details(probe: dict[str, Any], detail: bool) -> dict[str, Any]:
    return {"term": probe["token"]}


KIND = declare(Kind(
    "leader", "hash",
    note="Deposes the group's leader: it is told at once (on_revoked('lost')) and a standby "
         "is elected with a higher term.",
    open=LeaderLock,
    # Without an index entry (SCAN) its hash reads as a fenced lock's: nothing in it says more.
    detect=lambda probe: False,
    details=_details,
    summary=lambda d: f"term {'-' if d['term'] is None else d['term']}",
    lines=lambda d: [f"term: {'-' if d['term'] is None else d['term']}"]))


__all__ = ["KIND", "Leader", "LeaderInfo"]
