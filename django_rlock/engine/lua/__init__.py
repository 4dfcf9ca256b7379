"""The Lua scripts, one per file, and the ``Script`` that carries one to Redis.

``<name>.lua`` is a script; ``_<name>.lua`` a snippet that scripts (and other snippets) include.
Every file starts with a header: its leading comment lines, which say what it takes (KEYS,
ARGV) and what it replies. The header is not sent: a script's source is the rest of its file,
with two expansions:

- a line ``-- #include <snippet> [NAME=value ...]`` becomes the snippet's lines (its header
  and its leading and trailing blank lines dropped), each indented as the directive is;
  ``{{NAME}}`` in the snippet becomes ``value``;
- ``{{NAME}}`` anywhere else becomes a value that lives in Python (a reply code, a channel
  prefix), passed by name to ``source`` / ``load``.

Every placeholder must be filled and every value given must be used, else ``ValueError`` (at
import: the module that loads the script fails to import). The files are read once, here.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from typing import Any

from ..clients import sharded
from ..naming import WAKE_CHANNEL_PREFIX

#: Every ``.lua`` file of this package, by name (without ``.lua``), as text.
FILES: dict[str, str] = {
    entry.name[:-4]: entry.read_text(encoding="utf-8")
    for entry in resources.files(__name__).iterdir()
    if entry.name.endswith(".lua")
}

_INCLUDE = re.compile(r"^([ \t]*)-- #include (\w+)((?: \w+=\S+)*)[ \t]*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def _body(name: str) -> str:
    """The file's text after its header (leading ``--`` lines that are not directives)."""
    try:
        text = FILES[name]
    except KeyError:
        raise ValueError(f"no Lua file {name}.lua") from None
    lines = text.splitlines(keepends=True)
    n = 0
    while n < len(lines) and lines[n].startswith("--") and not lines[n].startswith("-- #"):
        n += 1
    return "".join(lines[n:])


def _fill(text: str, values: dict[str, str], where: str) -> str:
    unused = set(values) - set(_PLACEHOLDER.findall(text))
    if unused:
        raise ValueError(f"{where}: no placeholder for {sorted(unused)}")
    return _PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), text)


def _expand(name: str) -> str:
    """The file's body with its includes expanded (placeholders not given by them left)."""

    def include(m: re.Match[str]) -> str:
        indent, snippet, args = m[1], m[2], m[3]
        values = dict(arg.split("=", 1) for arg in args.split())
        text = _fill(_expand("_" + snippet).strip("\n"), values, f"#include {snippet}")
        return "\n".join(indent + line if line else line for line in text.split("\n"))

    return _INCLUDE.sub(include, _body(name))


def source(name: str, **values: Any) -> str:
    """The source of script ``name`` (``<name>.lua``) as sent: includes expanded, ``{{NAME}}``
    filled with ``str(values[NAME])``."""
    text = _fill(_expand(name), {k: str(v) for k, v in values.items()}, f"{name}.lua")
    left = _PLACEHOLDER.findall(text)
    if left:
        raise ValueError(f"{name}.lua: no value for {sorted(set(left))}")
    return text


class Script:
    """A Lua source with its SHA1, computed locally so no SCRIPT LOAD round trip is needed.

    ``sharded``: the same script for a server whose lock channels are shard channels
    (``clients.sharded``): SPUBLISH and PUBSUB SHARDNUMSUB on them. A wake line's channel is
    named by owner, in no slot: it stays a classic PUBLISH (which a cluster broadcasts).
    """

    __slots__ = ("source", "sha", "_sharded")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self._sharded: Script | None = None

    def __repr__(self) -> str:
        return f"Script({self.sha[:8]})"

    @property
    def sharded(self) -> Script:
        if self._sharded is None:
            wake = "redis.call('publish', '" + WAKE_CHANNEL_PREFIX
            src = (self.source.replace("redis.call('publish', ", "redis.call('spublish', ")
                   .replace("redis.call('spublish', '" + WAKE_CHANNEL_PREFIX, wake)
                   .replace("'pubsub', 'numsub'", "'pubsub', 'shardnumsub'"))
            self._sharded = self if src == self.source else Script(src)
        return self._sharded

    def on(self, client: Any) -> Script:
        """The variant to send on ``client``'s server."""
        return self.sharded if sharded(client) else self


def load(name: str, **values: Any) -> Script:
    """``Script(source(name, **values))``."""
    return Script(source(name, **values))


__all__ = ["FILES", "Script", "load", "source"]
