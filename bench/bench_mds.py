"""MDS: random access, take() batches, full iteration and writing, against mosaicml-streaming.

Peers on the same shards: streaming 0.13.0's StreamingDataset (``ds[i]`` random access and
single-process iteration with ``batch_size=256``) in its own venv, kept open in one server
process (bench/_streaming_worker.py ``serve``) so lmdata and streaming runs alternate as
interleaved pairs (bench/_compare.py: a pair counts only when both decoded the same samples,
the ratio is the median over pairs); its MDSWriter (one run each); and the practical limit: a
bare memory-mapped shard sliced by precomputed offsets with no decoding at all. Datasets: ~1
KB text samples (int + str + json columns) and 128-383 token arrays (ndarray:uint32),
uncompressed and zstd.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import _compare as C  # noqa: E402
import envs  # noqa: E402
from bench_origin_reads import Streaming, digest  # noqa: E402

from tests.formats.mds_samples import columns, run_streaming, samples  # noqa: E402

N = 10_000 if C.QUICK else 50_000
RANDOM = 4_096 if C.QUICK else 20_480
TAKE_BATCH = 256


def limit_random(d: Path, idx: list[int]) -> float:
    """Bare mmap + offsets, bytes only: what any reader of these shards pays at least (s)."""
    r = lmdata.open(d, format="mds")
    maps, offs = [], []
    for s in r.shards:
        with open(d / s.raw_data.basename, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        maps.append(m)
        offs.append(np.frombuffer(m, "<u4", s.samples + 1, 4).tolist())
    starts = r._starts[:-1]
    sid = (np.searchsorted(starts, idx, side="right") - 1).tolist()
    local = (np.asarray(idx) - starts[np.asarray(sid)]).tolist()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for k, j in zip(sid, local, strict=True):
            o = offs[k]
            maps[k][o[j] : o[j + 1]]
        best = min(best, time.perf_counter() - t)
    return best


def measure(recipe: str, comp: str | None, tmp: Path, python: Path | None) -> dict[str, Any]:
    name = f"{recipe[5:]}{'-zstd' if comp else ''}"
    data = samples(recipe, N)
    ours = tmp / f"ours-{name}"
    t = time.perf_counter()
    with lmdata.writer(ours, "mds", columns=columns(recipe), compression=comp) as w:
        for s in data:
            w.write(s)
    out: dict[str, Any] = {"write": N / (time.perf_counter() - t)}
    del data
    idx = np.random.default_rng(0).integers(0, N, RANDOM)
    il = idx.tolist()
    batches = idx.reshape(-1, TAKE_BATCH)
    r = lmdata.open(ours)
    list(r)  # warm: maps shards, fills the decompressed cache

    def random() -> tuple[float, str]:
        t = time.perf_counter()
        got = [r[i] for i in il]
        return time.perf_counter() - t, digest(got)

    def take() -> tuple[float, str]:
        t = time.perf_counter()
        got = [x for b in batches for x in r.take(b)]
        return time.perf_counter() - t, digest(got)

    def iterate() -> tuple[float, str]:
        t = time.perf_counter()
        got = list(r)
        return time.perf_counter() - t, digest(got)

    server = None
    if python is not None:
        copy = tmp / f"copy-{name}"
        shutil.copytree(ours, copy)  # streaming writes decompressed shards beside the zstd
        server = Streaming(python, copy)
        server.run({"op": "iter"})  # warm: decompresses every shard
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
                    }
                ],
            }
        )["results"][0]
        out["write_theirs"] = N / res["seconds"]
    rand_job = {"op": "random", "idx": il}
    for op, fn, job, count in (
        ("random r[i]", random, rand_job, RANDOM),
        (f"take({TAKE_BATCH})", take, rand_job, RANDOM),
        ("full iteration", iterate, {"op": "iter"}, N),
    ):
        theirs = (lambda job=job: server.run(job)) if server is not None else None
        row = C.compare("mds-reads", f"{name} {op}", fn, theirs, "streaming venv missing")
        out[op] = (row, count)
    if comp is None:
        out["limit"] = RANDOM / limit_random(ours, il)
    if server is not None:
        server.close()
    for p in (ours, tmp / f"theirs-{name}", tmp / f"copy-{name}"):
        shutil.rmtree(p, ignore_errors=True)
    return out


def main() -> None:
    env = envs.ensure("streaming")
    python = env.python if env.ok else None
    tmp = Path(tempfile.mkdtemp(prefix="bench-mds-"))
    try:
        lines = []
        for recipe in ("benchtext", "benchtokens"):
            for comp in (None, "zstd"):
                res = measure(recipe, comp, tmp, python)
                cells = []
                for op in ("random r[i]", f"take({TAKE_BATCH})", "full iteration"):
                    row, count = res[op]
                    ours = f"{count / row.lmdata_s / 1e3:,.0f}k" if row.lmdata_s else "-"
                    if row.ratio is None:
                        cells.append(f"{ours} ({row.note})")
                    else:
                        theirs = f"{count / row.other_s / 1e3:,.1f}k"
                        cells.append(f"{ours} vs {theirs} = {row.ratio:.1f}x")
                name = recipe[5:] + (", zstd" if comp else "")
                w = f"{res['write'] / 1e3:,.0f}k"
                C.record("bench_mds", f"{name} write: samples/s", res["write"], unit="samples/s")
                if "write_theirs" in res:
                    C.record(
                        "bench_mds",
                        f"{name} write: x streaming",
                        res["write"] / res["write_theirs"],
                    )
                    w += f" vs {res['write_theirs'] / 1e3:,.0f}k"
                    w += f" = {res['write'] / res['write_theirs']:.1f}x"
                lim = f"{res['limit'] / 1e6:.2f} M" if "limit" in res else "-"
                lines.append(f"| {name} | {' | '.join(cells)} | {w} | {lim} |")
        load = " / ".join(f"{x:.1f}" for x in _load())
        table = "\n".join(
            [
                f"*MDS, {N:,} samples, one process (`python bench/bench_mds.py`).* Samples/s, "
                f"lmdata vs mosaicml-streaming 0.13.0 (**origin tool itself**"
                f"{'' if python else ': NOT INSTALLED'}), ratio = median of {C.PAIRS} "
                "interleaved pairs whose decoded samples agree; write: one run each; bare "
                "mmap: slicing the stored bytes by precomputed offsets, no decoding (the "
                f"practical limit of random reads). Load average at the end {load} "
                "(1 / 5 / 15 min).",
                "",
                "| dataset | random `r[i]` | `take(256)` | full iteration | write | bare mmap |",
                "|---|---|---|---|---|---|",
                *lines,
            ]
        )
        print("\n" + table)
        C.report("bench_mds", table)
        C.print_table(
            "mds-reads",
            "MDS reads (read loop only; opening excluded)",
            "mosaicml-streaming 0.13.0 StreamingDataset",
            "origin tool itself" if python else "NOT INSTALLED",
            f"{N:,} samples; {RANDOM:,} random reads",
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load() -> tuple[float, float, float]:
    import os

    return os.getloadavg()


if __name__ == "__main__":
    main()
