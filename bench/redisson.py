"""A Redisson-style client: what Redisson's ``RLock.tryLock(waitTime)`` / ``unlock()`` send.

No django-rlock code: Redisson's acquire and release scripts and its classic pub/sub wake-up,
for bench/foreign.py's (F) run (``clients.make_adapter(FOREIGN, ...)`` wraps it).
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import redis

#: Redisson's default lock lease (``lockWatchdogTimeout``), ms.
REDISSON_LEASE_MS = 30_000
UNLOCK_MESSAGE = b"0"
#: This process's Redisson client id (a spawned process gets its own).
CLIENT_ID = str(uuid.uuid4())

# RedissonLock.tryLockInnerAsync and unlockInnerAsync, concatenated as the Java client builds them.
REDISSON_LOCK = (
    "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) "
    "then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); "
    "return nil; end; return redis.call('pttl', KEYS[1]);")
REDISSON_UNLOCK = (
    "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; "
    "local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); "
    "if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; "
    "else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end; "
    "return nil;")


def redisson_channel(key: str) -> str:
    """Redisson's ``prefixName("redisson_lock__channel", key)``."""
    return f"redisson_lock__channel:{key}" if "{" in key else f"redisson_lock__channel:{{{key}}}"


class RedissonStyleLock:
    """What a Redisson client sends for ``tryLock(waitTime)`` / ``unlock()`` on one thread."""

    _threads = itertools.count(1)

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.key = key
        self.channel = redisson_channel(key)
        self.field = f"{CLIENT_ID}:{next(self._threads)}"
        self._lock = client.register_script(REDISSON_LOCK)
        self._unlock = client.register_script(REDISSON_UNLOCK)
        # Its own pub/sub connection, with the client's settings (so the command counter sees
        # it) but RESP2, Redisson's default, and no read timeout: it may wait long.
        pool = client.connection_pool
        self._sub: Any = pool.connection_class(**{**pool.connection_kwargs, "protocol": 2,
                                                  "socket_timeout": None})
        self._sub.connect()

    def _try(self) -> int | None:
        return self._lock(keys=[self.key], args=[REDISSON_LEASE_MS, self.field])

    def _subscribe(self) -> None:
        self._sub.send_command("SUBSCRIBE", self.channel)
        while self._sub.read_response()[0] != b"subscribe":
            pass  # what the previous subscription still delivered, and its UNSUBSCRIBE reply

    def _await_unlock(self, timeout: float) -> None:
        """Redisson's latch: returns on a "0" on the channel, or after ``timeout``."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0 and self._sub.can_read(left):
            msg = self._sub.read_response()
            if msg[0] == b"message" and msg[2] == UNLOCK_MESSAGE:
                return

    def try_lock(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        if self._try() is None:
            return True
        self._subscribe()
        try:
            while True:
                ttl = self._try()
                if ttl is None:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._await_unlock(min(left, ttl / 1000) if ttl >= 0 else left)
        finally:
            self._sub.send_command("UNSUBSCRIBE", self.channel)  # reply read at the next SUBSCRIBE

    def unlock(self) -> None:
        if self._unlock(keys=[self.key, self.channel],
                        args=[UNLOCK_MESSAGE, REDISSON_LEASE_MS, self.field]) is None:
            raise RuntimeError("Redisson-style client: unlock of a lock it does not hold")

