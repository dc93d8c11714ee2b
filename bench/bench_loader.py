"""The training Loader beside the practical limit and mosaicml-streaming, in one run.

Workload (BENCH_LOADER_TOKENS, default 64 Mi tokens): random ids in [1, 50257), documents of
1-4000 tokens, an uncompressed flat-tokens store; global batches of 32 shuffled packed rows of
2048 tokens. The limit is a bare numpy memmap gather of the same rows (encoded tokens, no
decoding, no segment ids); a second reference adds the packed expansion written in plain
numpy. The in-process paths run interleaved (short rounds A B C .., the median round each), so
load from other jobs hits them alike: ``Loader.batch(step)`` per call (rows/s of the median
round, and the p10 time of one call). The iteration rows (``for batch in loader``, the
consumer doing nothing else: the worst case for prefetch threads, which only pay off when a
training step runs meanwhile) are measured after them, alternating with each other. The
Loader lays rows out in C (``lmdata/_native/kernel.c``) where it was built, in numpy otherwise.
Side venvs (bench/envs.py) run the peers on the same tokens: streaming 0.13.0 iterates an
MDS copy cut into 2048-token rows (it has no packing),
Grain 0.2.18 packs the shuffled documents (ConcatThenSplitIterDataset, segment ids and
positions), LitData 0.2.76 reads shuffled TokensLoader blocks. The second table opens
simulated flat-tokens stores of 10^6 .. 10^12 tokens (metadata of the full size; the chunk
files the first batch touches are hard links to one real chunk, the rest absent) in a fresh
process each and times open, first batch and peak resident memory; the third does the same for
a store of 10^12 tokens none of whose token chunks was written (every read is of fill values),
the fourth for ``.pbin`` files of 10^6 .. 10^9 tokens (sparse token data except the first
batch's rows, a real index and its sidecar).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _compare
import numpy as np

import lmdata
from lmdata.formats.flat_tokens import Writer

N_TOKENS = int(os.environ.get("BENCH_LOADER_TOKENS", 64 << 20))
SEQ_LEN, BATCH = 2048, 32
HERE = Path(__file__).resolve().parent
STREAMING_PY = HERE.parent / ".venv" / "extra-streaming" / "bin" / "python"
# .pbin sizes of the open-time table: its index is a pickle (10^9 tokens: 10^6 documents, about
# 2 s to unpickle once, when the sidecar is built)
PBIN_EXPS = tuple(int(e) for e in os.environ.get("BENCH_LOADER_PBIN_EXPS", "6,8,9").split(","))
STEP_S = 200e-6  # the consumer's step in the iteration rows that model training (a sleep)
PEER_TOKENS = int(os.environ.get("BENCH_LOADER_PEER_TOKENS", 16 << 20))  # Grain, LitData


def make_store(root: Path) -> lmdata.formats.flat_tokens.FlatTokens:
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 50257, N_TOKENS, dtype=np.uint32)
    ends = np.cumsum(rng.integers(1, 4001, N_TOKENS // 1000))
    bounds = np.concatenate([[0], ends[ends < N_TOKENS], [N_TOKENS]])
    with Writer(root / "raw.zarr") as w:
        for a, b in itertools.pairwise(bounds.tolist()):
            w.write(tokens[a:b])
    return lmdata.open(root / "raw.zarr")


def throughput(root: Path, r: object) -> dict[str, tuple[float, float]]:
    n_rows = N_TOKENS // SEQ_LEN
    enc = r.span_encoded(0, n_rows * SEQ_LEN)
    enc.tofile(root / "tokens.u32")
    mm = np.memmap(root / "tokens.u32", dtype=np.uint32, mode="r").reshape(n_rows, SEQ_LEN)
    loader = lmdata.Loader(
        r, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0, rank=0, world_size=1
    )
    rows = [loader.indices(s)[1] for s in range(4096)]
    b0 = loader.batch(0)
    assert np.array_equal(b0["targets"], (mm[rows[0]] >> 1).astype(np.int32))

    def memmap_gather(i: int) -> int:
        np.asarray(mm[rows[i % 4096]])
        return BATCH

    def numpy_packed(i: int) -> int:
        """The same gather plus the packed expansion in plain numpy (the numpy floor)."""
        enc = mm[rows[i % 4096]]
        bits = (enc & 1).astype(bool)
        bits[:, 0] = True
        st = np.flatnonzero(bits)
        t = (enc >> 1).astype(np.int32)
        x = np.empty_like(t)
        x.reshape(-1)[1:] = t.reshape(-1)[:-1]
        x.reshape(-1)[st] = 0
        seg_len = np.diff(st, append=t.size)
        np.arange(t.size, dtype=np.int32) - np.repeat(st, seg_len)  # positions
        np.repeat(np.arange(len(st)) - np.searchsorted(st, st - st % SEQ_LEN) + 1, seg_len)
        return BATCH

    def lmdata_batch(mode: str) -> Callable[[int], int]:
        ld = lmdata.Loader(
            r, seq_len=SEQ_LEN, global_batch_size=BATCH, mode=mode, seed=0, rank=0, world_size=1
        )

        def f(i: int) -> int:
            ld.batch(i % 4096)  # packed: the rows the memmap gather reads for the same i
            return BATCH

        return f

    def iterated(
        depths: tuple[int, ...], step_s: float = 0.0, rounds: int = 15, seconds: float = 0.2
    ) -> list[float]:
        """Rows/s of ``for batch in loader``, for each prefetch depth, the consumer doing
        nothing else (``step_s`` 0) or sleeping ``step_s`` per batch (a training step on an
        accelerator: the CPU waits, the GIL is free), in alternating rounds (so load from
        other jobs hits them alike), measured apart from the per-call paths (prefetch threads
        running during their rounds would take their time): a fresh iterator per round,
        closed after it, which stops the threads."""
        got: list[list[float]] = [[] for _ in depths]
        for k in range(rounds):
            for j, depth in enumerate(depths):
                ld = lmdata.Loader(
                    r,
                    seq_len=SEQ_LEN,
                    global_batch_size=BATCH,
                    prefetch=depth,
                    rank=0,
                    world_size=1,
                    start_step=k * 1000,
                )
                it = iter(ld)
                n, t0 = 0, time.perf_counter()
                while (dt := time.perf_counter() - t0) < seconds:
                    next(it)
                    n += BATCH
                    if step_s:
                        time.sleep(step_s)
                it.close()
                got[j].append(n / dt)
        return [statistics.median(g) for g in got]

    res = _compare.interleaved(
        {
            "numpy memmap gather of the same rows (the practical limit)": memmap_gather,
            "numpy memmap gather + packed expansion in plain numpy": numpy_packed,
            "lmdata Loader.batch, packed + segment_ids + positions": lmdata_batch("packed"),
            "lmdata Loader.batch, eos windows": lmdata_batch("eos"),
            "lmdata Loader.batch, unpacked (one document per row)": lmdata_batch("unpacked"),
        }
    )
    names = ("no prefetch", "prefetch=4 (2 threads)")
    for name, v in zip(names, iterated((0, 4)), strict=True):
        res[f"lmdata `for batch in loader`, packed, {name}"] = (v, 0.0)
    # a 200 us step per batch (GIL released): prefetch computes the next batch meanwhile
    for name, v in zip(names, iterated((0, 4), STEP_S), strict=True):
        res[f"... with a {STEP_S * 1e6:.0f} us training step per batch, {name}"] = (v, 0.0)
    return res


def peer(tool: str, script: str, root: Path, r: object) -> dict[str, float] | str:
    """``script`` in ``tool``'s side venv on the first PEER_TOKENS tokens as documents: its
    JSON result, or why it could not run."""
    import envs

    env = envs.ensure(tool)
    if not env.ok:
        return f"not installable here ({env.error.splitlines()[-1] if env.error else 'pip'})"
    n = min(PEER_TOKENS, r.num_tokens)
    ids, bounds = root / "peer-ids.u32", root / "peer-bounds.npy"
    if not ids.exists():
        r.span(0, n).astype(np.uint32).tofile(ids)
        b = np.asarray(r.boundaries, dtype=np.int64)
        np.save(bounds, np.append(b[b < n], n))
    job = {"tokens": str(ids), "bounds": str(bounds), "seq_len": SEQ_LEN, "batch": BATCH}
    job |= {"seconds": 6, "work": str(root / f"work-{tool}")}
    proc = subprocess.run(
        [str(env.python), str(HERE / script), json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else '?'}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def streaming(root: Path, r: object) -> dict[str, float] | None:
    if not STREAMING_PY.exists():
        print("mosaicml-streaming venv (.venv/extra-streaming) missing: run make install")
        return None
    n_rows = min(N_TOKENS // SEQ_LEN, 16384)
    d = root / "rows.mds"
    with lmdata.writer(d, "mds", columns={"tokens": "ndarray:uint32"}) as w:
        for i in range(0, n_rows, 1024):
            block = r.span(i * SEQ_LEN, min(i + 1024, n_rows) * SEQ_LEN).reshape(-1, SEQ_LEN)
            for row in block:
                w.write({"tokens": row})
    job = {"local": str(d), "batch": BATCH, "seconds": 6}
    proc = subprocess.run(
        [str(STREAMING_PY), str(HERE / "_loader_streaming.py"), json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        print(f"streaming failed: {proc.stderr[-2000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- open time against dataset size ------------------------------------------------------

CHUNK = 4 << 20  # tokens per chunk (seqax's default)
SEQ_CHUNK = 1 << 27
CHILD = """
import json, sys, time
import lmdata

def hwm():  # peak resident set of this process (ru_maxrss would include the parent's)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))

import lmdata.formats.flat_tokens, lmdata.loader  # import lmdata is lazy: load what open uses
rss0 = hwm()
t0 = time.perf_counter()
r = lmdata.open(sys.argv[1])
loader = lmdata.Loader(r, seq_len=2048, global_batch_size=32, seed=0, rank=0, world_size=1)
t1 = time.perf_counter()
b = loader.batch(0)
t2 = time.perf_counter()
rss = hwm()
assert b["targets"].shape == (32, 2048) and b["segment_ids"].shape == (32, 2048)
print(json.dumps({"open": t1 - t0, "first": t2 - t1, "rss_mb": rss / 1024, "rss0_mb": rss0 / 1024}))
"""


def simulated_store(root: Path, n_tokens: int, real_chunk: Path | None) -> Path:
    """A flat-tokens split of ``n_tokens`` whose first batch's chunks exist (hard links to
    ``real_chunk``; with None, no token chunk exists: every token reads as the fill value)."""
    d = root / f"sim-{n_tokens}.zarr"
    split = d / "train"
    n_seqs = max(1, n_tokens // 1000)
    for sub, shape, chunk, dtype in (
        ("encoded_tokens", n_tokens, CHUNK, "<u4"),
        ("seq_starts", n_seqs + 1, SEQ_CHUNK, "<u8"),
    ):
        (split / sub).mkdir(parents=True)
        meta = {
            "chunks": [chunk],
            "compressor": None,
            "dtype": dtype,
            "fill_value": 0,
            "filters": None,
            "order": "C",
            "shape": [shape],
            "zarr_format": 2,
        }
        (split / sub / ".zarray").write_text(json.dumps(meta))
    for p in (d, split):
        (p / ".zgroup").write_text('{"zarr_format": 2}')
    (split / ".zattrs").write_text('{"max_token_id": 50256}')
    sparse = root / "sparse-seq-starts"
    if not sparse.exists():
        with open(sparse, "wb") as f:
            f.truncate(SEQ_CHUNK * 8)  # a hole: no disk used, never read in packed mode
    last = -(-(n_seqs + 1) // SEQ_CHUNK) - 1
    for k in range(last):
        os.link(sparse, split / "seq_starts" / str(k))
    with open(split / "seq_starts" / str(last), "wb") as f:  # a hole ending in n_tokens
        f.truncate(SEQ_CHUNK * 8)
        f.seek((n_seqs - last * SEQ_CHUNK) * 8)
        f.write(np.array([n_tokens], dtype="<u8").tobytes())
    if real_chunk is None:
        return d
    r = lmdata.open(d)
    rows = lmdata.Loader(r, seq_len=2048, global_batch_size=32, seed=0, rank=0, world_size=1)
    for k in sorted({int(x) * 2048 // CHUNK for x in rows.indices(0)[1]}):
        os.link(real_chunk, split / "encoded_tokens" / str(k))
    return d


def flat_store(root: Path, n_tokens: int) -> Path:
    """:func:`simulated_store` with its one real chunk made on first use."""
    real = root / "real-chunk"
    if not real.exists():
        rng = np.random.default_rng(2)
        enc = rng.integers(1, 50257, CHUNK, dtype=np.uint32) << np.uint32(1)
        enc[::1000] |= np.uint32(1)
        enc.tofile(real)
    return simulated_store(root, n_tokens, real)


def sparse_flat_store(root: Path, n_tokens: int) -> Path:
    """:func:`simulated_store` with no token chunk written (a store preallocated and never
    filled, or filled in parts): each read is of chunks never written."""
    return simulated_store(root, n_tokens, None)


def simulated_pbin(root: Path, n_tokens: int) -> Path:
    """A ``.pbin`` of ``n_tokens`` uint16 tokens (a hole: zeros, no disk used) in documents of
    1000 tokens, opened once here so that its index sidecar exists, as after a first run."""
    from lmdata.formats._span_index import dump_span_index

    n_docs = max(1, n_tokens // 1000)
    starts = np.arange(n_docs, dtype=np.int64) * 1000
    lens = np.diff(np.append(starts, n_tokens))
    p = root / f"sim-{n_tokens}.pbin"
    with open(p, "wb") as f:
        f.write(struct.pack("<QI", 2 * n_tokens, 2))
        f.seek(12 + 2 * n_tokens)
        f.write(dump_span_index(2 * starts, 2 * lens))
    r = lmdata.open(p)
    # the first batch's rows hold written tokens (in the page cache, as the flat-tokens
    # table's real chunk): faulting in pages of the hole would time the filesystem
    rows = lmdata.Loader(r, seq_len=2048, global_batch_size=32, seed=0, rank=0, world_size=1)
    rng = np.random.default_rng(3)
    with open(p, "r+b") as f:
        for row in rows.indices(0)[1].tolist():
            f.seek(12 + 2 * 2048 * row)
            f.write(rng.integers(1, 50257, 2048, dtype="<u2").tobytes())
    lmdata.open(p)  # the sidecar again (the .pbin's identity changed)
    return p


def open_times(root: Path, exps: tuple[int, ...], make: Callable) -> dict[int, dict[str, float]]:
    """Open + first batch of ``make(root, 10**exp)`` in a fresh process each."""
    out = {}
    for exp in exps:
        d = make(root, 10**exp)
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(d)], capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        out[exp] = json.loads(proc.stdout)
        if d.is_dir():
            shutil.rmtree(d)
        else:
            d.unlink()
        for side in root.glob(f"{d.name}.*"):
            side.unlink()
    return out


def print_open_times(title: str, times: dict[int, dict[str, float]]) -> None:
    print(f"\n{title}")
    print("| tokens | open s | first batch s | peak RSS MB (after imports) |")
    print("|---|---|---|---|")
    for exp, t in times.items():
        print(
            f"| 10^{exp} | {t['open']:.3f} | {t['first']:.3f} | "
            f"{t['rss_mb']:.0f} ({t['rss0_mb']:.0f}) |"
        )


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        r = make_store(root)
        load = os.getloadavg()[0]
        res = throughput(root, r)
        limit, limit_call = next(iter(res.values()))
        print(f"shuffled batches of {BATCH} x {SEQ_LEN} tokens, {N_TOKENS / 2**20:.0f} Mi tokens")
        print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after the in-process rows")
        print(f"| {'path':62} | rows/s | Mtok/s | vs memmap | per call p10 us | vs memmap |")
        print(f"|{'-' * 64}|---|---|---|---|---|")
        for name, (v, call) in res.items():
            per_call = f"{call * 1e6:,.0f} | {limit_call / call:.2f}" if call else "- | -"
            _compare.record("bench_loader", f"{name.strip()}: rows/s", v, unit="rows/s")
            if v != limit:
                _compare.record("bench_loader", f"{name.strip()}: vs memmap", v / limit)
            print(
                f"| {name:62} | {v:,.0f} | {v * SEQ_LEN / 1e6:,.0f} | {v / limit:.2f} | "
                f"{per_call} |"
            )
        st = streaming(root, r)
        if st:
            v = st["rows_per_s"]
            name = "mosaicml-streaming StreamingDataset, shuffled, stacked"
            print(f"| {name:62} | {v:,.0f} | {v * SEQ_LEN / 1e6:,.0f} | {v / limit:.2f} |")
            print(f"streaming: construct {st['open_s']:.2f} s, first sample {st['first_s']:.2f} s")
        for tool, script, name in (
            ("grain", "_loader_grain.py", "Grain 0.2.18 shuffled docs, ConcatThenSplit, batch"),
            ("litdata", "_loader_litdata.py", "LitData 0.2.76 TokensLoader, shuffled"),
        ):
            got = peer(tool, script, root, r)
            if isinstance(got, str):
                print(f"| {name:62} | {got} | | |")
                continue
            v = got["rows_per_s"]
            print(f"| {name:62} | {v:,.0f} | {v * SEQ_LEN / 1e6:,.0f} | {v / limit:.2f} |")
            print(f"{tool}: construct {got['open_s']:.2f} s, first batch {got['first_s']:.2f} s")
        print_open_times(
            "flat-tokens: open + first batch against dataset size (fresh process each, warm cache)",
            open_times(root, (6, 8, 10, 12), flat_store),
        )
        print_open_times(
            "flat-tokens, no token chunk written (all fill values): open + first batch",
            open_times(root, (12,), sparse_flat_store),
        )
        print_open_times(
            ".pbin (documents of 1000 tokens, index sidecar built): open + first batch",
            open_times(root, PBIN_EXPS, simulated_pbin),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
