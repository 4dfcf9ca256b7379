"""Example project for django-rlock: settings for the tests, the admin and a demo app."""

from .celery import app as celery_app

__all__ = ["celery_app"]
