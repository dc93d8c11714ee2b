"""flat-tokens random packed reads: lmdata vs a bare numpy memmap vs zarr-python, one run.

Workload (after anchors-measured.md W2, scaled to 64 Mi tokens so it runs in about a minute):
random ids in [1, 50257), sequence lengths uniform in [1, 4000]; batches of 32 random packed
rows of 2048 tokens. Stores: uncompressed (lmdata's default) and seqax's compressed layout
(Blosc lz4 level 5 bit-shuffle, 4 Mi-token chunks, Delta on seq_starts).

What is timed: one call per batch, the result dropped at once (steady state: the allocator
hands the same memory back, as in a training loop that keeps one batch), interleaved rounds,
rows/s of the median round and the p10 call. bench_origin_reads' flat-tokens row times
something else: a pass of 2,000 batches all kept alive (fresh memory for every batch, whose
page faults both sides pay, which brings the ratio nearer 1), on a 100M-token store. The
zarr-python rows here (zarr 3 of this venv, 4 rows a call, a slice per row, no output check) are
a rough rate only: bench_origin_reads' flat-tokens table has the side-by-side rows, zarr-python 2
and 3 each in its side venv, interleaved with lmdata on the same rows, outputs checked equal.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _compare
import numpy as np

import lmdata
from lmdata.formats.flat_tokens import Writer

N_TOKENS = int(os.environ.get("BENCH_FT_TOKENS", 64 << 20))
SEQ_LEN, BATCH = 2048, 32


def rate(fn: Callable[[int], int], seconds: float = 1.5, repeats: int = 3) -> float:
    """Median items/s of ``fn(i)`` (which returns the items it handled) over timed runs."""
    return _compare.interleaved({"": fn}, rounds=repeats * 5, seconds=seconds / 5)[""][0]


def make_data() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 50257, N_TOKENS, dtype=np.uint32)
    lens = rng.integers(1, 4001, N_TOKENS // 1000)
    ends = np.cumsum(lens)
    ends = ends[ends < N_TOKENS]
    bounds = np.concatenate([[0], ends, [N_TOKENS]])
    seqs = [tokens[a:b] for a, b in itertools.pairwise(bounds.tolist())]
    return seqs


def write(path: Path, seqs: list[np.ndarray], compression: str | None) -> float:
    t0 = time.perf_counter()
    with Writer(path, compression=compression) as w:
        for s in seqs:
            w.write(s)
    return N_TOKENS / (time.perf_counter() - t0)


def main() -> None:
    import zarr

    root = Path(tempfile.mkdtemp(prefix="bench-ft-"))
    try:
        seqs = make_data()
        w_raw = write(root / "raw.zarr", seqs, None)
        w_blosc = write(root / "blosc.zarr", seqs, "blosc")
        r_raw = lmdata.open(root / "raw.zarr")
        r_blosc = lmdata.open(root / "blosc.zarr")
        enc = r_raw.span_encoded(0, N_TOKENS)
        mm_path = root / "tokens.u32"
        enc.tofile(mm_path)
        n_rows = N_TOKENS // SEQ_LEN
        mm = np.memmap(mm_path, dtype=np.uint32, mode="r")[: n_rows * SEQ_LEN].reshape(
            n_rows, SEQ_LEN
        )
        loader = lmdata.Loader(
            r_raw, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0, rank=0, world_size=1
        )
        # every path reads the same rows: the Loader's shuffled rows of step i
        batches = [loader.indices(s)[1] for s in range(4096)]

        def memmap_gather(i: int) -> int:
            np.asarray(mm[batches[i % 4096]])
            return BATCH

        def lmdata_rows(reader: lmdata.formats.flat_tokens.FlatTokens) -> Callable[[int], int]:
            def f(i: int) -> int:
                reader.packed_rows(batches[i % 4096], SEQ_LEN)
                return BATCH

            return f

        def lmdata_loader(i: int) -> int:
            loader.batch(i % 4096)
            return BATCH

        def zarr_rows(path: Path) -> Callable[[int], int]:
            arr = zarr.open_group(str(path), mode="r")["train"]["encoded_tokens"]

            def f(i: int) -> int:
                for r in batches[i % 4096][:4].tolist():  # 4 rows a call: zarr is slow
                    arr[r * SEQ_LEN : (r + 1) * SEQ_LEN]
                return 4

            return f

        # the same rows must come back from every path
        b = batches[0]
        assert np.array_equal(r_raw.packed_rows(b, SEQ_LEN), mm[b])
        assert np.array_equal(r_blosc.packed_rows(b, SEQ_LEN), mm[b])

        load = os.getloadavg()[0]
        fast = _compare.interleaved(
            {
                "memmap gather (limit)": memmap_gather,
                "lmdata packed_rows, uncompressed": lmdata_rows(r_raw),
                "lmdata Loader.batch (packed, segment ids, positions)": lmdata_loader,
                "lmdata packed_rows, seqax blosc": lmdata_rows(r_blosc),
            }
        )
        res = {k: v for k, (v, _) in fast.items()}
        res["zarr-python 3, uncompressed"] = rate(zarr_rows(root / "raw.zarr"), 1.0, 2)
        res["zarr-python 3, seqax blosc"] = rate(zarr_rows(root / "blosc.zarr"), 1.0, 2)
        mem = res["memmap gather (limit)"]
        mem_call = fast["memmap gather (limit)"][1]
        print(
            f"{N_TOKENS / 2**20:.0f} Mi tokens, random batches of {BATCH} x {SEQ_LEN} tokens, "
            "per call, each result dropped at once (memory recycled)"
        )
        print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
        head = f"{'reader':60} {'rows/s':>10} {'Mtok/s':>8} {'vs memmap':>9}"
        print(f"{head} {'p10 us':>8} {'vs':>5}")
        for k, v in res.items():
            call = fast[k][1] if k in fast else 0.0
            tail = f"{call * 1e6:8.0f} {mem_call / call:5.2f}" if call else f"{'-':>8} {'-':>5}"
            print(f"{k:60} {v:10,.0f} {v * SEQ_LEN / 1e6:8.0f} {v / mem:9.2f} {tail}")
            _compare.record("bench_flat_tokens", f"{k}: rows/s", v, unit="rows/s")
            if k != "memmap gather (limit)":
                _compare.record("bench_flat_tokens", f"{k}: vs memmap", v / mem)
        print(
            f"lmdata / zarr-python, uncompressed: "
            f"{res['lmdata packed_rows, uncompressed'] / res['zarr-python 3, uncompressed']:.0f}x"
        )
        print(
            f"lmdata / zarr-python, seqax blosc:  "
            f"{res['lmdata packed_rows, seqax blosc'] / res['zarr-python 3, seqax blosc']:.1f}x"
        )
        _compare.record("bench_flat_tokens", "write uncompressed: tok/s", w_raw, unit="tok/s")
        _compare.record("bench_flat_tokens", "write blosc: tok/s", w_blosc, unit="tok/s")
        du_raw = lmdata.info(root / "raw.zarr")["bytes_on_disk"]
        du_blosc = lmdata.info(root / "blosc.zarr")["bytes_on_disk"]
        print(
            f"write: uncompressed {w_raw / 1e6:.0f} Mtok/s ({du_raw / 1e6:.0f} MB), "
            f"blosc {w_blosc / 1e6:.0f} Mtok/s ({du_blosc / 1e6:.0f} MB)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
