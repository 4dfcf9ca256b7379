"""Every tunable of the waiting side, in one place; each reader reads it here at call time.

Set them here (``django_rlock.engine.wait.settings.GRANT_LEASE = 1.0``) or through the old
paths, which read and write these same names (``wait.compat``): ``pubsub.GRANT_LEASE``,
``waiting.SUBSCRIBE_TIMEOUT``, ``wakeline.MAX_LINES``, ``wakeline.ENABLED`` (here
``LINES_ENABLED``), and so on.
"""

from __future__ import annotations

# -- the process's subscription (``subscription``) ---------------------------------------
#: Seconds a subscription is kept after its last waiter leaves, so a contended lock does not
#: pay SUBSCRIBE/UNSUBSCRIBE round trips on every wait.
LINGER = 2.0
#: Seconds between the listener's housekeeping passes (lingering unsubscribes, overdue
#: hand-offs, early grants, a PING on a quiet line).
HOUSEKEEPING = 1.0
#: A PING goes out after this long without a message; no reply within ``PONG_TIMEOUT``
#: means a half-open connection, which is dropped and made again.
PING_AFTER = 30.0
PONG_TIMEOUT = 5.0

# -- hand-off (``handoff``) ----------------------------------------------------------------
#: Longest a waiter waits for the outcome of a hand-off to it (the releasing thread's round
#: trip), give or take one housekeeping pass. Past it, the waiter is detached: it carries on as
#: a plain waiter, and its next attempt (claim mode) takes a hand-off that landed (invariant 12).
HANDOFF_TIMEOUT = 5.0
#: Longest a grant lease lasts (seconds): a waiter granted the lock by a release holds it for
#: this long (or its own lease, if shorter) until it renews; its watchdog does so early
#: (invariant 23).
GRANT_LEASE = 3.0
#: After a grant to another process's waiter: if no message on the lock's channels follows
#: within this long, the heir may have died unannounced, and one waiter here re-checks
#: (invariant 23).
GRANT_WATCH = GRANT_LEASE + 0.1
#: Seconds a grant to a token of ours is kept for a waiter that has not joined its queue yet
#: (its first attempt raced the release, invariant 22).
EARLY_KEEP = 10.0
#: After handing the lock to a waiting thread of this process, the releasing thread blocks up
#: to this long (seconds) until that heir runs, so the heir takes the interpreter (the GIL) as
#: soon as it wakes instead of waiting for the releaser to block or for the 5 ms switch
#: interval (0: never wait). Only a sync release waits; an asyncio one never blocks its loop.
HANDOVER_WAIT = 0.002

# -- the wait loop (``loop``) --------------------------------------------------------------
#: Longest a waiter waits for its SUBSCRIBE to be confirmed before relying on its bound alone.
SUBSCRIBE_TIMEOUT = 7.5
#: Longest park of a wait whose lock's slot moved to another node since it subscribed (a
#: cluster resharding or failover): its subscription is on the old node and hears nothing
#: (invariant 28).
MOVED_RECHECK = 0.2

# -- wake lines (``lines``, invariant 25) --------------------------------------------------
#: Open lines for waiting threads (False: every wait uses the shared subscription alone).
LINES_ENABLED = True
#: Most lines one process keeps open (all servers together): threads past it wait through the
#: shared subscription. Bounds the connections a large thread pool can cost.
MAX_LINES = 32
#: Longest the opening SUBSCRIBE of a line may take before the line is given up.
OPEN_TIMEOUT = 2.0
#: After a line could not be opened, seconds before a thread tries again.
RETRY_AFTER = 30.0
