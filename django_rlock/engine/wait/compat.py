"""The old import paths (``engine.pubsub``, ``engine.waiting``, ``engine.wakeline``).

Each old module re-exports the names users and tests use, and reads and writes its tunables
in ``settings`` (``forward``): ``pubsub.GRANT_LEASE = 1.0`` sets ``settings.GRANT_LEASE``, which
every reader reads at call time.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from . import settings


def _setting(name: str) -> property:
    def get(_module: Any) -> Any:
        return getattr(settings, name)

    def set_(_module: Any, value: Any) -> None:
        setattr(settings, name, value)

    return property(get, set_, doc=f"``wait.settings.{name}``")


def forward(module_name: str, names: dict[str, str]) -> None:
    """Make the module ``module_name`` read and write ``names`` (its name -> the name in
    ``settings``) in ``settings``: each is a property of the module's class."""
    module = sys.modules[module_name]
    attrs = {old: _setting(new) for old, new in names.items()}
    module.__class__ = type("ForwardingModule", (types.ModuleType,), attrs)
