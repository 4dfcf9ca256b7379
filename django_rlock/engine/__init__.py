"""The lock engine: plain redis-py, no Django anywhere below this package."""

from .errors import LockBusy, LockError, LockNotOwnedError
from .lock import RLock

__all__ = ["LockBusy", "LockError", "LockNotOwnedError", "RLock"]
