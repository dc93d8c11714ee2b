"""Run the benchmarks under bench/ and print their tables; `--quick` for a few-minute pass.

`python bench/run.py [--quick] [--update-docs] [NAME ...]` (NAMEs run in the order
given). The full run executes every bench_*.py with a
main(): the side-by-side tables against the origin tools (bench_origin*.py, through
bench/_compare.py and the side venvs of bench/envs.py) and the per-format tables. `--quick`
runs only the side-by-side tables, on small inputs with fewer interleaved pairs (NAMEs given
with `--quick` run even when they are per-format modules: those that know quick mode shrink
their inputs). Either way the measured rows, the values modules `record()` from their own
tables and each module's wall time are saved to bench/results/ (JSON and markdown) and
compared with the latest earlier run of the same mode that measured them; a row or value more
than 10% worse is printed as a REGRESSION line (the run still succeeds).
`--update-docs` (what `make bench` passes; `--update-readme` is its old name) rewrites the
generated blocks of the documentation pages (`docs/**/*.md`: `<!-- bench:TABLE -->` ...
`<!-- /bench:TABLE -->`) with this run's tables, each table from one run, merges this run's
header (command, time, commit, load, tables) into the block `<!-- bench:run -->`, which keeps
one line per run that still owns a table in the docs, and rewrites the README's
`<!-- bench:summary -->` (one line per side-by-side table); a quick run never touches them. A
module's side-by-side tables fill the blocks named after them; the per-format tables a module
prints itself fill the block named after the module (`<!-- bench:bench_loader -->`), as the
markdown it hands to `_compare.report`, or else a copy of what it printed (a module that fails
leaves its block).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
import time
from pathlib import Path
from typing import Any


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy: a module's tables go to the docs too."""

    def __init__(self, out: Any) -> None:
        self.out, self.copy = out, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)  # type: ignore[no-any-return]

    def flush(self) -> None:
        self.out.flush()


def run_module(path: Path) -> tuple[bool, str]:
    """Run one bench module's main(), printing as it goes; (succeeded, what it printed)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    tee = _Tee(sys.stdout)
    ok = True
    with contextlib.redirect_stdout(tee):
        try:
            mod = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = mod  # dataclasses look their module up while it runs
            spec.loader.exec_module(mod)
            mod.main()
        except Exception as exc:  # one failing benchmark must not hide the others' tables
            print(f"{path.stem} FAILED: {exc!r}", flush=True)
            ok = False
    return ok, tee.copy.getvalue()


def main() -> None:
    here = Path(__file__).parent
    args = sys.argv[1:]
    quick = "--quick" in args
    docs = ("--update-docs" in args or "--update-readme" in args) and not quick
    only = [a for a in args if not a.startswith("--")]
    if quick:
        os.environ["LMDATA_BENCH_QUICK"] = "1"
    sys.path.insert(0, str(here))
    sys.path.insert(0, str(here.parent))
    import _compare

    if only:
        _compare.COMMAND = "python bench/run.py " + " ".join(args)

    files = sorted(here.glob("bench_*.py"))
    if only:  # in the order asked; a name matches a module exactly, else as a substring
        stems = {f.stem for f in files}
        picked = [
            [f for f in files if f.stem == o] if o in stems else [f for f in files if o in f.stem]
            for o in only
        ]
        files = list(dict.fromkeys(f for group in picked for f in group))
    for f in files:
        if quick and not only and not f.stem.startswith("bench_origin"):
            continue
        print(f"\n=== {f.stem} ===", flush=True)
        t0 = time.perf_counter()
        tables = len(_compare._TABLES)
        ok, printed = run_module(f)
        measured = f.stem not in _compare.SKIPPED
        if ok and measured and len(_compare._TABLES) == tables:  # its own tables, if no pairs
            _compare.module_output(f.stem, f"python bench/{f.name}", printed)
        _compare.SECONDS[f.stem] = round(time.perf_counter() - t0, 1)
        print(f"({f.stem}: {_compare.SECONDS[f.stem]:.0f} s)", flush=True)
        if docs:  # after each module, so an interrupted run keeps what it measured
            _compare.update_docs()
    took = ", ".join(f"{m} {s:.0f} s" for m, s in _compare.SECONDS.items())
    print(f"\nwall time per module: {took or 'none run'}")
    _compare.save_and_flag()
    if docs:
        done = _compare.update_docs()
        print(f"docs blocks regenerated from this run: {', '.join(done) or 'none'}")


if __name__ == "__main__":
    main()
