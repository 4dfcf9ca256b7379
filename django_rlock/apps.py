from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class RLockConfig(AppConfig):
    name = "django_rlock"
    label = "django_rlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Registering checks only: no Redis client is made here (CACHES may still change).
        from .checks import check_settings

        checks.register(check_settings)
