"""The suite's redis-server: the package's own test helper (``django_rlock.testing``)."""

from django_rlock.testing import RedisServer, redis_server_binary

__all__ = ["RedisServer", "redis_server_binary"]
