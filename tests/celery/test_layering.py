"""The Celery glue depends on the Django glue, never the reverse.

``django_rlock.decorators`` knows tasks only through ``register_task_hooks``; importing
``django_rlock.celery`` registers Celery's hooks, and the app config does that when Celery is
installed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import django_rlock.celery as rlock_celery
from django_rlock import decorators
from django_rlock.engine import LockBusy

ROOT = Path(__file__).parents[2]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_decorators_never_import_the_celery_glue():
    names = imported_modules(ROOT / "django_rlock" / "decorators.py")
    assert not {n for n in names if "celery" in n}, names


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_importing_decorators_loads_neither_celery_nor_the_orm():
    assert run("import sys, django_rlock.decorators; print(sorted(m for m in sys.modules "
               "if m.split('.')[0] == 'celery' or m in ('django_rlock.celery', 'django.db')))"
               ) == "[]"


def test_the_app_config_registers_the_celery_hooks():
    assert run("import django; from django.conf import settings; "
               "settings.configure(INSTALLED_APPS=['django_rlock']); "
               "from django_rlock import decorators; assert decorators._task_hooks is None; "
               "django.setup(); import django_rlock.celery as c; "
               "print(decorators._task_hooks.run is c.run_task)") == "True"


def test_hooks_are_celerys_once_imported():
    assert decorators._task_hooks == decorators.TaskHooks(
        rlock_celery.task_of, rlock_celery.run_task, rlock_celery.retry)


def test_without_hooks_a_task_fails_loudly():
    class FakeTask:  # what a bound Celery task passes as `self`
        name = "app.sync"
        request = None

        def apply_async(self) -> None: ...

        def retry(self) -> None: ...

    @decorators.locked("x:{n}", client=object())
    def body(self: object, n: int) -> None: ...

    previous = decorators.register_task_hooks(None)
    try:
        with pytest.raises(RuntimeError, match="django_rlock.celery is not loaded"):
            decorators._task_of((FakeTask(), 1), body)
        spec = decorators.LockSpec("x", 0, None, "retry", None, object(), None, None, False)
        with pytest.raises(TypeError, match="needs Celery"):
            decorators._on_busy(spec, body, LockBusy("busy", "x", 1.0), (1,), {}, lambda: "")
        assert decorators._task_of((1,), body) is None  # plain calls are unaffected
    finally:
        decorators.register_task_hooks(previous)
