"""``celery -A stdsite worker``: task modules are found only by ``autodiscover_tasks()``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stdsite.settings")

app = Celery("stdsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
