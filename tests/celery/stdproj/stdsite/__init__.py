"""A project laid out as Celery's Django guide says: the app is loaded with Django."""

from .celery import app as celery_app

__all__ = ("celery_app",)
