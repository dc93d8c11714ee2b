"""Run every benchmark under bench/ (files bench_*.py with a main()) and print their tables.

Each benchmark prints a table with the practical limit (a bare numpy memmap) and the origin
tool or zarr-python side by side, as ratios measured in the same run.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path


def main() -> None:
    here = Path(__file__).parent
    only = sys.argv[1:]
    for f in sorted(here.glob("bench_*.py")):
        if only and not any(o in f.stem for o in only):
            continue
        spec = importlib.util.spec_from_file_location(f.stem, f)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        print(f"\n=== {f.stem} ===", flush=True)
        t0 = time.perf_counter()
        mod.main()
        print(f"({f.stem}: {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
