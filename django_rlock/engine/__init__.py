"""The lock engine: plain redis-py, no Django anywhere below this package."""

from .aio import AsyncRLock
from .errors import LockBusy, LockError, LockNotOwnedError, LockNotSyncedError
from .lock import RLock
from .multi import AsyncMultiLock, AsyncRedLock, MultiLock, MultiLockError, RedLock

__all__ = ["AsyncMultiLock", "AsyncRLock", "AsyncRedLock", "LockBusy", "LockError",
           "LockNotOwnedError", "LockNotSyncedError", "MultiLock", "MultiLockError", "RLock",
           "RedLock"]
