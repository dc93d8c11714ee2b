"""The execution seam: tokenize throughput in this process, on 2 local processes and on Ray.

Workload: random-word JSONL documents (1-3 k chars) in 4 plain files, cut into byte-range
units (``BENCH_PAR_RANGE`` bytes), the byte-level BPE of the Modalities reference files,
flat-tokens output. Every row's output is checked byte-identical to the in-process one's.
Rows: inprocess (1 worker), processes (2 workers), ray with ``num_cpus=1`` and ``num_cpus=2``
(a local instance each), best of ``BENCH_PAR_REPS`` runs; plus the start-up cost of a Ray job
(``ray.init``). Skips the Ray rows when ray is not installed (``pip install 'lmdata[ray]'``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

N_DOCS = int(os.environ.get("BENCH_PAR_DOCS", 1500))  # per file, 4 files
RANGE = int(os.environ.get("BENCH_PAR_RANGE", 1 << 20))
REPS = int(os.environ.get("BENCH_PAR_REPS", 2))
TOKENIZER = Path(__file__).parents[1] / "tests/data/modalities/tokenizers/bpe5k/tokenizer.json"


def _docs(path: Path) -> None:
    rng = np.random.default_rng(7)
    words = [
        "".join(chr(97 + c) for c in rng.integers(0, 26, int(n))) for n in rng.integers(2, 9, 4000)
    ]
    with open(path, "w") as f:
        for i in range(N_DOCS):
            n = int(rng.integers(200, 600))
            text = " ".join(words[j] for j in rng.integers(0, len(words), n))
            f.write(json.dumps({"text": text, "n": i}) + "\n")


def _tree(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


def main() -> None:
    from lmdata.tokenize.pipeline import TokenizeJob, tokenize
    from lmdata.tokenize.sources import list_inputs, plan_units

    tmp = Path(tempfile.mkdtemp(prefix="bench-par-"))
    try:
        src = tmp / "docs"
        src.mkdir()
        for k in range(4):
            _docs(src / f"part-{k}.jsonl")
        mb = sum(f.stat().st_size for f in src.iterdir()) / 1e6
        docs = 4 * N_DOCS
        units = len(plan_units(list_inputs([src]), RANGE))
        print(f"{docs:,} documents, {mb:.0f} MB in 4 files, {units} byte-range units")
        job = TokenizeJob(to="flat-tokens", tokenizer=str(TOKENIZER))
        ref: dict[str, bytes] | None = None

        def run(engine: str, workers: int) -> float:
            nonlocal ref
            best = float("inf")
            for _ in range(REPS):
                dst = tmp / "out"
                t0 = time.perf_counter()
                tokenize([src], dst, job, workers=workers, engine=engine, range_bytes=RANGE)
                best = min(best, time.perf_counter() - t0)
                tree = _tree(dst)
                ref = ref or tree
                assert tree == ref, f"{engine} x{workers}: output differs from in-process"
                shutil.rmtree(dst)
            return best

        rows = [("inprocess", 1, run("inprocess", 1)), ("processes", 2, run("processes", 2))]
        if importlib.util.find_spec("ray"):
            import ray

            for cpus in (1, 2):
                t0 = time.perf_counter()
                ray.init(num_cpus=cpus, include_dashboard=False, logging_level="WARNING")
                print(
                    f"ray start-up (ray.init, local, {cpus} CPUs): {time.perf_counter() - t0:.1f} s"
                )
                try:
                    rows.append(("ray", cpus, run("ray", cpus)))
                finally:
                    ray.shutdown()
        else:
            print("ray not installed: local rows only (pip install 'lmdata[ray]')")
        base = rows[0][2]
        local2 = rows[1][2]
        print(
            f"{'engine':<10} {'workers':>7} {'docs/s':>9} {'MB/s':>7} {'vs 1 in-proc':>13} "
            f"{'vs 2 procs':>11}"
        )
        for engine, w, s in rows:
            print(
                f"{engine:<10} {w:>7} {docs / s:>9,.0f} {mb / s:>7.1f} {base / s:>12.2f}x "
                f"{local2 / s:>10.2f}x"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
