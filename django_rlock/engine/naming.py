"""Redis names derived from a lock key. The only place that builds them.

Redisson's brace rule: an auxiliary name wraps the key in ``{...}`` unless the key already
carries a hash tag, so the key, its channel and any auxiliary key hash to one Cluster slot
and a Java service using Redisson contends for the very same lock.
"""

from __future__ import annotations

LOCK_CHANNEL_PREFIX = "redisson_lock__channel"
UNLOCK_MESSAGE = "0"


def _prefixed(prefix: str, key: str) -> str:
    return f"{prefix}:{key}" if "{" in key else f"{prefix}:{{{key}}}"


def lock_channel(key: str) -> str:
    """The pub/sub channel a release of ``key`` publishes on."""
    return _prefixed(LOCK_CHANNEL_PREFIX, key)


INDEX_PREFIX = "rlock-index"


def index_key(prefix: str) -> str:
    """The hash that lists the locks taken under ``prefix`` (field: lock key; value: since when
    and by whom), so listing never has to SCAN the database.

    Outside the prefix, so no lock name can collide with it and ``SCAN prefix*`` never sees it.
    """
    return f"{INDEX_PREFIX}:{prefix}"
