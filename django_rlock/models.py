"""An unmanaged model with no table: the admin's "Locks" entry and its permissions.

The rows live in Redis; the admin reads them there (see ``admin.py``). The migration creates
no table, but it lets ``post_migrate`` create the ``view_lock`` and ``force_unlock`` permissions.
"""

from __future__ import annotations

from django.db import models


class Lock(models.Model):
    name = models.CharField(max_length=1024, primary_key=True)

    class Meta:
        managed = False
        verbose_name = "lock"
        verbose_name_plural = "locks"
        default_permissions = ("view",)
        permissions = [("force_unlock", "Can force-unlock locks")]

    def __str__(self) -> str:
        return self.name
