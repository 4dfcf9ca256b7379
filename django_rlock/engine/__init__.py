"""The lock engine: plain redis-py, no Django anywhere below this package."""

from .aio import AsyncRLock
from .errors import LockBusy, LockError, LockNotOwnedError, LockNotSyncedError
from .fair import AsyncFairLock, FairLock
from .fenced import AsyncFencedLock, FencedLock
from .latch import AsyncCountDownLatch, CountDownLatch
from .lock import RLock
from .multi import AsyncMultiLock, AsyncRedLock, MultiLock, MultiLockError, RedLock
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

__all__ = ["AsyncCountDownLatch", "AsyncFairLock", "AsyncFencedLock", "AsyncMultiLock",
           "AsyncPermitExpirableSemaphore", "AsyncRLock", "AsyncReadLock", "AsyncReadWriteLock",
           "AsyncRedLock", "AsyncSemaphore", "AsyncWriteLock", "CountDownLatch", "FairLock", "FencedLock",
           "LockBusy", "LockError", "LockNotOwnedError", "LockNotSyncedError", "MultiLock",
           "MultiLockError", "PermitExpirableSemaphore", "RLock", "ReadLock", "ReadWriteLock",
           "RedLock", "Semaphore", "WriteLock"]
