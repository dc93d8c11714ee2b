"""The execution seam: tokenize throughput on 1 and 2 workers, local processes vs Ray.

Workload: random-word JSONL documents (1-3 k chars), the byte-level BPE of the Modalities
reference files, flat-tokens output; each engine's output is checked byte-identical to the
local one's. Also the start-up cost of a Ray job (``ray.init`` on this machine) on its own.
Skips the Ray rows when ray is not installed (``pip install 'lmdata[ray]'``).
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

N_DOCS = int(os.environ.get("BENCH_PAR_DOCS", 8000))
TOKENIZER = Path(__file__).parents[1] / "tests/data/modalities/tokenizers/bpe5k/tokenizer.json"


def _docs(path: Path) -> int:
    rng = np.random.default_rng(7)
    words = [
        "".join(chr(97 + c) for c in rng.integers(0, 26, int(n))) for n in rng.integers(2, 9, 4000)
    ]
    size = 0
    with open(path, "w") as f:
        for i in range(N_DOCS):
            text = " ".join(
                words[j] for j in rng.integers(0, len(words), int(rng.integers(200, 600)))
            )
            line = json.dumps({"id": i, "text": text}) + "\n"
            f.write(line)
            size += len(line)
    return size


def _tree(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


def main() -> None:
    from lmdata.tokenize.pipeline import TokenizeJob, tokenize

    tmp = Path(tempfile.mkdtemp(prefix="bench-par-"))
    try:
        src = tmp / "docs"
        src.mkdir()
        for k in range(4):  # several files, so there are units for every worker
            size = _docs(src / f"part-{k}.jsonl")
        mb = 4 * size / 1e6
        job = TokenizeJob(to="flat-tokens", tokenizer=str(TOKENIZER))
        engines = ["processes"]
        if importlib.util.find_spec("ray"):
            import ray

            t0 = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
            print(f"ray start-up (ray.init, local, 2 CPUs): {time.perf_counter() - t0:.1f} s")
            engines.append("ray")
        else:
            print("ray not installed: local rows only (pip install 'lmdata[ray]')")
        print(f"{'engine':<10} {'workers':>7} {'MB/s':>8} {'vs 1 worker':>12} {'vs local':>9}")
        rates: dict[tuple[str, int], float] = {}
        ref = None
        for engine in engines:
            for w in (1, 2):
                dst = tmp / f"out-{engine}-{w}"
                t0 = time.perf_counter()
                tokenize([src], dst, job, workers=w, engine=engine)
                rates[engine, w] = mb / (time.perf_counter() - t0)
                tree = _tree(dst)
                ref = ref or tree
                assert tree == ref, f"{engine} x{w}: output differs from the local engine's"
                shutil.rmtree(dst)
                scale = rates[engine, w] / rates[engine, 1]
                local = rates[engine, w] / rates["processes", w]
                print(
                    f"{engine:<10} {w:>7} {rates[engine, w]:>8.1f} {scale:>11.2f}x {local:>8.2f}x"
                )
        if "ray" in engines:
            ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
