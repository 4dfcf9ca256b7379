"""The package at another git revision, for a before/after in one run (``--baseline REF``)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def extract(ref: str) -> str:
    """``django_rlock`` at git revision ``ref`` in a temp dir (imported by baseline processes)."""
    d = tempfile.mkdtemp(prefix="rlock-baseline-")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "django_rlock"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", d], input=archive, check=True)
    return d
