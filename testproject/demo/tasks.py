"""A locked Celery task: never runs twice at once for one account."""

from __future__ import annotations

import logging
import time

from celery import shared_task

from django_rlock import locked

logger = logging.getLogger(__name__)


@shared_task(bind=True)
@locked("sync:{account_id}")
def sync_account(self, account_id: int, seconds: float = 5.0) -> str:
    """Default on_busy for tasks is "skip": a duplicate returns None and logs who holds the lock."""
    logger.info("syncing account %s for %.1f s", account_id, seconds)
    time.sleep(seconds)
    return f"account {account_id} synced"
