from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class RLockConfig(AppConfig):
    name = "django_rlock"
    label = "django_rlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Registering checks and the signal bridge only: no Redis client is made here (CACHES
        # may still change).
        from .checks import check_settings
        from .engine import events
        from .signals import forward

        checks.register(check_settings)
        events.add_listener(forward)
