"""Which files each C extension of ``lmdata/_native/`` is built from, and their digest: the one
rule that ``setup.py`` (what to compile, which digest to build in) and :mod:`lmdata._native`
(is a build current?) share. Standard library only: ``setup.py`` loads this file by its path,
before lmdata is installed."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

HERE = Path(__file__).parent
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]+"([^"\n]+)"', re.MULTILINE)


def extensions(root: Path = HERE) -> list[str]:
    """The extensions whose sources are in ``root``: one per ``NAME.c``, the module
    ``lmdata._native.NAME``."""
    return sorted(p.stem for p in root.glob("*.c"))


def sources(name: str, root: Path = HERE) -> list[Path]:
    """``NAME.c`` and every header of ``root`` it includes with quotes, directly or through
    another header: all a change to which makes a build stale."""
    found: list[Path] = []
    todo = [root / f"{name}.c"]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.append(path)
        for inc in _INCLUDE.findall(path.read_bytes()):
            header = root / inc.decode("utf-8", "replace")
            if header.is_file():
                todo.append(header)
    return found


def digest(files: list[Path]) -> str:
    """A short digest of the files' names and bytes (16 hex digits), the same on every
    platform for the same files."""
    h = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.name):
        data = path.read_bytes()
        h.update(path.name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]
