"""Run the benchmarks under bench/ and print their tables; `--quick` for a few-minute pass.

`python bench/run.py [--quick] [NAME ...]`. The full run executes every bench_*.py with a
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

    for f in sorted(here.glob("bench_*.py")):
        if only and not any(o in f.stem for o in only):
            continue
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
    _compare.save_and_flag()
    if readme:
        done = _compare.update_readme()
        print(f"README blocks regenerated from this run: {', '.join(done) or 'none'}")


if __name__ == "__main__":
    main()
