"""Old import path of the wait loop: ``engine.wait.loop``.

Re-exports it; ``waiting.SUBSCRIBE_TIMEOUT`` and ``MOVED_RECHECK`` read and write
``wait.settings``.
"""

from .wait.compat import forward
from .wait.loop import HandOff, Wait, await_, park_timeout, wait

__all__ = ["HandOff", "Wait", "await_", "park_timeout", "wait"]

forward(__name__, {"SUBSCRIBE_TIMEOUT": "SUBSCRIBE_TIMEOUT", "MOVED_RECHECK": "MOVED_RECHECK"})
