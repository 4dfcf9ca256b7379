"""A ``LeaderScheduler`` that is sent SIGTERM inside its first send (run by
``tests/celery/test_beat_faults.py``): from another thread, as the kernel may deliver it to any
of the process's threads, then the main thread runs bytecode for a while before sending.

Celery's handler raises ``SystemExit``: run there, it would lose the tick (its progress in
Redis already advanced, its message not sent). ``signals_deferred`` must hold it back until the
message is out.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from django_rlock.beat import LeaderScheduler


class SigtermInSend(LeaderScheduler):
    sent = False

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if not SigtermInSend.sent:
            SigtermInSend.sent = True
            killer = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM))
            killer.start()
            killer.join()
            end = time.monotonic() + 0.5
            while time.monotonic() < end:  # a handler not held back runs here
                time.sleep(0.01)
        super().apply_entry(entry, producer=producer)
