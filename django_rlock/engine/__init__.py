"""The lock engine: plain redis-py, no Django anywhere below this package."""

from .aio import AsyncRLock
from .errors import LockBusy, LockError, LockNotOwnedError, LockNotSyncedError
from .lock import RLock
from .multi import MultiLock, MultiLockError, RedLock

__all__ = ["AsyncRLock", "LockBusy", "LockError", "LockNotOwnedError", "LockNotSyncedError", "MultiLock",
           "MultiLockError", "RLock", "RedLock"]
