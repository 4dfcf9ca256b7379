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

from . import process

logger = logging.getLogger("django_rlock")

#: Seconds between two tries of the withdrawals still pending.
RETRY_EVERY = 1.0
#: Longest an entry lives without a budget (the holder's PTTL, 60 s when it has no expiry,
#: plus the registration slack): past it, there is nothing left to withdraw.
LONGEST_ENTRY = 66.0

class _Pending:
    """This process's withdrawals to send again, and the thread sending them."""

    __slots__ = ("items", "lock", "soon", "thread")

    def __init__(self) -> None:
        #: (client, waiters hash, token) -> monotonic time past which the entry is gone anyway.
        self.items: dict[tuple[Any, str, str], float] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        #: Set to send now rather than at the next tick (an entry that must go before a
        #: release grants it: ``later(..., at_once=True)``).
        self.soon = threading.Event()


#: None in a forked child: the parent's thread does not exist there, its waits were not ours.
_state = process.local(_Pending)


def later(client: Any, waiters: str, token: str, until: float | None,
          at_once: bool = False) -> None:
    """Keep withdrawing ``token`` from ``waiters`` on ``client``'s server until it lands or
    ``until`` (its entry's end; None: no budget) has passed. ``at_once``: the first try goes
    now, not after ``RETRY_EVERY`` (an entry our own release just wrote for a waiter that
    had left: the sooner it goes, the less likely the next release grants it to nobody)."""
    now = time.monotonic()
    end = now + LONGEST_ENTRY if until is None else until
    if end <= now:
        return  # the entry has run out already
    pending = _state()
    with pending.lock:
        pending.items[(client, waiters, token)] = end
        if pending.thread is None:
            pending.thread = threading.Thread(target=_run, args=(pending,),
                                              name="django-rlock-withdraw", daemon=True)
            pending.thread.start()
    if at_once:
        pending.soon.set()


def pending() -> int:
    """How many withdrawals are still to land (read by tests)."""
    return len(_state().items)


def _run(pending: _Pending) -> None:
    while True:
        pending.soon.wait(RETRY_EVERY)
        pending.soon.clear()
        with pending.lock:
            now = time.monotonic()
            for item, end in list(pending.items.items()):
                if end <= now:
                    del pending.items[item]
            if not pending.items:
                pending.thread = None
                return
            todo = list(pending.items)
        for item in todo:
            client, waiters, token = item
            try:
                client.hdel(waiters, token)
            except Exception as exc:  # still down: next time
                logger.debug("django-rlock: withdrawing %s from %s failed again (%s)", token,
                             waiters, exc)
                continue
            with pending.lock:
                pending.items.pop(item, None)
