"""The C extensions of lmdata/_native/: one loader (``load``) that every importer goes through,
which gives None under ``LMDATA_PURE_PYTHON=1``, where none was built, and where the build is
older than its sources (with a warning saying how to rebuild); and the ``native`` mark, which
``make test`` runs a second time without the extensions, kept on every test file that reaches
for a native handle."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmdata import _native
from lmdata._native import _sources

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lmdata"


# ---- which modules load a native extension, and the names they keep it under ----------------


def _module_name(path: Path) -> str:
    parts = ["lmdata", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _calls_load(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "load"
        for n in ast.walk(node)
    )


def native_handles() -> dict[str, set[str]]:
    """Per module that calls ``load(...)`` outside lmdata/_native/, the module-level names bound
    to the extension or to what is taken from it (``_C``, ``_c_item_pickle``, ...), and its
    ``in_c`` where it has one."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_native" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text())
        names: set[str] = set()
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            used = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            if _calls_load(node.value) or used & names:
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if names:
            names |= {
                n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "in_c"
            }
            out[_module_name(path)] = names
    return out


def _marked_files() -> dict[Path, str]:
    """Every test file, with its text."""
    return {p: p.read_text() for p in sorted((ROOT / "tests").rglob("test_*.py"))}


def _mentions(text: str, names: set[str]) -> set[str]:
    """The names ``text`` refers to (``packing._C``, ``"_C"``, ``_C``; not ``MAX_C``)."""
    return {n for n in names if re.search(rf"(?<!\w){re.escape(n)}\b", text)}


def test_the_handles_are_found() -> None:
    h = native_handles()
    assert "_C" in h["lmdata.loader.packing"]
    assert "_FUSED" not in h["lmdata.loader.packing"]  # no probe of an older build's functions
    assert {"_memowalk", "_c_item_pickle", "_c_early_slot"} <= h["lmdata._pickle"]
    assert {"_copy_rows", "_unit_windows", "in_c"} <= h["lmdata.formats.flat_tokens._windows"]
    assert {"_mdsread"} <= h["lmdata.formats.mds.fastpath"]
    assert {"_C", "in_c"} <= h["lmdata.dolma._shingle"]
    assert {"_feistel_c"} <= h["lmdata.loader.shuffle"]
    assert {"_best_fit_c"} <= h["lmdata.loader.binpack"]
    assert _mentions("monkeypatch.setattr(binpack, '_best_fit_c', None)", {"_best_fit_c"})
    assert _mentions("C = packing._C\n", {"_C"}) and not _mentions("MAX_C = 1", {"_C"})


# an import of lmdata._native or of something in it
_IMPORTS_NATIVE = re.compile(
    r"^\s*(from lmdata import _native|(from|import) lmdata\._native)\b", re.MULTILINE
)


def test_every_test_file_touching_a_native_handle_is_marked_native() -> None:
    """A test that switches a path off or checks the C side must run again without the
    extensions (``make test``'s second pass selects ``-m native``)."""
    handles = set().union(*native_handles().values())
    unmarked = [
        str(p.relative_to(ROOT))
        for p, text in _marked_files().items()
        if (_mentions(text, handles) or _IMPORTS_NATIVE.search(text))
        and "pytest.mark.native" not in text
    ]
    assert unmarked == [], f"mark these `pytestmark = pytest.mark.native`: {unmarked}"


def test_every_native_path_has_a_marked_test_file() -> None:
    marked = {p: t for p, t in _marked_files().items() if "pytest.mark.native" in t}
    for module, names in native_handles().items():
        short = module.rpartition(".")[2]
        users = [p for p, t in marked.items() if short in t and _mentions(t, names)]
        assert users, f"no test file marked native reaches {module}'s {sorted(names)}"


def test_make_test_runs_the_marked_tests_again_without_the_extensions() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    second = [line for line in recipe.splitlines() if "LMDATA_PURE_PYTHON=1" in line]
    assert second and "-m native" in second[0], recipe


# ---- load --------------------------------------------------------------------------------


def test_every_c_source_is_an_extension_load_knows() -> None:
    assert sorted(_native.EXTENSIONS) == _sources.extensions()
    assert set(_native.FALLBACKS) == set(_native.EXTENSIONS)
    with pytest.raises(ValueError, match="no C extension 'kernal'"):
        _native.load("kernal")


def test_sources_follow_quoted_includes(tmp_path: Path) -> None:
    (tmp_path / "a.c").write_text('#include <Python.h>\n  #  include "a_x.h"\n#include "gone.h"\n')
    (tmp_path / "a_x.h").write_text('#include "shared.h"\n#include "a_x.h"\n')
    (tmp_path / "shared.h").write_text("/* shared */\n")
    (tmp_path / "b.c").write_text('#include "shared.h"\n')
    files = _sources.sources("a", tmp_path)
    assert [p.name for p in files] == ["a.c", "a_x.h", "shared.h"]
    assert _sources.extensions(tmp_path) == ["a", "b"]
    before = _sources.digest(files)
    (tmp_path / "b.c").write_text("/* another extension's change */\n")
    assert _sources.digest(_sources.sources("a", tmp_path)) == before
    (tmp_path / "shared.h").write_text("/* shared, changed */\n")
    assert _sources.digest(_sources.sources("a", tmp_path)) != before


def test_the_built_extensions_are_current() -> None:
    """setup.py builds in the digest of exactly the sources the loader compares; an
    extension is built and current, or not built at all (no compiler), never stale here."""
    for name in _native.EXTENSIONS:
        state, module, why = _native._probe(name)
        assert state in (_native.BUILT, _native.NOT_BUILT), (name, why)
        if module is not None:
            assert module.SOURCE_DIGEST == _sources.digest(_sources.sources(name))


@pytest.fixture
def fresh(monkeypatch):
    """load() as in a new process (nothing probed or warned yet), the real state afterwards."""
    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    monkeypatch.setattr(_native, "_warned", set())
    _native._probe.cache_clear()
    yield
    _native._probe.cache_clear()


def _built(name: str):
    try:
        return importlib.import_module(f"lmdata._native.{name}")
    except ImportError:
        pytest.skip(f"lmdata._native.{name} is not built (no C compiler at install)")


def test_a_build_older_than_its_sources_is_reported_and_not_used(
    tmp_path: Path, monkeypatch, fresh
) -> None:
    built = _built("kernel")
    for p in _sources.sources("kernel"):
        shutil.copy(p, tmp_path / p.name)
    monkeypatch.setattr(_sources, "HERE", tmp_path)
    assert _native.load("kernel") is built  # the same sources: current
    _native._probe.cache_clear()
    with (tmp_path / "kernel_rows.h").open("a") as f:  # a header the build depends on
        f.write("/* edited after the build */\n")
    with pytest.warns(RuntimeWarning, match=r"kernel is stale.*kernel_rows\.h.*make install"):
        assert _native.load("kernel") is None
    assert _native.status()["kernel"][0] == _native.STALE
    assert "make install" in _native.report()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process
        assert _native.load("kernel") is None
    _native._probe.cache_clear()
    for p in tmp_path.iterdir():  # an install without sources (a wheel): the build is used
        p.unlink()
    assert _native.load("kernel") is built


def test_a_build_that_does_not_load_is_reported_and_a_missing_one_is_not(
    monkeypatch, fresh
) -> None:
    def broken(name: str):
        raise ImportError(f"{name}: undefined symbol: PyFoo")

    monkeypatch.setattr(_native.importlib, "import_module", broken)
    with pytest.warns(RuntimeWarning, match="does not load.*undefined symbol.*make install"):
        assert _native.load("minhash") is None

    def missing(name: str):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    import warnings

    monkeypatch.setattr(_native.importlib, "import_module", missing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not built is no news: the install said so
        assert _native.load("mdsread") is None
    assert _native.status()["mdsread"] == (_native.NOT_BUILT, _native._probe("mdsread")[2])


@pytest.mark.parametrize("value, pure", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_the_switch_forces_the_pure_python_paths(monkeypatch, fresh, value, pure) -> None:
    monkeypatch.setenv(_native.PURE_ENV, value)
    assert _native.pure_python() is pure
    if pure:
        assert all(_native.load(n) is None for n in _native.EXTENSIONS)
        assert {s for s, _ in _native.status().values()} == {_native.OFF}
    else:
        assert _native.load("memowalk") is _built("memowalk")


def _handles_in_a_fresh_process(env: dict[str, str]) -> tuple[dict, list[str]]:
    """Which native handles of each importer are set, and which extensions were imported,
    in a new interpreter with ``env`` that imports every importer."""
    handles = {m: sorted(n - {"in_c"}) for m, n in native_handles().items()}
    code = (
        "import importlib, json, sys\n"
        f"handles = {handles!r}\n"
        "out = {m: {n: getattr(importlib.import_module(m), n) is not None for n in ns}"
        " for m, ns in handles.items()}\n"
        f"ext = sorted(m for m in sys.modules if m.rpartition('.')[2] in {_native.EXTENSIONS!r})\n"
        "print(json.dumps([out, ext]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    out, ext = json.loads(done.stdout.strip().splitlines()[-1])
    return out, ext


def test_every_importer_honours_the_switch() -> None:
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    pure, imported = _handles_in_a_fresh_process({**env, _native.PURE_ENV: "1"})
    assert all(not v for names in pure.values() for v in names.values()), pure
    assert imported == []  # not even imported
    if all(_native._probe(n)[0] == _native.BUILT for n in _native.EXTENSIONS):
        native, imported = _handles_in_a_fresh_process(env)
        assert all(v for names in native.values() for v in names.values()), native
        assert imported == [f"lmdata._native.{n}" for n in _native.EXTENSIONS]


def test_the_report_names_each_extension_and_the_switch() -> None:
    env = {**os.environ, _native.PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "lmdata._native"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == [
        f"lmdata._native.{n}" for n in _native.EXTENSIONS
    ]
    assert all("LMDATA_PURE_PYTHON is set" in line and "without it" in line for line in lines)
