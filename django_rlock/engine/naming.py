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
