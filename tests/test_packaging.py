"""The wheel: built without warnings, complete (templates, migrations, py.typed), and working
once installed into a fresh venv. Offline: no build isolation, no index.

The fresh venv gets the wheel from pip (``--no-deps``); its dependencies (redis-py, Django)
are borrowed from the test venv through a ``.pth`` line, placed after the venv's own
site-packages, so ``django_rlock`` itself can only come from the wheel (checked).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import django_rlock
from django_rlock.engine.scripts import ACQUIRE_SCRIPT

ROOT = Path(__file__).parents[1]


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's pip settings are not the project's
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # else distutils says "warning: ... byte-compiling"
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a copy of the sources (the work tree gets no build/ droppings)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "setup.py", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "django_rlock", src / "django_rlock",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-v", "-w", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, timeout=300, env=pip_env())
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    (wheel,) = (tmp / "dist").glob("django_rlock-*.whl")
    return wheel, output


def test_build_prints_no_warning(built):
    _, output = built
    warnings = [line for line in output.splitlines() if re.search(r"warn", line, re.I)]
    assert warnings == [], "\n".join(warnings)


def test_wheel_has_templates_migrations_and_py_typed(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("py.typed", "migrations/__init__.py", "migrations/0001_initial.py",
                 "templates/admin/django_rlock/lock/change_list.html",
                 "templates/admin/django_rlock/lock/detail.html",
                 "templates/admin/django_rlock/lock/force_unlock_confirmation.html",
                 "transaction.py", "celery.py", "engine/lock.py",
                 "management/commands/locks.py"):
        assert f"django_rlock/{name}" in names, name
    assert not [n for n in names if n.startswith(("tests/", "testproject/", "demo/", "bench/"))]
    # The Lua scripts are read from package data at import: every file ships.
    lua = {p.name for p in (ROOT / "django_rlock/engine/lua").glob("*.lua")}
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("django_rlock/engine/lua/")}
    assert lua and lua <= shipped, sorted(lua - shipped)
    metadata = zipfile.ZipFile(wheel).read(
        f"django_rlock-{django_rlock.__version__}.dist-info/METADATA").decode()
    assert f"Version: {django_rlock.__version__}\n" in metadata
    assert "Requires-Dist: redis>=5\n" in metadata
    assert "License-Expression: MIT\n" in metadata


SMOKE = """
import sys
from pathlib import Path

import django_rlock
from django_rlock import RLock, get_lock, locked

here = Path(django_rlock.__file__).parent
assert here.is_relative_to(Path(sys.prefix)), here
assert (here / "py.typed").is_file()

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                    "django.contrib.sessions", "django.contrib.messages", "django_rlock"],
    TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()
from django.db.migrations.loader import MigrationLoader
from django.template.loader import get_template

for name in ("change_list", "detail", "force_unlock_confirmation"):
    origin = Path(get_template(f"admin/django_rlock/lock/{name}.html").origin.name)
    assert origin.is_relative_to(here), origin
assert ("django_rlock", "0001_initial") in MigrationLoader(None).disk_migrations
from django_rlock.engine.scripts import ACQUIRE_SCRIPT  # its Lua read from the wheel's files

print("ok", RLock.__name__, django_rlock.__version__, ACQUIRE_SCRIPT.sha)
"""


def test_wheel_installs_into_a_fresh_venv_and_works(built, tmp_path):
    wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                    "--no-index", "-q", str(wheel)], check=True, timeout=300, env=pip_env())
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
    site = Path(purelib.stdout.strip())
    assert (site / "django_rlock" / "templates").is_dir()
    (site / "zz_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([str(python), "-c", SMOKE], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={"PATH": os.environ.get("PATH", "")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ok RLock {django_rlock.__version__} {ACQUIRE_SCRIPT.sha}"
