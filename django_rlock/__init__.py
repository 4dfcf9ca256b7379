"""django-rlock: Redisson's distributed locks for Python, first-class in Django and Celery.

Importing this package needs neither Django nor configured settings.
"""

from .engine import LockBusy, LockError, LockNotOwnedError, RLock

__version__ = "0.1.0"

__all__ = ["LockBusy", "LockError", "LockNotOwnedError", "RLock", "__version__"]
