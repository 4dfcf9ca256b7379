"""Reached only through ``app.autodiscover_tasks()``; ``nobase`` is the E006 mistake."""

from celery import shared_task

from django_rlock import locked
from django_rlock.celery import LockedTask


@shared_task
def add(x: int, y: int) -> int:
    return x + y


@shared_task(bind=True)
@locked("invoice:{invoice_id}")
def send_invoice(self: object, invoice_id: int) -> str:
    return f"sent {invoice_id}"


@shared_task(bind=True, base=LockedTask)
@locked("export:{user_id}", dedupe=True)
def export(self: object, user_id: int) -> str:
    return f"export {user_id}"


@shared_task(bind=True)
@locked("nobase:{x}", dedupe=True)
def nobase(self: object, x: int) -> int:
    return x
