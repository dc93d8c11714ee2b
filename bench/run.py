"""Run the benchmarks under bench/ and print their tables; `--quick` for a few-minute pass.

`python bench/run.py [--quick] [--update-readme] [NAME ...]` (NAMEs run in the order
given). The full run executes every bench_*.py with a
main(): the side-by-side tables against the origin tools (bench_origin*.py, through
bench/_compare.py and the side venvs of bench/envs.py) and the per-format tables. `--quick`
runs only the side-by-side tables, on small inputs with fewer interleaved pairs. Either way the
measured rows are saved to bench/results/ (JSON and markdown) and compared with the previous run
of the same mode; a row that got slower is printed as a REGRESSION line (the run still succeeds).
`--update-readme` (what `make bench` passes) rewrites the README's generated blocks
(`<!-- bench:TABLE -->` ... `<!-- /bench:TABLE -->`) with this run's tables, so those tables
always come from one run; a quick run never touches the README.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path


def main() -> None:
    here = Path(__file__).parent
    args = sys.argv[1:]
    quick = "--quick" in args
    readme = "--update-readme" in args and not quick
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
        if quick and not f.stem.startswith("bench_origin"):
            continue
        spec = importlib.util.spec_from_file_location(f.stem, f)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        print(f"\n=== {f.stem} ===", flush=True)
        t0 = time.perf_counter()
        try:
            mod.main()
        except Exception as exc:  # one failing benchmark must not hide the others' tables
            print(f"{f.stem} FAILED: {exc!r}", flush=True)
        print(f"({f.stem}: {time.perf_counter() - t0:.0f} s)", flush=True)
        if readme:  # after each module, so an interrupted run keeps what it measured
            _compare.update_readme()
    _compare.save_and_flag()
    if readme:
        done = _compare.update_readme()
        print(f"README blocks regenerated from this run: {', '.join(done) or 'none'}")


if __name__ == "__main__":
    main()
