"""MDS: random access, take() batches, full iteration and writing, against mosaicml-streaming.

Peers measured in the same run on the same shards: streaming 0.13.0's StreamingDataset
(``ds[i]`` random access and single-process iteration, in its own venv through
tests/formats/mds_streaming_helper.py) and its MDSWriter; and the practical limit: a bare
memory-mapped shard sliced by a precomputed numpy offset array with no decoding at all.
Datasets: ~1 KB text samples (int + str + json columns) and 128-383 token arrays
(ndarray:uint32), uncompressed and zstd.
"""

from __future__ import annotations

import mmap
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import lmdata

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.formats.mds_samples import (
    columns,
    run_streaming,
    samples,
    streaming_python,
)

N = 50_000
RANDOM = 20_000
TAKE_BATCH = 256


def rate(fn: Any, count: int, repeat: int = 3) -> float:
    """Items per second, best of ``repeat`` runs (the machine is shared; streaming's random
    access is measured the same way)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return count / best


def limit_random(d: Path, idx: np.ndarray) -> float:
    """Bare mmap + numpy offsets, bytes only: what any reader of these shards pays at least."""
    r = lmdata.open(d, format="mds")
    maps, offs = [], []
    for s in r.shards:
        with open(d / s.raw_data.basename, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        maps.append(m)
        offs.append(np.frombuffer(m, "<u4", s.samples + 1, 4).tolist())
    starts = r._starts[:-1]
    sid = (np.searchsorted(starts, idx, side="right") - 1).tolist()
    local = (idx - starts[np.asarray(sid)]).tolist()

    def run() -> None:
        for k, j in zip(sid, local, strict=True):
            o = offs[k]
            maps[k][o[j] : o[j + 1]]

    return rate(run, len(idx))


def limit_iter(d: Path) -> float:
    r = lmdata.open(d, format="mds")

    def run() -> None:
        for s in r.shards:
            with open(d / s.raw_data.basename, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            o = np.frombuffer(m, "<u4", s.samples + 1, 4).tolist()
            for j in range(s.samples):
                m[o[j] : o[j + 1]]
            del o

    return rate(run, len(r), repeat=1)


def main() -> None:
    if streaming_python() is None:
        print("mosaicml-streaming venv (.venv/extra-streaming) missing: run make install")
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-mds-"))
    try:
        rows: list[tuple[str, ...]] = []
        for recipe in ("benchtext", "benchtokens"):
            data = samples(recipe, N)
            for comp in (None, "zstd"):
                name = f"{recipe[5:]}{'-zstd' if comp else ''}"
                ours = tmp / f"ours-{name}"
                t = time.perf_counter()
                with lmdata.writer(ours, "mds", columns=columns(recipe), compression=comp) as w:
                    for s in data:
                        w.write(s)
                write_ours = N / (time.perf_counter() - t)
                res = run_streaming(
                    {
                        "op": "batch",
                        "jobs": [
                            {
                                "op": "write",
                                "out": str(tmp / f"theirs-{name}"),
                                "recipe": recipe,
                                "n": N,
                                "compression": comp,
                            },
                        ],
                    }
                )["results"][0]
                write_theirs = N / res["seconds"]
                shutil.copytree(ours, tmp / f"copy-{name}")  # streaming writes beside zstd
                # batch_size matters to streaming's iteration (1: ~1k samples/s); 256 is its
                # fast, typical setting. Random access ds[i] does not depend on it.
                sb = run_streaming(
                    {
                        "op": "bench",
                        "local": str(tmp / f"copy-{name}"),
                        "random": RANDOM,
                        "batch_size": 256,
                    },
                    timeout=600,
                )
                r = lmdata.open(ours)
                idx = np.random.default_rng(0).integers(0, N, RANDOM)
                list(r)  # warm: maps shards, fills the decompressed cache
                ours_random = rate(lambda r=r, idx=idx: [r[i] for i in idx.tolist()], RANDOM)
                batches = (
                    idx.reshape(-1, TAKE_BATCH)
                    if RANDOM % TAKE_BATCH == 0
                    else np.array_split(idx, RANDOM // TAKE_BATCH)
                )
                ours_take = rate(lambda r=r, b=batches: [r.take(x) for x in b], RANDOM)
                ours_iter = rate(lambda r=r: sum(1 for _ in r), N, repeat=1)
                lim_r = limit_random(ours, idx) if comp is None else float("nan")
                lim_i = limit_iter(ours) if comp is None else float("nan")
                limit_r = f"{lim_r:,.0f}" if comp is None else "-"
                limit_i = f"{lim_i:,.0f}" if comp is None else "-"
                for op, ours_rate, theirs, lim in (
                    ("random r[i]", ours_random, sb["random_per_s"], limit_r),
                    (f"take({TAKE_BATCH}) random", ours_take, sb["random_per_s"], limit_r),
                    ("full iteration", ours_iter, sb["iter_per_s"], limit_i),
                    ("write", write_ours, write_theirs, "-"),
                ):
                    rows.append(
                        (
                            name,
                            op,
                            f"{ours_rate:,.0f}",
                            f"{theirs:,.0f}",
                            f"{ours_rate / theirs:.1f}x",
                            lim,
                        )
                    )
                for p in (ours, tmp / f"theirs-{name}", tmp / f"copy-{name}"):
                    shutil.rmtree(p, ignore_errors=True)
        head = ("dataset", "operation", "lmdata/s", "streaming/s", "ratio", "bare mmap/s")
        widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
        print(f"{N:,} samples; samples per second (higher is better), one process")
        for row in [head, *rows]:
            print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
