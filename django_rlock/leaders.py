"""Leader election on the Redis connection of a Django cache alias: ``get_leader`` (public as
``django_rlock.get_leader``).

The same connection and prefix as ``get_lock`` (``connection``), the watchdog timeout from
``RLOCK["WATCHDOG_TIMEOUT"]`` unless given. Its elections and revocations are sent as the
``leader_elected`` / ``leader_revoked`` signals and counted by the Prometheus exporter, like
those of any ``Leader`` of the process (``engine.events``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from .conf import lock_options
from .connection import get_client, get_prefix
from .engine.aioleader import AsyncLeader
from .engine.leader import Leader
from .engine.leadership import check_group
from .factory import one_cache

#: The keyword arguments ``get_leader`` passes on (``Leader``'s own).
OPTIONS = ("watchdog_timeout", "on_elected", "on_revoked")


if TYPE_CHECKING:  # the Leader or AsyncLeader it returns, for type checkers
    @overload
    def get_leader(group: str, cache: str | None = None, *, aio: Literal[False] = False,
                   **options: Any) -> Leader: ...
    @overload
    def get_leader(group: str, cache: str | None = None, *, aio: Literal[True],
                   **options: Any) -> AsyncLeader: ...
    @overload
    def get_leader(group: str, cache: str | None = None, *, aio: bool,
                   **options: Any) -> Leader | AsyncLeader: ...


def get_leader(group: str, cache: str | None = None, *,  # type: ignore[misc]
               aio: bool = False, **options: Any) -> Any:
    """A ``Leader`` of ``group`` (an ``AsyncLeader`` with ``aio=True``) on the cache's Redis
    connection, at the configured prefix; not started (``start()``, or ``with``).

    ``options``: ``watchdog_timeout`` (the lease; default ``RLOCK["WATCHDOG_TIMEOUT"]``),
    ``on_elected``, ``on_revoked``. Unknown options and a bad group are refused before any
    Redis command.
    """
    check_group(group)
    one_cache(cache, f"leader group {group!r}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"get_leader() got unknown option(s) {', '.join(unknown)} (leader group "
                        f"{group!r}); it takes {', '.join(OPTIONS)}")
    options.setdefault("watchdog_timeout", lock_options()["watchdog_timeout"])
    client = get_client(cache)
    if aio:
        from .engine.clients import async_twin

        return AsyncLeader(async_twin(client), group, get_prefix(cache), **options)
    return Leader(client, group, get_prefix(cache), **options)


__all__ = ["OPTIONS", "get_leader"]
