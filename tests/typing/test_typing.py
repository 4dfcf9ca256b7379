"""``mypy --strict`` sees the public names typed (#23 section 7).

mypy runs on ``example.py`` only, with ``--follow-imports=silent``: our package is analysed
(its annotations are what the example is checked against) but errors inside it are not
reported, so this test fails for what a user of the package would see, not for the
package's own internal strictness (django and celery ship no stubs; ``Any`` is fine inside).
Runs in a subprocess with a cache dir of its own: about 5-10 s cold.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import django_rlock

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def mypy(path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--cache-dir", str(cache), "--no-error-summary", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_typed_example_passes_mypy_strict(tmp_path):
    out = mypy(HERE / "example.py", tmp_path / "cache")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_wrong_use_of_a_decorated_function_is_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from django_rlock import get_lock, locked\n\n"
                   "@locked('r:{pk}')\ndef report(pk: int) -> str:\n    return ''\n\n"
                   "n: int = report(1)\n"
                   "get_lock('x').no_such_method()\n")
    out = mypy(bad, tmp_path / "cache")
    assert out.returncode == 1
    assert 'Incompatible types in assignment (expression has type "str"' in out.stdout
    assert '"RLock" has no attribute "no_such_method"' in out.stdout


def test_every_lazy_name_is_imported_for_type_checkers():
    tree = ast.parse(Path(django_rlock.__file__).read_text())
    typed = {alias.asname or alias.name
             for node in ast.walk(tree) if isinstance(node, ast.If)
             and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
             for stmt in node.body if isinstance(stmt, ast.ImportFrom)
             for alias in stmt.names}
    assert typed == set(django_rlock._LAZY)
