"""Withdrawals from the hand-off queue whose round trip failed, sent again until they land.

A waiter that gives up takes its entry out of the lock's line (invariant 24). When that round
trip fails (the server restarting, a failover under way: ``MasterNotFoundError``), the entry
stays, and any release before it runs out grants the lock to a wait that is over: nobody takes
it, and the lock sits unannounced for a grant lease. So a failed withdrawal is kept here and
sent again, once a second, until it lands or the entry has run out by itself.

Only the entry is dropped (``HDEL``): a grant that reached the token meanwhile is not given
back from here, since the same owner may have taken the lock again since (invariant 7). Its
owner's next acquire takes such a grant as a fresh hold (invariant 32), or it runs out.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from . import identity

logger = logging.getLogger("django_rlock")

#: Seconds between two tries of the withdrawals still pending.
RETRY_EVERY = 1.0
#: Longest an entry lives without a budget (the holder's PTTL, 60 s when it has no expiry,
#: plus the registration slack): past it, there is nothing left to withdraw.
LONGEST_ENTRY = 66.0

# (client, waiters hash, token) -> monotonic time past which the entry is gone anyway.
_pending: dict[tuple[Any, str, str], float] = {}
_lock = threading.Lock()
_thread: threading.Thread | None = None


def later(client: Any, waiters: str, token: str, until: float | None) -> None:
    """Keep withdrawing ``token`` from ``waiters`` on ``client``'s server until it lands or
    ``until`` (its entry's end; None: no budget) has passed."""
    global _thread
    now = time.monotonic()
    end = now + LONGEST_ENTRY if until is None else until
    if end <= now:
        return  # the entry has run out already
    with _lock:
        _pending[(client, waiters, token)] = end
        if _thread is None:
            _thread = threading.Thread(target=_run, name="django-rlock-withdraw", daemon=True)
            _thread.start()


def pending() -> int:
    """How many withdrawals are still to land (read by tests)."""
    return len(_pending)


def _run() -> None:
    global _thread
    while True:
        time.sleep(RETRY_EVERY)
        with _lock:
            now = time.monotonic()
            for item, end in list(_pending.items()):
                if end <= now:
                    del _pending[item]
            if not _pending:
                _thread = None
                return
            todo = list(_pending)
        for item in todo:
            client, waiters, token = item
            try:
                client.hdel(waiters, token)
            except Exception as exc:  # still down: next time
                logger.debug("django-rlock: withdrawing %s from %s failed again (%s)", token,
                             waiters, exc)
                continue
            with _lock:
                _pending.pop(item, None)


def _reset_after_fork() -> None:
    # The parent's thread does not exist here, and its waits were not ours.
    global _lock, _thread
    _pending.clear()
    _lock = threading.Lock()
    _thread = None


identity.on_fork(_reset_after_fork)
