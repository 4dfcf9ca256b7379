"""The source layout, enforced (issue #24). Static checks read the sources with ``ast``.

- No module in ``django_rlock/`` is longer than ``MAX_LINES`` physical lines.
- No import cycle among the modules of ``django_rlock/``, nor among those of ``bench/``. Every
  ``import`` / ``from ... import`` statement counts, at module level and inside functions and
  methods alike (both of the issue's circles closed through an import inside a function);
  only those under ``if TYPE_CHECKING:`` do not (they never run). ``from pkg import name``
  depends on ``pkg.name`` when that is a module, else on ``pkg``; importing a submodule is not
  counted as depending on its parent package's ``__init__``. Imports by computed name
  (``importlib.import_module(...)``, as ``django_rlock.__getattr__`` does) are not seen.
- No module of ``django_rlock/`` or ``bench/`` imports a private name (``_name``, not
  ``__dunder__``, not a submodule) of another module of either, ``from .x import _name`` or
  ``from django_rlock.x import _name``: what is shared gets a public name.
- Nothing under ``django_rlock/engine/`` imports Django, Celery or the package's Django layer
  (any module of ``django_rlock`` outside ``engine``), at any level, ``TYPE_CHECKING`` included;
  and importing every engine module loads none of them (checked in a fresh interpreter).
- No module of ``django_rlock/`` or ``bench/`` is named like a standard-library module
  (``python bench/run.py`` puts ``bench/`` first on ``sys.path``).
- Every import path the README and docs promise imports, with its name.

``LONG_MODULES`` and ``PRIVATE_IMPORTS`` list the violations known when this test was written,
each with its reason, while the restructure of #24 lands: a new violation fails, and so does an
entry that no longer is one (remove it). The ``test_checks_*`` tests run each check on a
small tree of their own, so a check that can no longer fail is caught too.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("django_rlock", "bench")
MAX_LINES = 500

#: Modules over MAX_LINES today: path -> why, until the split named lands.
LONG_MODULES: dict[str, str] = {}

#: Private names imported from another module today: "path imports module._name" -> why.
PRIVATE_IMPORTS: dict[str, str] = {}

#: What an engine module may never import (top-level package names).
NOT_IN_ENGINE = frozenset({"django", "celery", "django_redis", "kombu"})

#: The import paths the README and docs promise: module -> names. Plus every name of
#: ``django_rlock.__all__`` (``test_package_names_import``).
PROMISED: dict[str, tuple[str, ...]] = {
    "django_rlock.engine.listing": ("Locks",),
    "django_rlock.engine.events": ("add_listener",),
    "django_rlock.engine.identity": ("set_process_label",),
    "django_rlock.engine.wakeline": ("MAX_LINES", "ENABLED"),
    "django_rlock.engine.clients": ("OWN_CONNECTIONS",),
    "django_rlock.celery": ("LockedTask",),
    "django_rlock.testing": ("RedisServer",),
    "django_rlock.inspection": ("LockInspector", "list_locks", "show", "clear", "clear_all"),
    "django_rlock.inspect": ("LockInspector", "list_locks", "show", "clear", "clear_all"),
    "django_rlock.connection": ("get_client", "get_prefix", "cache_alias"),
    "django_rlock.factory": ("get_lock", "get_semaphore", "get_latch", "lock_of_kind",
                             "check_kind", "check_permits"),
    "django_rlock.conf": ("get_config",),
    "django_rlock.apps": ("RLockConfig",),
    "django_rlock.signals": ("lock_lost", "force_unlocked_by"),
    "django_rlock.transaction": ("hold_until_commit",),
    "django_rlock.prometheus": ("install",),
    "django_rlock.tracing": ("install", "uninstall", "LockTracer"),
    "django_rlock.toolbar": ("LocksPanel",),
    "django_rlock.fencing": ("fenced_update", "afenced_update"),
    "django_rlock.beat": ("LeaderScheduler", "beat_config"),
    "django_rlock.engine.ticks": ("TickProgress",),
}


# -- reading the sources ------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    path: str  # the importing file, relative to the root
    line: int
    target: str  # the module imported from, resolved ("django_rlock.engine", "redis")
    names: tuple[str, ...]  # ``from target import names``; () for ``import target``
    type_checking: bool
    in_function: bool


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "__pycache__" in parts or ".venv" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(root: Path, module: str, path: Path) -> Iterator[Import]:
    """Every import statement of one module, its relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    rel = path.relative_to(root).as_posix()

    def walk(nodes: list[ast.stmt], type_checking: bool, in_function: bool) -> Iterator[Import]:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(rel, node.lineno, alias.name, (), type_checking, in_function)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                yield Import(rel, node.lineno, target, tuple(a.name for a in node.names),
                             type_checking, in_function)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, True, in_function)
                yield from walk(node.orelse, type_checking, in_function)
            else:
                inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        yield from walk([child], type_checking, inner)
                    elif isinstance(child, ast.excepthandler | ast.match_case):
                        yield from walk(child.body, type_checking, inner)

    yield from walk(ast.parse(path.read_text(), str(path)).body, False, False)


def all_imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, list[Import]]:
    return {m: list(imports_of(root, m, p)) for m, p in modules(root, packages).items()}


def depends_on(imp: Import, known: dict[str, Path]) -> Iterator[str]:
    """The modules of ``known`` one import statement loads by name."""
    if not imp.names:
        parts = imp.target.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in known:
                yield ".".join(parts[:n])
                return
        return
    for name in imp.names:
        if f"{imp.target}.{name}" in known:
            yield f"{imp.target}.{name}"
        elif imp.target in known:
            yield imp.target


# -- the checks ---------------------------------------------------------------------------------
def long_modules(root: Path, package: str = "django_rlock") -> dict[str, int]:
    """Modules over MAX_LINES: path -> physical lines."""
    out = {}
    for path in modules(root, (package,)).values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            out[path.relative_to(root).as_posix()] = lines
    return out


def import_cycles(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[list[str]]:
    """One cycle (as "module:line -> ..." steps) per strongly connected group of modules."""
    known = modules(root, packages)
    edges: dict[str, dict[str, Import]] = {m: {} for m in known}
    for module, imps in all_imports(root, packages).items():
        for imp in imps:
            if imp.type_checking:
                continue
            for dep in depends_on(imp, known):
                if dep != module:
                    edges[module].setdefault(dep, imp)
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    cycles = []
    for group in groups:  # a shortest way round from the group's first module, for the message
        start = group[0]
        paths = {start: [start]}
        queue = [start]
        found = None
        while queue and found is None:
            v = queue.pop(0)
            for w in sorted(edges[v]):
                if w == start:
                    found = paths[v]
                    break
                if w in group and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        assert found is not None
        steps = []
        for a, b in zip(found, found[1:] + [start], strict=True):
            imp = edges[a][b]
            where = "in a function" if imp.in_function else "module level"
            steps.append(f"{a} (line {imp.line}, {where}) -> {b}")
        cycles.append(steps)
    return cycles


def private_imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> set[str]:
    """``"path imports module._name"`` for each private name imported from another module."""
    known = modules(root, packages)
    out = set()
    for imps in all_imports(root, packages).values():
        for imp in imps:
            if imp.target.split(".")[0] not in packages:
                continue
            for name in imp.names:
                private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
                if private and f"{imp.target}.{name}" not in known:
                    out.add(f"{imp.path} imports {imp.target}.{name}")
    return out


def engine_imports_of_django(root: Path) -> list[str]:
    """Engine imports of Django, Celery or the Django layer, at any level."""
    out = []
    for module, imps in all_imports(root, ("django_rlock",)).items():
        if not (module + ".").startswith("django_rlock.engine."):
            continue
        for imp in imps:
            targets = [imp.target] if not imp.names else [f"{imp.target}.{n}" for n in imp.names]
            for target in targets:
                top = target.split(".")[0]
                own_outside = top == "django_rlock" and not (target + ".").startswith(
                    "django_rlock.engine.")
                if top in NOT_IN_ENGINE or own_outside:
                    out.append(f"{imp.path}:{imp.line} imports {target}")
    return out


def stdlib_shadows(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    return [p.relative_to(root).as_posix() for p in modules(root, packages).values()
            if p.stem in sys.stdlib_module_names]


# -- the tree's tests ---------------------------------------------------------------------------
def test_no_module_over_max_lines():
    new = {p: n for p, n in long_modules(ROOT).items() if p not in LONG_MODULES}
    assert not new, f"over {MAX_LINES} lines (split them): {new}"


def test_long_modules_lists_only_long_modules():
    long = long_modules(ROOT)
    stale = {p: len((ROOT / p).read_text().splitlines()) if (ROOT / p).exists() else "gone"
             for p in LONG_MODULES if p not in long}
    assert not stale, f"no longer over {MAX_LINES} lines: remove from LONG_MODULES: {stale}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    cycles = [c for c in import_cycles(ROOT) if c[0].split(" ")[0].split(".")[0] == package]
    assert not cycles, "import cycles:\n" + "\n".join("  " + "\n  ".join(c) for c in cycles)


def test_no_private_name_imported_across_modules():
    new = private_imports(ROOT) - PRIVATE_IMPORTS.keys()
    assert not new, "private names imported from another module (give them a public name):\n" \
        + "\n".join(sorted(new))


def test_private_imports_lists_only_live_ones():
    stale = PRIVATE_IMPORTS.keys() - private_imports(ROOT)
    assert not stale, f"no longer imported: remove from PRIVATE_IMPORTS: {sorted(stale)}"


def test_the_engine_never_imports_django_or_celery():
    assert engine_imports_of_django(ROOT) == []


def test_importing_every_engine_module_loads_no_django_or_celery():
    engine = sorted(m for m in modules(ROOT, ("django_rlock",))
                    if (m + ".").startswith("django_rlock.engine."))
    code = (f"import importlib, sys\nfor m in {engine!r}:\n    importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{sorted(NOT_IN_ENGINE)!r} or (m.startswith('django_rlock.') and "
            "not m.startswith('django_rlock.engine'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_no_module_shadows_the_standard_library():
    assert stdlib_shadows(ROOT) == []


@pytest.mark.parametrize("module", sorted(PROMISED))
def test_promised_paths_import(module):
    imported = importlib.import_module(module)
    missing = [n for n in PROMISED[module] if not hasattr(imported, n)]
    assert not missing, f"{module} lacks {missing}"


def test_package_names_import():
    import django_rlock

    missing = [n for n in django_rlock.__all__ if getattr(django_rlock, n, None) is None]
    assert not missing


def test_the_old_inspect_path_is_the_inspection_module():
    old = importlib.import_module("django_rlock.inspect")
    new = importlib.import_module("django_rlock.inspection")
    assert old is new and sys.modules["django_rlock.inspect"] is new
    assert new.__spec__.name == "django_rlock.inspection" and new.__name__ == new.__spec__.name
    assert not (ROOT / "django_rlock" / "inspect.py").exists()


def test_the_old_inspect_path_imports_in_a_fresh_interpreter():
    code = ("import django; from django.conf import settings; settings.configure(); "
            "from django_rlock.inspect import LockInspector; import django_rlock.inspection as i; "
            "import django_rlock.inspect as o; print(o is i, LockInspector is i.LockInspector)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True"


# -- each check can fail ------------------------------------------------------------------------
def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checks_find_a_cycle_through_a_function_level_import(tmp_path):
    root = write(tmp_path, {
        "django_rlock/__init__.py": "",
        "django_rlock/a.py": "from .b import g\n",
        "django_rlock/b.py": "def g():\n    from django_rlock import a\n",
        "django_rlock/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from .a import g\nfrom . import a\n",
        "bench/__init__.py": "",
        "bench/x.py": "from bench.y import z\n",
        "bench/y.py": "try:\n    pass\nexcept ImportError:\n    from . import x\nz = 1\n",
    })
    cycles = import_cycles(root)
    assert [c[0].split(" ")[0] for c in cycles] == ["bench.x", "django_rlock.a"], cycles
    assert "in a function" in cycles[1][1]


def test_checks_ignore_a_cycle_only_under_type_checking(tmp_path):
    root = write(tmp_path, {
        "django_rlock/__init__.py": "",
        "django_rlock/a.py": "from . import b\n",
        "django_rlock/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import x\n"
                             "else:\n    import json\n",
    })
    assert import_cycles(root, ("django_rlock",)) == []


def test_checks_find_a_long_module_a_private_import_django_in_the_engine_and_a_shadow(tmp_path):
    root = write(tmp_path, {
        "django_rlock/__init__.py": "",
        "django_rlock/long.py": "x = 1\n" * (MAX_LINES + 1),
        "django_rlock/fine.py": "x = 1\n" * MAX_LINES,
        "django_rlock/inspect.py": "",
        "django_rlock/engine/__init__.py": "from . import _sub\nfrom .core import __all__\n",
        "django_rlock/engine/_sub.py": "",
        "django_rlock/engine/core.py": "_X = 1\n__all__ = []\n",
        "django_rlock/engine/kind.py": "from .core import _X\n"
                                       "def f():\n    from django.db import models\n"
                                       "    from ..connection import get_client\n",
        "django_rlock/engine/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    import celery\n",
        "django_rlock/glue.py": "from django_rlock.engine.core import (\n    _X,\n)\n",
        "bench/__init__.py": "",
        "bench/b.py": "from django_rlock.engine.core import _X as y\n",
    })
    assert long_modules(root) == {"django_rlock/long.py": MAX_LINES + 1}
    assert private_imports(root) == {
        "django_rlock/engine/kind.py imports django_rlock.engine.core._X",
        "django_rlock/glue.py imports django_rlock.engine.core._X",
        "bench/b.py imports django_rlock.engine.core._X"}
    assert engine_imports_of_django(root) == [
        "django_rlock/engine/kind.py:3 imports django.db.models",
        "django_rlock/engine/kind.py:4 imports django_rlock.connection.get_client",
        "django_rlock/engine/typed.py:3 imports celery"]
    assert stdlib_shadows(root) == ["django_rlock/inspect.py"]
