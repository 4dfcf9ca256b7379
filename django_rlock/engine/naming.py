"""Redis names derived from a lock key. The only place that builds them.

Redisson's brace rule: an auxiliary name wraps the key in ``{...}`` unless the key already
carries a hash tag, so the key, its channel and any auxiliary key hash to one Cluster slot
and a Java service using Redisson contends for the very same lock.
"""

from __future__ import annotations

import re

LOCK_CHANNEL_PREFIX = "redisson_lock__channel"
UNLOCK_MESSAGE = "0"


def _prefixed(prefix: str, key: str) -> str:
    return f"{prefix}:{key}" if "{" in key else f"{prefix}:{{{key}}}"


def lock_channel(key: str) -> str:
    """The pub/sub channel a release of ``key`` publishes on."""
    return _prefixed(LOCK_CHANNEL_PREFIX, key)


# The cross-process hand-off (docs/engine.md, invariants 20-24): waiters that
# failed an attempt queue here, and a release grants the lock to the first live one.
HANDOFF_QUEUE_PREFIX = "rlock_handoff_queue"
HANDOFF_WAITERS_PREFIX = "rlock_handoff_waiters"
GRANT_CHANNEL_PREFIX = "rlock_handoff_channel"


def _own(prefix: str, key: str) -> str:
    # The brace rule (one slot with the key), but never shared by K and {K} as a channel is:
    # a braced key's name takes "!" where a wrapped one takes ":".
    return f"{prefix}!{key}" if "{" in key else f"{prefix}:{{{key}}}"


def handoff_queue(key: str) -> str:
    """The list of registered waiters' tokens, in the order they first failed an attempt."""
    return _own(HANDOFF_QUEUE_PREFIX, key)


def handoff_waiters(key: str) -> str:
    """Token -> "<deadline ms> <grant lease ms> <holder info>" for each registered waiter."""
    return _own(HANDOFF_WAITERS_PREFIX, key)


#: Waiters of the kinds without a hand-off (``waiters``): token -> "<deadline ms> 0 <info>",
#: written by the attempts their wait loop sends anyway.
WAITING_PREFIX = "rlock_waiting"


def waiting_key(key: str) -> str:
    """The hash of the waiters of ``key`` that have no hand-off entry (every kind but the
    hand-off ones): same value format as ``handoff_waiters``, in the key's slot."""
    return _own(WAITING_PREFIX, key)


#: A fair lock's waiters of django-rlock in its line: owner -> 0, or when its turn ends (ms).
FAIR_OURS_PREFIX = "rlock_fair_ours"


def fair_ours(key: str) -> str:
    """The hash of a fair lock's waiters that are ours (``engine/fair.py``): a waiter of ours
    takes the lock within ``fair.TURN_MS`` of its turn or is dropped; Redisson's, absent here,
    keep their allowance. In the key's slot, beside Redisson's queue and timeout keys."""
    return _own(FAIR_OURS_PREFIX, key)


def grant_channel(key: str) -> str:
    """Where a release names the waiter it granted the lock to. Only django-rlock listens:
    a Redisson client sees nothing it does not understand on its own channel."""
    return _prefixed(GRANT_CHANNEL_PREFIX, key)


def process_grant_channel(key: str, process: str) -> str:
    """Where a release tells the process ``process`` (its uuid) that it granted the lock to one
    of its asyncio waiters (a token ending in ``PROCESS_TOKEN_MARK``): the grant channel with
    ``@<process>`` after it, so in the key's slot (a shard channel on a cluster) and heard by
    that process's one subscription only."""
    return f"{grant_channel(key)}@{process}"


#: The last character of a token whose process listens on its own grant channel for the lock
#: (``process_grant_channel``): an asyncio waiter's.
PROCESS_TOKEN_MARK = "p"

#: A waiting thread's own channel (``wakeline``): named by its owner, not by a lock, so one
#: subscription serves every lock the thread ever waits for. Not a key: no slot to share.
WAKE_CHANNEL_PREFIX = "rlock_wake"
#: The last character of a token whose waiter listens on its own wake channel.
DIRECT_TOKEN_MARK = "w"


def wake_channel(owner: str) -> str:
    """Where a release tells the waiter ``owner`` (a thread with a wake line) it granted it a
    lock."""
    return f"{WAKE_CHANNEL_PREFIX}:{owner}"


INDEX_PREFIX = "rlock-index"


def index_key(prefix: str, key: str | None = None) -> str:
    """The hash that lists the locks taken under ``prefix`` (field: lock key; value: since when
    and by whom), so listing never has to SCAN the database.

    Outside the prefix, so no lock name can collide with it and ``SCAN prefix*`` never sees it.
    With ``key`` (a lock on a Redis Cluster): that lock's own index, in its slot, since a script
    may not write a key of another slot; listing then finds them per master (``listing``).
    """
    if key is None:
        return f"{INDEX_PREFIX}:{prefix}"
    return _own(f"{INDEX_PREFIX}:{prefix}", key)


_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern (a prefix may contain ``*`` or ``[``)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


#: What a listing shows about a process (pid, label, host), written once per process and
#: server (``records``), not in every index entry.
PROCESS_PREFIX = "rlock-process"


#: A Celery run's record of the holds of ``acks_late`` tasks under one lock name (the
#: Django glue's ``redelivery``): ``rlock-taskrun:<prefix><name>``, never a lock's own name.
TASKRUN_PREFIX = "rlock-taskrun"


def taskrun_key(prefix: str, name: str) -> str:
    return f"{TASKRUN_PREFIX}:{prefix}{name}"


def process_key(process_id: str) -> str:
    """The process record of the process whose uuid is ``process_id``: one string per
    process, under no prefix (every prefix's listing joins it), in a slot of its own."""
    return f"{PROCESS_PREFIX}:{{{process_id}}}"


def prefix_name(prefix: str, key: str) -> str:
    """Redisson's ``prefixName``: ``prefix:{key}`` (``prefix:key`` if it has a hash tag)."""
    return _prefixed(prefix, key)


def suffix_name(key: str, suffix: str) -> str:
    """Redisson's ``suffixName``: ``{key}:suffix`` (``key:suffix`` if it has a hash tag)."""
    return f"{key}:{suffix}" if "{" in key else f"{{{key}}}:{suffix}"


def beat_progress(leader_key: str) -> str:
    """The progress of the schedule a leadership sends (``engine.ticks``): beside the
    leadership hash, in its slot (a hash of entry name -> last tick sent)."""
    return suffix_name(leader_key, "beat")


# The family's names (Redisson's, so Java and Node clients meet ours on the same keys).
FAIR_QUEUE_PREFIX = "redisson_lock_queue"
FAIR_TIMEOUT_PREFIX = "redisson_lock_timeout"
RWLOCK_CHANNEL_PREFIX = "redisson_rwlock"
TOKEN_PREFIX = "redisson_lock_token"
SEMAPHORE_CHANNEL_PREFIX = "redisson_sc"
READ_UNLOCK_MESSAGE = "1"


def fair_waiter_channel(key: str, owner: str) -> str:
    """A fair lock wakes each waiter on its own channel: the next in line, and only it."""
    return f"{lock_channel(key)}:{owner}"


def latch_channel(key: str) -> str:
    # Literal braces around the name, whatever it holds (Redisson builds it this way).
    return "redisson_countdownlatch__channel__{" + key + "}"


#: The lock hash of a leader election (``engine.leader``): ``rlock-leader:<group>``.
LEADER_PREFIX = "rlock-leader"


def leader_name(group: str) -> str:
    """The lock name of ``group``'s leadership (the key is the prefix plus it)."""
    return f"{LEADER_PREFIX}:{group}"


# The rate limiter: Redisson's RRateLimiter keeps its settings in a hash at the key itself,
# the permits left in ``{key}:value`` and the grants in ``{key}:permits``; the line of waiters
# and the channel that wakes them are ours (a Redisson client ignores them).
RATE_CHANNEL_PREFIX = "rlock_rate"
RATE_LINE = "rlock_line"


def rate_keys(key: str) -> tuple[str, str, str, str, str]:
    """The limiter hash, its counter, its grants, its line of waiters and their deadlines."""
    return (key, suffix_name(key, "value"), suffix_name(key, "permits"),
            suffix_name(key, RATE_LINE), suffix_name(key, RATE_LINE + "_timeout"))


def rate_channel(key: str) -> str:
    """Where a change of a limiter's rate or budget is told to its waiters."""
    return _prefixed(RATE_CHANNEL_PREFIX, key)


#: What the owner id's process part gets in the field of a hold turned into a lease
#: (``leases.lease_field``: ``<process uuid>~lease:<serial>[:write]``).
LEASE_MARK = "~lease"
