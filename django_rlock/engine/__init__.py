"""The lock engine: plain redis-py, no Django anywhere below this package."""

from .aio import AsyncRLock
from .errors import LockBusy, LockError, LockNotOwnedError, LockNotSyncedError
from .lock import RLock

__all__ = ["AsyncRLock", "LockBusy", "LockError", "LockNotOwnedError", "LockNotSyncedError", "RLock"]
