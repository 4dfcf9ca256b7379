"""Old import path of the process's subscription and waiter queues: ``engine.wait``.

Re-exports the names users and tests use; ``pubsub.GRANT_LEASE``, ``GRANT_WATCH``,
``HANDOFF_TIMEOUT`` and ``LINGER`` read and write ``wait.settings``.
"""

from .wait.channel import Channel, WakePolicy, wake_all, wake_count
from .wait.compat import forward
from .wait.manager import PubSubManager, existing_manager, manager
from .wait.slot import Slot
from .wait.subscription import subscriber_name
from .wait.waiter import HandOff, State, Waiter

__all__ = ["Channel", "HandOff", "PubSubManager", "Slot", "State", "WakePolicy", "Waiter",
           "existing_manager", "manager", "subscriber_name", "wake_all", "wake_count"]

forward(__name__, {name: name for name in ("LINGER", "HANDOFF_TIMEOUT", "GRANT_LEASE",
                                           "GRANT_WATCH")})
