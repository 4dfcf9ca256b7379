"""engine/lua: one file per script, its header, and what the loader expands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_rlock.engine import lua
from django_rlock.engine.lua import FILES, Script, load, source

ROOT = Path(__file__).parents[2]
SCRIPTS = sorted(name for name in FILES if not name.startswith("_"))
SNIPPETS = sorted(name for name in FILES if name.startswith("_"))


def header(name: str) -> list[str]:
    out = []
    for line in FILES[name].splitlines():
        if not line.startswith("--") or line.startswith("-- #"):
            break
        out.append(line)
    return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_says_what_it_takes_and_replies(name):
    text = " ".join(header(name))
    for word in ("KEYS", "ARGV", "Reply"):
        assert word in text, f"{name}.lua: its header does not say {word}"
    assert FILES[name].endswith("\n")


def test_every_file_is_used():
    python = "\n".join(p.read_text() for p in (ROOT / "django_rlock").rglob("*.py"))
    loaded = set(re.findall(r'\b(?:source|load)\("(\w+)"', python))
    assert set(SCRIPTS) <= loaded, sorted(set(SCRIPTS) - loaded)
    included = {m[1] for text in FILES.values() for m in re.finditer(r"-- #include (\w+)", text)}
    assert {name[1:] for name in SNIPPETS} <= included
    assert all(header(name) for name in SNIPPETS)


def test_the_header_is_not_sent_and_snippets_are_indented_as_their_directive(monkeypatch):
    monkeypatch.setitem(FILES, "_inner", "-- Snippet.\n\nlocal a = '{{WHO}}'\n\n")
    monkeypatch.setitem(FILES, "_outer", "-- Snippet.\n\nif x then\n  -- #include inner WHO=me\nend\n")
    monkeypatch.setitem(FILES, "t", "-- KEYS, ARGV, Reply.\n-- More.\n\n  -- #include outer\n"
                                    "-- a comment in the body\nreturn {{N}}\n")
    assert source("t", N=-3) == ("\n  if x then\n    local a = 'me'\n  end\n"
                                 "-- a comment in the body\nreturn -3\n")
    script = load("t", N=-3)
    assert isinstance(script, Script) and script.source == source("t", N=-3)


def test_a_placeholder_left_or_a_value_unused_is_an_error(monkeypatch):
    monkeypatch.setitem(FILES, "t", "-- Header.\n\nreturn {{N}}\n")
    with pytest.raises(ValueError, match="no value for"):
        source("t")
    with pytest.raises(ValueError, match="no placeholder for"):
        source("t", N=1, M=2)
    with pytest.raises(ValueError, match="no Lua file"):
        source("nonexistent")


def test_scripts_are_read_once_from_the_package():
    assert set(FILES) == {p.stem for p in Path(lua.__file__).parent.glob("*.lua")}
