"""The lock engine: plain redis-py, no Django anywhere below this package."""

from .aio import AsyncRLock
from .aioleader import AsyncLeader
from .aiomulti import AsyncMultiLock, AsyncRedLock
from .aioratelimit import AsyncRateLimiter
from .errors import (
    LockBusy,
    LockError,
    LockNotOwnedError,
    LockNotSyncedError,
    LockReentryError,
    LockUpgradeError,
)
from .fair import AsyncFairLock, FairLock
from .fenced import AsyncFencedLock, FencedLock
from .latch import AsyncCountDownLatch, CountDownLatch
from .leader import Leader, LeaderInfo
from .lock import RLock
from .multi import MultiLock, MultiLockError, RedLock
from .nonreentrant import AsyncNonReentrantLock, NonReentrantLock
from .ratelimit import RateLimited, RateLimiter, RateLimiterError
from .rwlock import (
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncWriteLock,
    ReadLock,
    ReadWriteLock,
    WriteLock,
)
from .semaphore import (
    AsyncPermitExpirableSemaphore,
    AsyncSemaphore,
    PermitExpirableSemaphore,
    Semaphore,
)

__all__ = ["AsyncCountDownLatch", "AsyncFairLock", "AsyncFencedLock", "AsyncLeader", "AsyncMultiLock",
           "AsyncNonReentrantLock", "AsyncPermitExpirableSemaphore", "AsyncReadLock",
           "AsyncRateLimiter", "AsyncReadWriteLock", "AsyncRedLock", "AsyncRLock", "AsyncSemaphore",
           "AsyncWriteLock", "CountDownLatch", "FairLock", "FencedLock", "Leader", "LeaderInfo",
           "LockBusy", "LockError", "LockNotOwnedError", "LockNotSyncedError", "LockReentryError",
           "LockUpgradeError",
           "MultiLock", "MultiLockError", "NonReentrantLock", "PermitExpirableSemaphore",
           "RateLimited", "RateLimiter", "RateLimiterError", "ReadLock",
           "ReadWriteLock", "RedLock", "RLock", "Semaphore", "WriteLock"]
