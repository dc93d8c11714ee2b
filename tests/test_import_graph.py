"""lmdata has no import cycles: at import time between modules, and between packages even
through the imports functions make on first use (a lazy import only hides a cycle)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import lmdata

ROOT = Path(lmdata.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ["lmdata", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The lmdata module an imported name lives in (``a.b.f`` -> ``a.b`` if ``f`` is no module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(source: str, module: str, *, is_package: bool, import_time_only: bool) -> set[str]:
    """The lmdata modules ``module`` imports: at import time, or anywhere (functions too)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if import_time_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" for a in child.names]
            else:
                visit(child)
                continue
            for name in names:
                t = _target(name) if name.startswith("lmdata") else None
                if t is not None and t != module:
                    found.add(t)

    visit(ast.parse(source))
    return found


@functools.cache
def graph(*, import_time_only: bool) -> dict[str, set[str]]:
    return {
        m: imports(
            p.read_text(), m, is_package=p.name == "__init__.py", import_time_only=import_time_only
        )
        for m, p in MODULES.items()
    }


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``g`` as a path ``[a, b, ..., a]``, or None if ``g`` is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in sorted(g):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(g[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(g.get(nxt, ()))))
    return None


def _unit(module: str) -> str:
    """A module's package (``lmdata.formats.mds.reader`` -> ``lmdata.formats.mds``); modules
    directly in ``lmdata`` or ``lmdata.formats`` stand alone."""
    if MODULES[module].name == "__init__.py":
        return module
    package = module.rpartition(".")[0]
    return module if package in ("lmdata", "lmdata.formats") else package


def test_no_cycle_at_import_time() -> None:
    assert find_cycle(graph(import_time_only=True)) is None


def test_no_cycle_between_packages_counting_lazy_imports() -> None:
    units: dict[str, set[str]] = {}
    for m, targets in graph(import_time_only=False).items():
        units.setdefault(_unit(m), set()).update(_unit(t) for t in targets if _unit(t) != _unit(m))
    assert find_cycle(units) is None


def test_no_cycle_between_format_modules_counting_lazy_imports() -> None:
    g = graph(import_time_only=False)
    formats = {m: {t for t in ts if t.startswith("lmdata.formats")} for m, ts in g.items()}
    assert (
        find_cycle({m: ts for m, ts in formats.items() if m.startswith("lmdata.formats")}) is None
    )


def test_the_checks_see_lazy_imports_and_cycles() -> None:
    src = (
        "import os\nfrom . import layout\n"
        "def f():\n    from lmdata.formats.modalities_jsonl import reader\n"
    )
    lazy = imports(src, "lmdata.formats.modalities.views", is_package=False, import_time_only=False)
    assert lazy == {"lmdata.formats.modalities.layout", "lmdata.formats.modalities_jsonl.reader"}
    eager = imports(src, "lmdata.formats.modalities.views", is_package=False, import_time_only=True)
    assert eager == {"lmdata.formats.modalities.layout"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    # the real graph is seen
    g = graph(import_time_only=False)
    assert "lmdata.formats.modalities_jsonl.reader" in g["lmdata.formats.modalities.views"]
    assert "lmdata.formats._span_index" in g["lmdata.formats.modalities_jsonl.reader"]
