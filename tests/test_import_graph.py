"""lmdata has no import cycles: at import time between modules, and between packages even
through the imports functions make on first use (a lazy import only hides a cycle). And
importing stays lazy: opening a dataset imports its own format's modules, no other format's."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

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
# compiled extensions (built from these C sources) import no lmdata module: never on a cycle
EXTENSIONS = {
    ".".join(["lmdata", *p.relative_to(ROOT).with_suffix("").parts]) for p in ROOT.rglob("*.c")
}


def _target(name: str) -> str | None:
    """The lmdata module an imported name lives in (``a.b.f`` -> ``a.b`` if ``f`` is no module);
    None for a compiled extension."""
    if name in EXTENSIONS:
        return None
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
            if not import_time_only and isinstance(child, ast.Call):
                names = _lazy_targets(child)  # lazy("pkg.mod:name"), lazy_exports(..., {...})
                found.update(t for t in map(_target, names) if t is not None and t != module)
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


def _lazy_targets(call: ast.Call) -> list[str]:
    """The modules a spec's ``lazy(...)`` or a package's ``lazy_exports(...)`` import later."""
    f = call.func
    fn = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    args = [a for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if fn == "lazy" and args:
        return [args[0].value.partition(":")[0]]
    if fn == "lazy_exports":
        return [
            v.value
            for d in call.args
            if isinstance(d, ast.Dict)
            for v in d.values
            if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
    return []


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


def test_no_cycle_between_storage_modules_counting_lazy_imports() -> None:
    """``storage`` is the layer under every format: its modules form no cycle either (URL
    parsing is a leaf, ``schemes``; the checks that need a store live with ``resolve``)."""
    g = graph(import_time_only=False)
    inside = {
        m: {t for t in ts if t.startswith("lmdata.storage.")}
        for m, ts in g.items()
        if m.startswith("lmdata.storage.")
    }
    assert find_cycle(inside) is None


def test_native_extensions_are_imported_only_by_their_loader() -> None:
    """A C extension of lmdata/_native/ is reached through ``lmdata._native.load`` only, the
    one place that honours LMDATA_PURE_PYTHON and refuses a stale build."""
    assert {"lmdata._native.kernel", "lmdata._native.memowalk"} <= EXTENSIONS
    found = []
    for module, path in MODULES.items():
        if module.startswith("lmdata._native"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value]  # importlib.import_module("lmdata._native.kernel")
            else:
                continue
            found += [(module, n) for n in names if n in EXTENSIONS]
    assert found == []


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
    # lmdata's lazy public names count as its imports
    assert {"lmdata._api", "lmdata.loader", "lmdata.tokenize.api"} <= g["lmdata"]
    # a spec's lazy verbs count as imports of the package that names them
    assert "lmdata.formats.flat_tokens.validate" in g["lmdata.formats.flat_tokens"]
    assert (
        "lmdata.formats.flat_tokens.validate"
        not in graph(import_time_only=True)["lmdata.formats.flat_tokens"]
    )


def _modules_after(code: str) -> dict:
    """What a fresh interpreter has imported after running ``code`` (which sets ``out``)."""
    script = (
        f"import json, sys\n{code}\nout['modules'] = sorted(sys.modules)\nprint(json.dumps(out))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_opening_a_dataset_imports_only_its_own_format(tmp_path: Path) -> None:
    import lmdata

    path = tmp_path / "d.zarr"
    with lmdata.writer(path, "flat-tokens") as w:
        w.write(np.arange(1, 9))
    got = _modules_after(
        "import lmdata\n"
        "out = {'numpy_at_import': 'numpy' in sys.modules}\n"
        f"r = lmdata.open({str(path)!r})\n"
        "out['first'] = r[0].tolist()\n"
        f"out['format'] = lmdata.detect({str(path)!r})"
    )
    assert got["numpy_at_import"] is False
    assert got["first"] == list(range(1, 9)) and got["format"] == "flat-tokens"
    formats = {m for m in got["modules"] if m.startswith("lmdata.formats.")}
    assert {m.split(".")[2] for m in formats} <= {"_spec", "flat_tokens"}, sorted(formats)
    # the reader, not the writer or the validator
    assert "lmdata.formats.flat_tokens.reader" in formats
    assert not formats & {
        "lmdata.formats.flat_tokens.writer",
        "lmdata.formats.flat_tokens.validate",
    }


def test_format_packages_import_no_verb_module() -> None:
    """Loading every spec (as detecting a plain JSONL file does) imports detectors only."""
    got = _modules_after(
        "from lmdata import formats\nout = {'names': [s.name for s in formats.specs()]}"
    )
    assert "jsonl" in got["names"] and "flat-tokens" in got["names"]
    heavy = {"reader", "writer", "validate", "tokens", "plain"}
    loaded = [
        m for m in got["modules"] if m.startswith("lmdata.formats.") and m.split(".")[-1] in heavy
    ]
    assert loaded == [], loaded


def test_every_lazy_target_resolves() -> None:
    """A misspelt ``lazy("pkg.mod:name")`` or ``lazy_exports`` entry fails here, not when a
    rarely used verb first runs."""
    import importlib

    seen = 0
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func  # lazy(...), lazy_exports(...) or _lazy.lazy_exports(...)
            fn = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if fn == "lazy" and node.args and isinstance(node.args[0], ast.Constant):
                modname, _, attr = str(node.args[0].value).partition(":")
                obj = importlib.import_module(modname)
                for part in attr.split("."):
                    obj = getattr(obj, part)
                assert callable(obj), node.args[0].value
                seen += 1
            elif fn == "lazy_exports":
                for d in node.args:
                    if isinstance(d, ast.Dict):
                        for k, v in zip(d.keys, d.values, strict=True):
                            assert isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                            assert hasattr(importlib.import_module(v.value), k.value), k.value
                            seen += 1
    assert seen > 20  # the specs' verbs are found


def test_public_names_are_lazy_listed_and_stay_callable() -> None:
    """``lmdata.<verb>`` and a format's verbs stay functions when the submodule of the same name
    is imported first (``lmdata.tokenize``, ``atlas.validate``); ``dir`` lists the lazy names;
    ``import lmdata`` loads no module behind them and no optional dependency."""
    got = _modules_after(
        "import lmdata\n"
        "out = {'at_import': sorted(sys.modules), 'dir': dir(lmdata)}\n"
        "import lmdata.tokenize.pipeline, lmdata.formats.atlas.validate\n"
        "import lmdata.formats.modalities.merge, lmdata.formats.modalities.validate\n"
        "from lmdata.formats import atlas, modalities\n"
        "out['callable'] = [callable(f) for f in (lmdata.tokenize, lmdata.validate,\n"
        "    atlas.validate, modalities.validate, modalities.merge)]\n"
        "out['names'] = [lmdata.tokenize.__module__, atlas.validate.__module__]\n"
        "out['atlas_dir'] = dir(atlas)\n"
        "out['writer'] = atlas.Writer.__module__\n"
        "import lmdata.tokenize as pkg\n"
        "out['pkg'] = type(pkg).__name__"
    )
    assert set(lmdata.__all__) <= set(got["dir"])
    assert {"Atlas", "Writer", "validate", "SPEC"} <= set(got["atlas_dir"])
    assert got["callable"] == [True] * 5
    assert got["names"] == ["lmdata.tokenize.api", "lmdata.formats.atlas.validate"]
    assert got["writer"] == "lmdata.formats.atlas.writer"
    assert got["pkg"] == "function"  # ``import a.b as m`` reads the attribute: the public name
    heavy = {"numpy", "torch", "jax", "ray", "matplotlib", "zstandard", "transformers"}
    loaded = {m.partition(".")[0] for m in got["at_import"]}
    assert not heavy & loaded, heavy & loaded
    assert not {"lmdata._api", "lmdata.loader", "lmdata.tokenize"} & set(got["at_import"])


def test_lazy_package_keeps_only_public_names_from_submodules() -> None:
    """A submodule import rebinds names the package does not export (the usual behaviour)."""
    import types

    from lmdata._lazy import lazy_exports

    name = "lmdata_lazy_probe"
    pkg = types.ModuleType(name)
    sys.modules[name] = pkg
    try:
        pkg.__getattr__ = lazy_exports(name, {"sep": "os"})  # type: ignore[method-assign]
        pkg.verb = len
        sub, other = types.ModuleType(f"{name}.verb"), types.ModuleType(f"{name}.plain")
        pkg.verb = sub  # the import system binding a same-named submodule
        pkg.plain = other
        pkg.sep = types.ModuleType(f"{name}.sep")
        assert pkg.verb is len and pkg.plain is other
        assert pkg.sep == os.sep  # the export, loaded on first read
        assert "sep" in dir(pkg) and "plain" in dir(pkg)
    finally:
        del sys.modules[name]
