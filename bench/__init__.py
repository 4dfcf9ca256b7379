"""Benchmarks for django-rlock against the floor and its peers (run ``bench/run.py``).

Everything here starts its own throw-away ``redis-server`` and never touches another one.
"""
