"""django-rlock: Redisson's distributed locks for Python, first-class in Django and Celery.

Importing this package needs neither Django nor configured settings: the engine names are
imported eagerly, the Django-facing ones (``get_lock``, ``locked``, ...) on first use.
"""

import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .engine import (
    AsyncCountDownLatch,
    AsyncFairLock,
    AsyncFencedLock,
    AsyncLeader,
    AsyncMultiLock,
    AsyncNonReentrantLock,
    AsyncPermitExpirableSemaphore,
    AsyncRateLimiter,
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncRedLock,
    AsyncRLock,
    AsyncSemaphore,
    AsyncWriteLock,
    CountDownLatch,
    FairLock,
    FencedLock,
    Leader,
    LeaderInfo,
    LockBusy,
    LockError,
    LockNotOwnedError,
    LockNotSyncedError,
    LockReentryError,
    LockUpgradeError,
    MultiLock,
    MultiLockError,
    NonReentrantLock,
    PermitExpirableSemaphore,
    RateLimited,
    RateLimiter,
    ReadLock,
    ReadWriteLock,
    RedLock,
    RLock,
    Semaphore,
    WriteLock,
)

__version__ = "0.1.0"

#: Django-facing names, imported on first use: name -> module.
_LAZY = {"get_lock": "factory", "get_semaphore": "factory", "get_latch": "factory",
         "locked": "decorators", "limited": "limits", "fenced_update": "fencing",
         "afenced_update": "fencing", "get_leader": "leaders", "rate_limited": "ratelimits",
         "get_rate_limiter": "ratelimits"}

__all__ = ["AsyncCountDownLatch", "AsyncFairLock", "AsyncFencedLock", "AsyncLeader",
           "AsyncMultiLock", "AsyncNonReentrantLock", "AsyncPermitExpirableSemaphore",
           "AsyncRLock", "AsyncRateLimiter", "AsyncReadLock",
           "AsyncReadWriteLock", "AsyncRedLock", "AsyncSemaphore", "AsyncWriteLock",
           "CountDownLatch", "FairLock", "FencedLock", "Leader", "LeaderInfo", "LockBusy",
           "LockError", "LockNotOwnedError", "LockNotSyncedError", "LockReentryError", "LockUpgradeError",
           "MultiLock",
           "MultiLockError", "NonReentrantLock", "PermitExpirableSemaphore", "RLock",
           "RateLimited", "RateLimiter",
           "ReadLock", "ReadWriteLock", "RedLock", "Semaphore", "WriteLock", "__version__",
           *_LAZY]


if TYPE_CHECKING:
    # What the lazy ``__getattr__`` below returns, for type checkers: without these,
    # ``from django_rlock import locked`` is ``Any`` under ``mypy --strict`` and every
    # decorated function loses its type. Keep in step with ``_LAZY`` (tests/typing checks).
    from .decorators import locked as locked
    from .factory import get_latch as get_latch
    from .factory import get_lock as get_lock
    from .factory import get_semaphore as get_semaphore
    from .fencing import afenced_update as afenced_update
    from .fencing import fenced_update as fenced_update
    from .leaders import get_leader as get_leader
    from .limits import limited as limited
    from .ratelimits import get_rate_limiter as get_rate_limiter
    from .ratelimits import rate_limited as rate_limited


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_rlock' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


#: Old module paths -> the module that now lives under another name. ``django_rlock.inspect``
#: became ``django_rlock.inspection`` (a file named inspect.py shadowed the standard library's
#: ``inspect`` for anything run from inside the package directory); the old path still imports.
_MOVED = {f"{__name__}.inspect": f"{__name__}.inspection"}


class _MovedModules:
    """A ``sys.meta_path`` finder and loader that serves each old path in ``_MOVED`` as the
    very module object of its new one (one module: a setting patched through either path is
    seen through both). Imports the new module only when the old path is imported."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        return ModuleSpec(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib

        module = importlib.import_module(_MOVED[spec.name])
        # The import system now sets ``module.__spec__ = spec`` (the alias's);
        # ``exec_module`` puts the module's own back.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
