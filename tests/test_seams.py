"""Code goes through the seams, not around them: format, toolkit and tokenize code reaches a
store only through the ``Store``/``Output`` protocols (no type tests on concrete stores, no
``store.fs``, no uploads written by hand), and the Loader finds a reader's fast path through
the ``EncodedTokens`` protocol (no method probed by name)."""

from __future__ import annotations

import ast
from pathlib import Path

import lmdata

ROOT = Path(lmdata.__file__).parent
CONCRETE = {"LocalStore", "LocalOutput", "FsspecStore", "FsspecOutput", "SpooledOutput"}
PROBES = {"hasattr", "getattr", "_has", "signature"}


def _sources(under: str = "", skip: str | None = None) -> dict[str, ast.AST]:
    base = ROOT / under if under else ROOT
    out = {}
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if skip is not None and rel.startswith(skip):
            continue
        out[rel] = ast.parse(path.read_text())
    return out


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def type_tests_on_stores(trees: dict[str, ast.AST]) -> list[str]:
    """``isinstance(x, LocalStore)`` and the like (tuples too), as ``file:line``."""
    found = []
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "isinstance" and node.args[1:]:
                kinds = node.args[1]
                names = (
                    [_name(e) for e in kinds.elts]
                    if isinstance(kinds, ast.Tuple)
                    else [_name(kinds)]
                )
                if CONCRETE & set(names):
                    found.append(f"{rel}:{node.lineno}")
    return found


def filesystem_reaches(trees: dict[str, ast.AST]) -> list[str]:
    """``something.fs`` or ``getattr(something, "fs", ...)`` (a store's fsspec filesystem),
    as ``file:line``."""
    found = []
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "fs":
                found.append(f"{rel}:{node.lineno}")
            elif (
                isinstance(node, ast.Call)
                and _name(node.func) in ("getattr", "hasattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == "fs"
            ):
                found.append(f"{rel}:{node.lineno}")
    return found


def hand_rolled_uploads(trees: dict[str, ast.AST]) -> list[str]:
    """Modules that copy a local file into an output by hand (``open_write`` and
    ``copyfileobj`` in one module) or build a concrete store output themselves."""
    found = []
    for rel, tree in trees.items():
        calls = {_name(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        if {"open_write", "copyfileobj"} <= calls:
            found.append(rel)
        elif calls & (CONCRETE - {"LocalStore"}):
            found.append(rel)
    return found


def probes_by_name(trees: dict[str, ast.AST]) -> list[str]:
    """``hasattr(reader, "name")``, ``getattr(reader, "name", ...)``, ``_has(...)`` and
    ``inspect.signature`` calls, as ``file:line``: the reader methods the Loader looks for."""
    found = []
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _name(node.func) not in PROBES:
                continue
            if _name(node.func) == "signature":
                found.append(f"{rel}:{node.lineno}")
                continue
            if len(node.args) < 2 or not isinstance(node.args[1], ast.Constant):
                continue
            target = node.args[0]
            if _name(target) in ("reader", "obj", "fn") or (
                isinstance(target, ast.Attribute) and target.attr == "reader"
            ):
                found.append(f"{rel}:{node.lineno}")
    return found


def test_format_and_toolkit_code_reaches_stores_through_the_protocol() -> None:
    outside = _sources(skip="storage/")
    assert type_tests_on_stores(outside) == []
    assert filesystem_reaches(outside) == []
    assert hand_rolled_uploads(outside) == []


def test_the_loader_finds_fast_paths_through_protocols() -> None:
    assert probes_by_name(_sources("loader")) == []


def test_the_checks_see_what_they_forbid() -> None:
    src = (
        "def f(store, reader, out):\n"
        "    if isinstance(store, LocalStore): pass\n"
        "    if isinstance(store, (int, FsspecStore)): pass\n"
        "    store.fs.copy('a', 'b')\n"
        "    hasattr(reader, 'packed_rows')\n"
        "    getattr(self.reader, 'span', None)\n"
        "    _has(reader, 'encoded_windows')\n"
        "    inspect.signature(fn)\n"
        "    shutil.copyfileobj(src, out.open_write(''))\n"
        "    fs = getattr(store, 'fs', None)\n"
    )
    trees = {"m.py": ast.parse(src)}
    assert type_tests_on_stores(trees) == ["m.py:2", "m.py:3"]
    assert sorted(filesystem_reaches(trees)) == ["m.py:10", "m.py:4"]
    assert sorted(probes_by_name(trees)) == ["m.py:5", "m.py:6", "m.py:7", "m.py:8"]
    assert hand_rolled_uploads(trees) == ["m.py"]
    built = {"w.py": ast.parse("o = FsspecOutput(store, key, stage=True)\n")}
    assert hand_rolled_uploads(built) == ["w.py"]
