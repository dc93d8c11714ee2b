"""The execution seam: tokenize on local processes and on Ray, 1 and 2 workers, interleaved.

Workload: random-word JSONL documents (1-3 k chars) in 4 plain files, cut into byte-range
units (``BENCH_PAR_RANGE`` bytes: about 40, the job's last ones smaller), the byte-level BPE
of the Modalities reference files, flat-tokens output. Every worker gets one core
(``RAYON_NUM_THREADS=1``, ``TOKENIZERS_PARALLELISM=false``: one batch encodes at a time, also
in the 1-worker local row, which runs in this process), so the rows measure the engines, not
the tokenizer's threads.
One local Ray instance (``num_cpus=2``) serves both Ray rows: ``workers`` bounds the tasks
running at once. The four rows run in turn, ``BENCH_PAR_REPS`` rounds (5), so a load change
during the run moves rows together; scaling is printed as the median of the rounds' ratios, as
the ratio of the median times and as the rounds' range, and (local rows) as the bound the CPU
time of both jobs sets on 2 cores. Each row shows the driver's CPU share (at 2 workers it
competes with them). Every output is checked byte-identical to the first. Prints Ray's
start-up (``ray.init``) and first job, the local pool's start-up (a new pool, which the CLI's
one job pays, and a reused one, as the local rows and Ray's workers are; a new pool both in a
process without Ray, forked as the CLI's, and in this one, spawned after ``ray.init``), and
``lmdata tokenize`` of 2 documents end to end in a new process with 1 and 2 workers (forked,
and spawned). Skips Ray when it is not installed (``pip install 'lmdata[ray]'``) or
``BENCH_PAR_RAY=0``.

Runs itself in a fresh interpreter, so the tokenizer's thread pool is sized before first use.
``python bench/bench_parallel.py`` alone takes about three minutes on an idle 2-core machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _compare
import numpy as np

QUICK = bool(os.environ.get("LMDATA_BENCH_QUICK"))
N_DOCS = int(os.environ.get("BENCH_PAR_DOCS", 300 if QUICK else 2000))  # per file, 4 files
RANGE = int(os.environ.get("BENCH_PAR_RANGE", 512 << 10))
REPS = int(os.environ.get("BENCH_PAR_REPS", 2 if QUICK else 5))
RAY = os.environ.get("BENCH_PAR_RAY", "1") != "0"  # BENCH_PAR_RAY=0: the local rows only
TOKENIZER = Path(__file__).parents[1] / "tests/data/modalities/tokenizers/bpe5k/tokenizer.json"
CHILD = "--child"
START_UP = "--start-up"  # child mode: a new pool's cost, in a process without Ray's threads


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


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _children_cpu() -> float:
    """CPU seconds of this process's live child processes (the local pool's workers), from
    /proc; 0 where there is none."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    me = os.getpid()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _cli_job(tiny: Path, out: Path, workers: int, method: str | None) -> float:
    """Seconds of ``lmdata tokenize`` on ``tiny`` in a new process, end to end (interpreter,
    imports, pool start, the job, exit): what a user's one command costs."""
    env = dict(os.environ)
    env.pop("LMDATA_START_METHOD", None)
    if method:
        env["LMDATA_START_METHOD"] = method
    cmd = [sys.executable, "-m", "lmdata.cli", "tokenize", str(tiny), str(out), "--to"]
    cmd += ["flat-tokens", "--tokenizer", str(TOKENIZER), "--workers", str(workers), "-q"]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    shutil.rmtree(out)
    return seconds


def _tiny_jobs(tiny: Path, out: Path) -> tuple[float, float]:
    """A 2-document job on 2 worker processes with a new pool, then with that pool reused
    (after a first job, so imports and the page cache are warm in both)."""
    from lmdata import parallel
    from lmdata.tokenize.pipeline import TokenizeJob, tokenize

    job = TokenizeJob(to="flat-tokens", tokenizer=str(TOKENIZER))
    got = []
    for k in range(3):
        if k < 2:
            parallel.shutdown()  # the first job warms up; the second starts a new pool
        t0 = time.perf_counter()
        tokenize([tiny], out, job, workers=2, engine="processes")
        got.append(time.perf_counter() - t0)
        shutil.rmtree(out)
    parallel.shutdown()
    return got[1], got[2]


def _start_up(tiny: Path, out: Path) -> tuple[float, float]:
    """:func:`_tiny_jobs` in a new process that, like the CLI, runs no Ray, so its pool is
    forked on Linux; this process's pools are spawned once ray.init started Ray's threads."""
    cmd = [sys.executable, __file__, START_UP, str(tiny), str(out)]
    res = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    cold, warm = json.loads(res.stdout.strip().splitlines()[-1])
    return cold, warm


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
        # once Ray runs (its threads), new local pools are spawned: this is the first one's
        print(f"local worker processes start by {parallel.start_method()} before ray.init")
        job = TokenizeJob(to="flat-tokens", tokenizer=str(TOKENIZER))
        ref: dict[str, bytes] = {}

        def run(engine: str, workers: int) -> tuple[float, float, float]:
            """(seconds, the driver's CPU seconds, its workers' CPU seconds: local only)."""
            dst = tmp / "out"
            c0, k0, t0 = _own_cpu(), _children_cpu(), time.perf_counter()
            tokenize([src], dst, job, workers=workers, engine=engine, range_bytes=RANGE)
            seconds = time.perf_counter() - t0
            cpu, kids = _own_cpu() - c0, _children_cpu() - k0
            tree = _tree(dst)
            ref.setdefault("tree", tree)
            assert tree == ref["tree"], f"{engine} x{workers}: output differs from the first"
            shutil.rmtree(dst)
            return seconds, cpu, kids

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
            """A 2-document job on 2 worker processes, with a new pool and then with that pool
            reused (a later job of the same process), in this process (after ray.init, spawned)."""
            parallel.shutdown()
            return tiny_job(), tiny_job()

        rows = [("processes", 1), ("processes", 2)]
        if RAY and importlib.util.find_spec("ray"):
            import ray

            t0 = time.perf_counter()
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
            up = time.perf_counter() - t0
            print(f"ray start-up (ray.init, a local instance, 2 CPUs): {up:.1f} s")
            t0 = time.perf_counter()
            run("ray", 2)  # the first job starts Ray's worker processes (later jobs reuse them)
            first = time.perf_counter() - t0
            print(f"first ray job (worker processes start, then the job): {first:.1f} s")
            rows += [("ray", 1), ("ray", 2)]
        else:
            print(
                "ray not installed or BENCH_PAR_RAY=0: local rows only (pip install 'lmdata[ray]')"
            )
        run("processes", 1)  # warm the page cache and the tokenizer
        got: dict[tuple[str, int], list[tuple[float, float, float]]] = {r: [] for r in rows}
        spawn: list[tuple[float, float]] = []
        forked: list[tuple[float, float]] = []  # as the CLI's one job pays it
        cli: dict[str, list[float]] = {"1": [], "2": [], "2 spawn": []}
        for _ in range(REPS):
            forked.append(_start_up(tiny, tmp / "tiny-fork"))
            spawn.append(start_up())  # leaves a warm pool: the local rows reuse it, as Ray's do
            for r in rows:
                got[r].append(run(*r))
            for name, (w, method) in {
                "1": (1, None),
                "2": (2, None),
                "2 spawn": (2, "spawn"),
            }.items():
                cli[name].append(_cli_job(tiny, tmp / "cli-out", w, method))
        print(f"load average at end: {_load()}")
        times = {r: [x[0] for x in v] for r, v in got.items()}

        def ratio(a: tuple[str, int], b: tuple[str, int]) -> str:
            """How much faster b is than a: the median over rounds of time(a) / time(b), the
            ratio of the median times, and the rounds' range."""
            per = [x / y for x, y in zip(times[a], times[b], strict=True)]
            of_medians = statistics.median(times[a]) / statistics.median(times[b])
            scaling = statistics.median(per)
            _compare.record("bench_parallel", f"{b[0]}: {a[1]} -> {b[1]} workers", scaling)
            return (
                f"{scaling:.2f}x median of {len(per)} rounds' ratios, "
                f"{of_medians:.2f}x ratio of medians (rounds {min(per):.2f}-{max(per):.2f}x)"
            )

        print(
            f"{'engine':<10} {'workers':>7} {'median s':>9} {'docs/s':>9} {'MB/s':>7} "
            f"{'driver CPU':>10} {'all CPU s':>9}"
        )
        for r in rows:
            s = statistics.median(times[r])
            share = statistics.median(c / t for t, c, _ in got[r])
            cpu = statistics.median(c + k for _, c, k in got[r])
            all_cpu = f"{cpu:>9.2f}" if r[0] == "processes" else f"{'-':>9}"
            _compare.record("bench_parallel", f"{r[0]} {r[1]} worker(s): docs/s", docs / s)
            print(
                f"{r[0]:<10} {r[1]:>7} {s:>9.2f} {docs / s:>9,.0f} {mb / s:>7.2f} "
                f"{share:>10.0%} {all_cpu}"
            )
        print(
            "driver CPU: the driver's CPU time / the job's time (it commits the staged parts; "
            "at 2 workers it competes with them for the 2 cores; the 1-worker local row runs in "
            "the driver: near 100% is one core); all CPU: driver + workers"
        )
        cold, warm = (statistics.median(x[i] for x in spawn) for i in (0, 1))
        fcold, fwarm = (statistics.median(x[i] for x in forked) for i in (0, 1))
        print(
            f"local 2-document job, 2 worker processes: {cold:.2f} s with a new pool "
            f"({parallel.start_method()}), {warm:.2f} s reusing it (later jobs of a process; "
            f"the rows above); in a process without Ray: {fcold:.2f} s with a new pool "
            f"({'fork' if sys.platform.startswith('linux') else 'spawn'}), {fwarm:.2f} s reused"
        )
        c1, c2, cs = (statistics.median(cli[k]) for k in ("1", "2", "2 spawn"))
        print(
            f"`lmdata tokenize` of 2 documents end to end (new process): {c1:.2f} s with 1 "
            f"worker, {c2:.2f} s with 2 (forked on Linux), {cs:.2f} s with 2 spawned"
        )
        print(f"processes: 1 -> 2 workers {ratio(rows[0], rows[1])} (goal >= 1.8x)")
        cpu1, cpu2 = (statistics.median(c + k for _, c, k in got[r]) for r in rows[:2])
        print(
            f"processes: 1 -> 2 workers at most {2 * cpu1 / cpu2:.2f}x on 2 cores by CPU time "
            f"(2 x {cpu1:.2f} s / {cpu2:.2f} s: what the 2-worker job spends beyond the 1-worker)"
        )

        def with_start(pools: list[tuple[float, float]]) -> float:
            """Scaling when the 2-worker job also starts its pool (the 1-worker one runs in
            the driver): the pool's cost is a new pool's tiny job less a reused pool's."""
            return statistics.median(
                a / (b + c[0] - c[1])
                for a, b, c in zip(times[rows[0]], times[rows[1]], pools, strict=True)
            )

        print(
            f"processes: 1 -> 2 workers, a new pool per job {with_start(forked):.2f}x "
            f"(forked, as the CLI's one job), {with_start(spawn):.2f}x (spawned)"
        )
        if len(rows) == 4:
            print(f"ray:       1 -> 2 workers {ratio(rows[2], rows[3])} (goal >= 1.8x)")
            for w, (a, b) in ((1, (rows[2], rows[0])), (2, (rows[3], rows[1]))):
                per = statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))
                what = f"ray / local processes, {w} worker(s): time"
                _compare.record("bench_parallel", what, per, higher_is_better=False)
                print(
                    f"ray / local processes, {w} worker{'s' if w > 1 else ''}: "
                    f"{per:.2f}x the time (goal <= 1.15x)"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Runs :func:`measure` in a fresh interpreter with one tokenizer thread per worker."""
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env[_compare.RELAY] = "1"  # the child's record() calls come back as marked lines
    root = str(Path(__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # its lines pass through this process's stdout, so bench/run.py's report gets them too
    with subprocess.Popen(
        [sys.executable, __file__, CHILD], env=env, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if not _compare.relayed(line):
                print(line, end="", flush=True)
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args)


if __name__ == "__main__":
    if START_UP in sys.argv:
        print(json.dumps(_tiny_jobs(Path(sys.argv[2]), Path(sys.argv[3]))))
    elif CHILD in sys.argv:
        measure()
    else:
        main()
