"""The benchmark report: `make bench` rewrites only the generated blocks of the docs pages, from
one run, and the README's summary of them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
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
    # each timed call starts with gc.collect(): a full pass over the test process's heap (late
    # in the suite millions of objects, seconds per pass); the harness logic needs none
    monkeypatch.setattr(mod, "gc", types.SimpleNamespace(collect=lambda *args: 0))
    yield mod
    sys.modules.pop("_compare_under_test", None)


def test_update_docs_rewrites_only_measured_blocks(compare, tmp_path):
    compare.compare("t1", "fast row", lambda: (0.5, "same"), lambda: (1.5, "same"))
    compare.compare("t1", "differs", lambda: (0.5, "a"), lambda: (1.0, "b"))
    compare.print_table("t1", "Title", "the tool", "origin tool itself", "10 docs")
    page = tmp_path / "bench.md"
    page.write_text(
        "intro\n<!-- bench:run -->\nold run\n<!-- /bench:run -->\n"
        "<!-- bench:t1 -->\nold t1\n<!-- /bench:t1 -->\n"
        "<!-- bench:t2 -->\nkept\n<!-- /bench:t2 -->\n"
        "prose quoting `<!-- bench:t1 -->` stays\nend\n"
    )
    assert compare.update_docs([page], readme=None) == ["run", "t1"]
    text = page.read_text()
    assert "old run" not in text and "old t1" not in text
    assert "<!-- bench:t2 -->\nkept\n<!-- /bench:t2 -->" in text  # not measured: untouched
    assert text.startswith("intro\n") and text.endswith(
        "prose quoting `<!-- bench:t1 -->` stays\nend\n"
    )
    assert "| fast row | 0.500 | 1.500 | **3.00x** |" in text
    # a row whose outputs never agreed shows no ratio, and says why
    assert "| differs | 0.000 | - | - | OUTPUTS DIFFER in all" in text
    assert "(**origin tool itself**)" in text and " Tables: t1." in text


def test_module_tables_fill_the_block_named_after_the_module(compare, tmp_path):
    # a module's own markdown wins over its printed output; a module with only printed
    # fixed-width tables gets a fenced copy of them; blocks of modules not run are kept
    compare.report("bench_a", "| a | b |\n|---|---|\n| 1 | 2 |\n")
    compare.module_output("bench_a", "python bench/bench_a.py", "printed, not wanted")
    compare.module_output("bench_b", "python bench/bench_b.py", "rate      12 docs/s\n")
    compare.module_output("bench_c", "python bench/bench_c.py", "  \n")  # nothing printed
    page = tmp_path / "bench.md"
    page.write_text(
        "<!-- bench:bench_a -->\nhand a\n<!-- /bench:bench_a -->\n"
        "<!-- bench:bench_b -->\nhand b\n<!-- /bench:bench_b -->\n"
        "<!-- bench:bench_c -->\nhand c\n<!-- /bench:bench_c -->\n"
    )
    assert compare.update_docs([page], readme=None) == ["bench_a", "bench_b"]
    text = page.read_text()
    assert (
        "<!-- bench:bench_a -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- /bench:bench_a -->" in text
    )
    assert "printed, not wanted" not in text and "hand a" not in text and "hand b" not in text
    assert "`python bench/bench_b.py`" in text and "```text\nrate      12 docs/s\n```" in text
    assert "hand c" in text


def test_run_module_tees_output_and_survives_a_failure(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("_run_under_test", BENCH / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    good = tmp_path / "bench_good.py"
    good.write_text("def main():\n    print('| x | 1 |')\n")
    bad = tmp_path / "bench_bad.py"
    bad.write_text("def main():\n    print('half')\n    raise ValueError('boom')\n")
    assert run.run_module(good) == (True, "| x | 1 |\n")
    ok, printed = run.run_module(bad)
    assert not ok and printed.startswith("half\n") and "bench_bad FAILED" in printed
    assert "| x | 1 |" in capsys.readouterr().out  # still printed as it runs


def test_run_block_names_the_run_of_every_table(compare, tmp_path):
    # a later run of some modules keeps the earlier run's line for the tables it did not redo
    page = tmp_path / "bench.md"
    page.write_text(
        "<!-- bench:run -->\n`make bench` run of 2026-01-01 10:00 UTC, commit abc. "
        "Tables of this run: t1, t2; t3's table by hand.\n<!-- /bench:run -->\n"
        "<!-- bench:t1 -->\nold t1\n<!-- /bench:t1 -->\n"
    )
    compare.COMMAND = "python bench/run.py --update-docs t1"
    compare.compare("t1", "row", lambda: (0.5, "same"), lambda: (1.0, "same"))
    compare.print_table("t1", "Title", "the tool", "origin tool itself", "10 docs")
    assert compare.update_docs([page], readme=None) == ["run", "t1"]
    # after each module: no pile-up
    assert compare.update_docs([page], readme=None) == ["run", "t1"]
    run = page.read_text().split("<!-- bench:run -->\n")[1].split("\n<!-- /bench:run")[0]
    new, old = run.splitlines()
    assert new.startswith("- `python bench/run.py --update-docs t1` run of ")
    assert "commit " in new and "load average at the end" in new and new.endswith(" Tables: t1.")
    assert old == (
        "- `make bench` run of 2026-01-01 10:00 UTC, commit abc. Tables: t2; t3's table by hand."
    )
    # a run that redoes t2 too leaves only its own line
    compare.compare("t2", "row", lambda: (0.5, "same"), lambda: (1.0, "same"))
    compare.print_table("t2", "Title", "the tool", "origin tool itself", "10 docs")
    compare.skip("bench_x", "no history")
    compare.update_docs([page], readme=None)
    run = page.read_text().split("<!-- bench:run -->\n")[1].split("\n<!-- /bench:run")[0]
    assert len(run.splitlines()) == 1 and run.endswith(
        "Skipped bench_x: no history. Tables: t1, t2."
    )


def _git(*args: str, cwd=None) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=m"]
    done = subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_bench_contract_skips_without_history(compare, monkeypatch, tmp_path, capsys):
    # the "before" tree comes from the history: a shallow clone says so and measures nothing
    repo = tmp_path / "repo"
    (repo / "lmdata" / "formats").mkdir(parents=True)
    (repo / "lmdata" / "__init__.py").write_text("OLD = 1\n")
    _git("init", "-q", str(repo))
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "before", cwd=repo)
    (repo / "lmdata" / "formats" / "_spec.py").write_text("")
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "contract", cwd=repo)
    _git("clone", "-q", "--depth", "1", f"file://{repo}", str(tmp_path / "shallow"))

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "_compare", compare)
    spec = importlib.util.spec_from_file_location(
        "_contract_under_test", BENCH / "bench_contract.py"
    )
    contract = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(contract)

    compare.ROOT = repo  # full history: the parent of the commit adding _spec.py
    (tmp_path / "w1").mkdir()
    tree, sha = contract.before_tree(tmp_path / "w1")
    assert (tree / "lmdata" / "__init__.py").read_text() == "OLD = 1\n" and sha
    assert not (tree / "lmdata" / "formats" / "_spec.py").exists()

    compare.ROOT = tmp_path / "shallow"
    (tmp_path / "w2").mkdir()
    why = contract.before_tree(tmp_path / "w2")
    assert "shallow clone" in why and "git fetch --unshallow" in why
    compare.ROOT = tmp_path / "not-a-repo"
    compare.ROOT.mkdir()
    assert "not a git repository" in contract.before_tree(tmp_path / "w2")

    compare.ROOT = tmp_path / "shallow"
    contract.main()  # no crash, no rows, the reason printed and kept for the run header
    assert compare._ROWS == [] and "shallow clone" in compare.SKIPPED["bench_contract"]
    assert "bench_contract SKIPPED: " in capsys.readouterr().out
    assert "Skipped bench_contract: " in compare.run_header()


def test_an_empty_block_is_filled_and_stays_one_block(compare, tmp_path):
    # an empty block (a module never run yet) is filled like any other block
    compare.module_output("bench_dolma", "python bench/bench_dolma.py", "tag  1  19,390\n")
    page = tmp_path / "bench.md"
    page.write_text("a\n<!-- bench:bench_dolma -->\n<!-- /bench:bench_dolma -->\nb\n")
    assert compare.update_docs([page], readme=None) == ["bench_dolma"]
    text = page.read_text()
    assert text.startswith("a\n<!-- bench:bench_dolma -->\nOutput of `python bench/bench_dolma.py`")
    assert text.endswith("tag  1  19,390\n```\n<!-- /bench:bench_dolma -->\nb\n")
    # a second run replaces, not adds
    assert compare.update_docs([page], readme=None) == ["bench_dolma"]
    assert page.read_text() == text


def test_blocks_on_several_pages_and_the_readme_summary(compare, tmp_path):
    # the run block on one page names the tables of every page; the README's summary has one
    # line per side-by-side table the pages hold (measured now or kept), nothing else
    compare.compare("t1", "fast", lambda: (0.5, "same"), lambda: (1.5, "same"))
    compare.compare("t1", "slow", lambda: (1.0, "same"), lambda: (0.8, "same"))
    compare.print_table("t1", "Reads (r*2)", "tool 1.0 (its reader)", "origin tool itself", "-")
    compare.module_output("bench_m", "python bench/bench_m.py", "rate  5 /s\n")
    index, other = tmp_path / "index.md", tmp_path / "other.md"
    index.write_text(
        "<!-- bench:run -->\nold\n<!-- /bench:run -->\n"
        "<!-- bench:t1 -->\nold t1\n<!-- /bench:t1 -->\n"
    )
    kept = (
        "*Writes.* Other column: tool 2 (**practical limit**). Sizes: 3.\n\n"
        "| row | lmdata s | other s | ratio | note |\n|---|---:|---:|---:|---|\n"
        "| w | 1.000 | 2.000 | **2.00x** |  |"
    )
    other.write_text(
        f"x\n<!-- bench:bench_m -->\nold m\n<!-- /bench:bench_m -->\n"
        f"<!-- bench:t2 -->\n{kept}\n<!-- /bench:t2 -->\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- bench:summary -->\nstale\n<!-- /bench:summary -->\nend\n")
    done = compare.update_docs([index, other], readme=readme)
    assert done == ["run", "t1", "bench_m", "summary"]
    assert "Tables: t1, bench_m." in index.read_text() and "old" not in index.read_text()
    assert "rate  5 /s" in other.read_text() and kept in other.read_text()
    text = readme.read_text()
    assert text.startswith("top\n<!-- bench:summary -->\n| table |") and "stale" not in text
    lines = text.split("<!-- bench:summary -->\n")[1].split("\n<!-- /bench")[0].splitlines()
    assert lines[2:] == [
        "| `t1` | Reads (r\\*2) | tool 1.0 (origin tool itself) | 0.80x to 3.00x (2 rows) |",
        "| `t2` | Writes | tool 2 (practical limit) | 2.00x |",
    ]
    # without a summary block the README is left alone; without pages nothing is written
    readme.write_text("no block\n")
    assert compare.update_docs([], readme=readme) == []
    assert readme.read_text() == "no block\n"
