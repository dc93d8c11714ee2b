"""The benchmark report: `make bench` rewrites only the README's generated blocks, from one run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def compare(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("_compare_under_test", BENCH / "_compare.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("_compare_under_test", None)


def test_update_readme_rewrites_only_measured_blocks(compare, tmp_path):
    compare.compare("t1", "fast row", lambda: (0.5, "same"), lambda: (1.5, "same"))
    compare.compare("t1", "differs", lambda: (0.5, "a"), lambda: (1.0, "b"))
    compare.print_table("t1", "Title", "the tool", "origin tool itself", "10 docs")
    readme = tmp_path / "README.md"
    readme.write_text(
        "intro\n<!-- bench:run -->\nold run\n<!-- /bench:run -->\n"
        "<!-- bench:t1 -->\nold t1\n<!-- /bench:t1 -->\n"
        "<!-- bench:t2 -->\nkept\n<!-- /bench:t2 -->\nend\n"
    )
    assert compare.update_readme(readme) == ["run", "t1"]
    text = readme.read_text()
    assert "old run" not in text and "old t1" not in text
    assert "<!-- bench:t2 -->\nkept\n<!-- /bench:t2 -->" in text  # not measured: untouched
    assert text.startswith("intro\n") and text.endswith("end\n")
    assert "| fast row | 0.500 | 1.500 | **3.00x** |" in text
    # a row whose outputs never agreed shows no ratio, and says why
    assert "| differs | 0.000 | - | - | OUTPUTS DIFFER in all" in text
    assert "(**origin tool itself**)" in text and "Tables of this run: t1." in text
