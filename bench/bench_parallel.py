"""The execution seam: tokenize on local processes and on Ray, 1 and 2 workers, interleaved.

Workload: random-word JSONL documents (1-3 k chars) in 4 plain files, cut into byte-range
units (``BENCH_PAR_RANGE`` bytes), the byte-level BPE of the Modalities reference files,
flat-tokens output. Every worker gets one core (``RAYON_NUM_THREADS=1``, the 1-worker local
row runs in this process), so the rows measure the engines, not the tokenizer's threads. One
local Ray instance (``num_cpus=2``) serves both Ray rows: ``workers`` bounds the tasks running
at once. The four rows run in turn, ``BENCH_PAR_REPS`` rounds; the ratios are medians of the
rounds' ratios, so a load change during the run moves rows together. Every output is checked
byte-identical to the first. Prints Ray's start-up cost (``ray.init``) and the first job's
(worker processes starting), and the local pool's start-up: the local rows reuse one pool
(as the API's later jobs do, and as Ray reuses its workers); the CLI's one job starts one.
Skips Ray when it is not installed (``pip install 'lmdata[ray]'``).

Runs itself in a fresh interpreter, so the tokenizer's thread pool is sized before first use.
``python bench/bench_parallel.py`` alone takes about a minute on an idle 2-core machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

QUICK = bool(os.environ.get("LMDATA_BENCH_QUICK"))
N_DOCS = int(os.environ.get("BENCH_PAR_DOCS", 300 if QUICK else 1000))  # per file, 4 files
RANGE = int(os.environ.get("BENCH_PAR_RANGE", 512 << 10))
REPS = int(os.environ.get("BENCH_PAR_REPS", 2 if QUICK else 3))
TOKENIZER = Path(__file__).parents[1] / "tests/data/modalities/tokenizers/bpe5k/tokenizer.json"
CHILD = "--child"


def _docs(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
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


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def measure() -> None:
    from lmdata import parallel
    from lmdata.tokenize.pipeline import TokenizeJob, tokenize
    from lmdata.tokenize.sources import list_inputs, plan_units

    tmp = Path(tempfile.mkdtemp(prefix="bench-par-"))
    try:
        src = tmp / "docs"
        src.mkdir()
        for k in range(4):
            _docs(src / f"part-{k}.jsonl", k)
        mb = sum(f.stat().st_size for f in src.iterdir()) / 1e6
        docs = 4 * N_DOCS
        units = len(plan_units(list_inputs([src]), RANGE))
        print(f"{docs:,} documents, {mb:.1f} MB in 4 files, {units} byte-range units")
        print(f"load average at start: {_load()} on {os.cpu_count()} cores")
        job = TokenizeJob(to="flat-tokens", tokenizer=str(TOKENIZER))
        ref: dict[str, bytes] = {}

        def run(engine: str, workers: int) -> float:
            dst = tmp / "out"
            t0 = time.perf_counter()
            tokenize([src], dst, job, workers=workers, engine=engine, range_bytes=RANGE)
            seconds = time.perf_counter() - t0
            tree = _tree(dst)
            ref.setdefault("tree", tree)
            assert tree == ref["tree"], f"{engine} x{workers}: output differs from the first"
            shutil.rmtree(dst)
            return seconds

        tiny = tmp / "tiny"
        tiny.mkdir()
        for k in range(2):
            (tiny / f"{k}.jsonl").write_text('{"text": "a"}\n')

        def tiny_job() -> float:
            t0 = time.perf_counter()
            tokenize([tiny], tmp / "tiny-out", job, workers=2, engine="processes")
            shutil.rmtree(tmp / "tiny-out")
            return time.perf_counter() - t0

        def start_up() -> tuple[float, float]:
            """A 2-document job on 2 worker processes, with a new pool (what the CLI's one job
            pays) and then with that pool reused (a later job of the same process)."""
            parallel.shutdown()
            return tiny_job(), tiny_job()

        rows = [("processes", 1), ("processes", 2)]
        if importlib.util.find_spec("ray"):
            import ray

            t0 = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
            up = time.perf_counter() - t0
            print(f"ray start-up (ray.init, a local instance, 2 CPUs): {up:.1f} s")
            t0 = time.perf_counter()
            run("ray", 2)  # the first job starts Ray's worker processes (later jobs reuse them)
            first = time.perf_counter() - t0
            print(f"first ray job (worker processes start, then the job): {first:.1f} s")
            rows += [("ray", 1), ("ray", 2)]
        else:
            print("ray not installed: local rows only (pip install 'lmdata[ray]')")
        run("processes", 1)  # warm the page cache and the tokenizer
        times: dict[tuple[str, int], list[float]] = {r: [] for r in rows}
        spawn: list[tuple[float, float]] = []
        for _ in range(REPS):
            spawn.append(start_up())  # leaves a warm pool: the local rows reuse it, as Ray's do
            for r in rows:
                times[r].append(run(*r))
        print(f"load average at end: {_load()}")

        def ratio(a: tuple[str, int], b: tuple[str, int]) -> float:
            """Median over rounds of time(a) / time(b): how much faster b is than a."""
            return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

        print(f"{'engine':<10} {'workers':>7} {'median s':>9} {'docs/s':>9} {'MB/s':>7}")
        for r in rows:
            s = statistics.median(times[r])
            print(f"{r[0]:<10} {r[1]:>7} {s:>9.2f} {docs / s:>9,.0f} {mb / s:>7.2f}")
        cold, warm = (statistics.median(x[i] for x in spawn) for i in (0, 1))
        print(
            f"local 2-document job, 2 worker processes: {cold:.2f} s with a new pool (the CLI's "
            f"one job), {warm:.2f} s reusing it (later jobs of a process; the rows above)"
        )
        print(f"processes: 1 -> 2 workers {ratio(rows[0], rows[1]):.2f}x (goal >= 1.8x)")
        with_start = statistics.median(
            a / (b + c[0] - c[1])
            for a, b, c in zip(times[rows[0]], times[rows[1]], spawn, strict=True)
        )
        print(f"processes: 1 -> 2 workers, a new pool per job (the CLI) {with_start:.2f}x")
        if len(rows) == 4:
            print(f"ray:       1 -> 2 workers {ratio(rows[2], rows[3]):.2f}x (goal >= 1.8x)")
            for w, (a, b) in ((1, (rows[2], rows[0])), (2, (rows[3], rows[1]))):
                print(
                    f"ray / local processes, {w} worker{'s' if w > 1 else ''}: "
                    f"{ratio(a, b):.2f}x the time (goal <= 1.15x)"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Runs :func:`measure` in a fresh interpreter with one tokenizer thread per worker."""
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    root = str(Path(__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # its lines pass through this process's stdout, so bench/run.py's report gets them too
    with subprocess.Popen(
        [sys.executable, __file__, CHILD], env=env, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args)


if __name__ == "__main__":
    if CHILD in sys.argv:
        measure()
    else:
        main()
