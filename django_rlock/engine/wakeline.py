"""Old import path of the wake lines: ``engine.wait.lines``.

Re-exports it; ``wakeline.ENABLED`` (``settings.LINES_ENABLED``), ``MAX_LINES``,
``OPEN_TIMEOUT`` and ``RETRY_AFTER`` read and write ``wait.settings``.
"""

from .wait.compat import forward
from .wait.lines import WakeLine, line_for, open_count, open_line, usable

__all__ = ["WakeLine", "line_for", "open_count", "open_line", "usable"]

forward(__name__, {"ENABLED": "LINES_ENABLED", "MAX_LINES": "MAX_LINES",
                   "OPEN_TIMEOUT": "OPEN_TIMEOUT", "RETRY_AFTER": "RETRY_AFTER"})
