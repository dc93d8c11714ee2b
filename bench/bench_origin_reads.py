"""Reads and tokenizing, lmdata against the origin tools or their documented algorithm.

Rows (interleaved pairs via bench/_compare.py, outputs checked equal before a time counts):
MDS random `r[i]` and iteration vs mosaicml-streaming 0.13.0 (its own venv, one dataset kept
open in a server process that takes each run as a line on its stdin, so no run's input goes
on a command line; only the read loop is timed; bench_mds.py has the fuller MDS table: text
and zstd, take, writing); Atlas sequential `ds[i]`, random `ds[i]`, `take` and writing vs
torch-atlas-ds's read and write paths re-implemented from its documentation (not on PyPI);
flat-tokens random packed rows vs a numpy memmap gather (the practical limit), and random and
sequential packed rows vs zarr-python 2 and 3 themselves (each in its side venv, reading the
store lmdata wrote, uncompressed and seqax's Blosc); tokenize at 1 and 2 workers vs the fastest
bare batch call of the same tokenizer (`encode_batch_fast`; plain `encode_batch` for reference).
LMDATA_BENCH_PARTS=atlas,flat_tokens runs only those row sets.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _compare as C
import envs

import lmdata

HERE = Path(__file__).resolve().parent
N_MDS = 10_000 if C.QUICK else 100_000
N_ATLAS = 40_000 if C.QUICK else 200_000
N_RANDOM = 5_000 if C.QUICK else 20_000
# flat-tokens rows read by zarr-python: random batches per run for both sides (zarr reads a
# batch's rows from whole 16 MiB chunks, ~0.1-0.3 s a batch), and seqax's read block
ZARR_BATCHES = 4 if C.QUICK else 10
SEQ_BLOCK = 512  # rows of 2048 a sequential read: seqax's (1 << 20) // seq_len


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the module runs
    spec.loader.exec_module(mod)
    return mod


def digest(samples) -> str:
    """The same hash _streaming_worker.py computes (keys, dtypes, raw bytes, reprs)."""
    h = hashlib.sha256()
    for s in samples:
        for k in sorted(s):
            v = s[k]
            if isinstance(v, np.ndarray):
                h.update(k.encode() + v.dtype.str.encode() + v.tobytes())
            else:
                h.update(k.encode() + repr(v).encode())
    return h.hexdigest()


class Worker:
    """A bench worker script kept running in an origin tool's venv (it opens its dataset
    once), timing one run per request line on its stdin: streaming's StreamingDataset
    (_streaming_worker.py), zarr-python's array (_zarr_worker.py)."""

    def __init__(self, python: Path, script: str, job: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(HERE / script), json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready = self._line()  # {"ready": ...}

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the bench worker exited")
            if line.startswith("{"):
                return json.loads(line)  # type: ignore[no-any-return]

    def run(self, job: dict[str, Any]) -> tuple[float, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        got = self._line()
        return got["seconds"], got["digest"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Streaming(Worker):
    """One StreamingDataset, open in its venv, timing the runs it is asked for."""

    def __init__(self, python: Path, local: Path) -> None:
        job = {"op": "serve", "local": str(local), "batch_size": 256}
        super().__init__(python, "_streaming_worker.py", job)


def mds(work: Path) -> None:
    from tests.formats.mds_samples import columns, samples

    env = envs.ensure("streaming")
    data = samples("benchtokens", N_MDS)
    out = work / "mds"
    with lmdata.writer(out, "mds", columns=columns("benchtokens")) as w:
        for s in data:
            w.write(s)
    idx = np.random.default_rng(0).integers(0, N_MDS, N_RANDOM).tolist()

    r = lmdata.open(out)
    list(r)  # warm, as the streaming server is

    def ours(op: str):
        def go():
            t = time.perf_counter()
            got = [r[i] for i in idx] if op == "random" else list(r)
            return time.perf_counter() - t, digest(got)

        return go

    # one StreamingDataset kept open in its venv; each run is one request line on its stdin
    server = Streaming(env.python, out) if env.ok else None

    def theirs(op: str):
        def go():
            assert server is not None
            return server.run({"op": op, "idx": idx})

        return go

    try:
        why = f"streaming not installed: {env.error[-160:]}"
        C.compare(
            "mds",
            f"random r[i], {N_RANDOM:,} reads",
            ours("random"),
            theirs("random") if env.ok else None,
            why,
        )
        C.compare(
            "mds", "iteration, all samples", ours("iter"), theirs("iter") if env.ok else None, why
        )
    finally:
        if server is not None:
            server.close()
    C.print_table(
        "mds",
        "MDS reads (read loop only; opening excluded)",
        "mosaicml-streaming 0.13.0 StreamingDataset",
        "origin tool itself" if env.ok else "NOT INSTALLED",
        f"{N_MDS:,} samples of 128-383 uint32 tokens, uncompressed; {N_RANDOM:,} random reads",
    )


def atlas(work: Path) -> None:
    ba = _load("bench_atlas")
    ex = ba.make_examples(N_ATLAS)
    out = work / "atlas"

    def write(origin: bool, workers: int):
        def go():
            dest = work / ("w-origin" if origin else "w-lmdata")
            shutil.rmtree(dest, ignore_errors=True)
            t = time.perf_counter()
            if origin:
                w = ba.OriginWriter(dest, 50_000, 32)
                for e in ex:
                    w.write(e)
                w.close()
            else:
                opts = {"shard_size": 50_000, "block_size": 32, "compression_strategy": 2}
                with lmdata.writer(dest, "atlas", workers=workers, **opts) as w:
                    for e in ex:
                        w.write(e)
            dt = time.perf_counter() - t
            # Equal content as the origin's reader sees it (lmdata's dictionary trains on an
            # 8 MiB sample of shard 0, the origin's on all of it, so the bytes differ).
            o = ba.OriginStyle(dest)
            got = hashlib.sha256(repr([o[i] for i in range(len(ex))]).encode()).hexdigest()
            o.close()
            return dt, got

        return go

    with lmdata.writer(out, "atlas", shard_size=50_000, block_size=32, compression_strategy=2) as w:
        for e in ex:
            w.write(e)
    idx = np.random.default_rng(1).integers(0, N_ATLAS, N_RANDOM).tolist()
    take_idx = np.random.default_rng(2).integers(0, N_ATLAS, 256)

    def run(origin: bool, op: str, cache: int = 64 << 20):
        def go():
            # C.compare collects before each run: every run starts from the same collector
            # state (the "keep" row swung 1.10x -> 0.91x by the rows run before without it)
            ds = ba.OriginStyle(out) if origin else lmdata.open(out, cache_bytes=cache)
            t = time.perf_counter()
            if op in ("loop", "keep"):
                # A training loop uses each example and drops it; the ids of all and every 97th
                # example whole check the outputs. "keep" holds every example in a list, where
                # the cyclic collector's walks over them dominate on both sides.
                got, ids = [], []
                for i in range(N_ATLAS):
                    x = ds[i]
                    ids.append(x["id"])
                    if op == "keep" or i % 97 == 0:
                        got.append(x)
                got.append(ids)
            elif op == "rand":
                got = [ds[i] for i in idx]
            else:
                got = [
                    list(ds.take(take_idx)) if not origin else [ds[int(i)] for i in take_idx]
                    for _ in range(20)
                ]
            dt = time.perf_counter() - t
            if origin:
                ds.close()
            digest = hashlib.sha256(repr(got[::97] if op == "keep" else got).encode())
            return dt, digest.hexdigest()

        return go

    for op, name, cache in (
        ("loop", f"sequential ds[i], all {N_ATLAS:,} (training loop)", 64 << 20),
        ("loop", "  the same, cache_bytes=1 MiB", 1 << 20),
        ("keep", f"sequential ds[i], all {N_ATLAS:,} kept in a list", 64 << 20),
        ("rand", f"random ds[i], {N_RANDOM:,}", 64 << 20),
        ("rand", "  the same, cache_bytes=8 MiB", 8 << 20),
        ("take", "take(256 random) x 20", 64 << 20),
        ("take", "  the same take, cache_bytes=8 MiB", 8 << 20),
    ):
        C.compare("atlas", name, run(False, op, cache), run(True, op, cache))
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    # what the caches hold: pickled blocks of 32 examples (about the examples pickled one by one)
    pickled = sum(len(pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL)) for e in ex)
    del ex[N_ATLAS // 2 :]  # writing: the first half, so a pair takes seconds, not a minute
    C.compare("atlas", f"write {N_ATLAS // 2:,}, 1 thread", write(False, 1), write(True, 1))
    C.compare("atlas", f"write {N_ATLAS // 2:,}, 2 threads", write(False, 2), write(True, 1))
    C.print_table(
        "atlas",
        "Atlas reads and writes (default 64 MiB cache unless given; fresh reader per run)",
        "torch-atlas-ds's documented read and write paths (bench_atlas.OriginStyle/OriginWriter)",
        "RE-IMPLEMENTATION: torch-atlas-ds is not on PyPI",
        f"{N_ATLAS:,} dict examples ({size:,} bytes on disk, about {pickled:,} pickled, what "
        f"the caches hold; {N_ATLAS // 2:,} written), "
        "shards of 50,000, block 32, "
        "shared-dictionary zstd; writes: equal examples read back by the origin's algorithm",
    )


def rows_digest(got) -> str:
    """sha256 over returned row arrays' bytes in order (as _zarr_worker.py hashes zarr's)."""
    return hashlib.sha256(b"".join(np.asarray(g).tobytes() for g in got)).hexdigest()


def flat_tokens(work: Path) -> None:
    from lmdata.formats.flat_tokens import Writer

    rng = np.random.default_rng(1)
    n_tokens = 20_000_000 if C.QUICK else 100_000_000
    tokens = rng.integers(1, 50257, n_tokens, dtype=np.uint32)
    stores = {"uncompressed": work / "ft.zarr", "seqax blosc": work / "ft-blosc.zarr"}
    for (_, path), comp in zip(stores.items(), (None, "blosc"), strict=True):
        with Writer(path, compression=comp) as w:
            for a in range(0, n_tokens, 4000):
                w.write(tokens[a : a + 4000])
    del tokens
    path = stores["uncompressed"]
    r = lmdata.open(path)
    seq, batch = 2048, 32
    n_rows = n_tokens // seq
    enc = r.span_encoded(0, n_tokens)
    mm_path = work / "tokens.u32"
    enc.tofile(mm_path)
    del enc
    mm = np.memmap(mm_path, dtype=np.uint32, mode="r")[: n_rows * seq].reshape(n_rows, seq)
    batches = [np.random.default_rng(k).integers(0, n_rows, batch) for k in range(2000)]

    def ours():
        t = time.perf_counter()
        got = [r.packed_rows(b, seq) for b in batches]
        return time.perf_counter() - t, rows_digest(got)

    def limit():
        t = time.perf_counter()
        got = [np.asarray(mm[b]) for b in batches]
        return time.perf_counter() - t, rows_digest(got)

    C.compare("flat-tokens", "random packed rows (2,000 x 32 rows of 2048)", ours, limit)
    versions = zarr_rows(work, stores, batches[:ZARR_BATCHES], n_rows, seq)
    C.print_table(
        "flat-tokens",
        "flat-tokens packed rows (row r = tokens r*2048:(r+1)*2048, across documents, no padding)",
        "first row: numpy memmap fancy gather; zarr-python rows: zarr-python itself reading the "
        "store lmdata wrote (one oindex call per batch, its fastest; seqax reads through it)",
        "first row PRACTICAL LIMIT; zarr-python rows ORIGIN LIBRARY ITSELF",
        f"{n_tokens:,} uint32 tokens, chunks of 4 Mi tokens, uncompressed and seqax's Blosc "
        f"(lz4 5 bit-shuffle); zarr rows: {ZARR_BATCHES} random batches of {batch} for both "
        f"sides, sequential = all {n_rows:,} rows in reads of {SEQ_BLOCK} (seqax's read block); "
        f"lmdata: a fresh reader per run; {versions}",
    )


def zarr_rows(
    work: Path, stores: dict[str, Path], batches: list[np.ndarray], n_rows: int, seq: int
) -> str:
    """The zarr-python 2 and 3 rows: each in its side venv, a worker holding the store open,
    interleaved with lmdata reading the same rows of the same store; returns the versions."""
    np.save(work / "zarr-batches.npy", np.stack(batches))

    def ours(path: Path, op: str):
        def go():
            rd = lmdata.open(path)  # fresh: nothing an earlier run decoded is kept
            t = time.perf_counter()
            if op == "random":
                got = [rd.packed_rows(b, seq) for b in batches]
            else:
                got = [
                    rd.packed_rows(np.arange(a, min(a + SEQ_BLOCK, n_rows)), seq)
                    for a in range(0, n_rows, SEQ_BLOCK)
                ]
            dt = time.perf_counter() - t
            rd.close()
            return dt, rows_digest(got)

        return go

    versions = []
    for tool, label in (("zarr2", "zarr-python 2"), ("zarr3", "zarr-python 3")):
        env = envs.ensure(tool)
        why = f"{label} not installed: {env.error[-160:]}"
        if not env.ok:
            print(f"flat-tokens: {label} rows SKIPPED (lmdata side only): {why}", flush=True)
        for kind, path in stores.items():
            job = {"store": str(path), "batches": str(work / "zarr-batches.npy"), "seq": seq}
            worker = Worker(env.python, "_zarr_worker.py", job) if env.ok else None
            if worker is not None and f"{label} " not in " ".join(versions):
                versions.append(f"{label} {worker.ready['ready']}")

            def theirs(req: dict[str, Any], w: Worker | None = worker):
                assert w is not None
                return lambda: w.run(req)

            try:
                for op, req in (
                    ("random", {"op": "random", "n": len(batches)}),
                    ("sequential", {"op": "seq", "rows": n_rows, "block": SEQ_BLOCK}),
                ):
                    C.compare(
                        "flat-tokens",
                        f"{label}: {op}, {kind}",
                        ours(path, op),
                        theirs(req) if worker is not None else None,
                        why,
                    )
            finally:
                if worker is not None:
                    worker.close()
    return "; ".join(versions) or "zarr-python not installed"


def tokenize(work: Path) -> None:
    bt = _load("bench_tokenize")
    bt.N_DOCS = 1_000 if C.QUICK else 10_000
    src = work / "docs.jsonl"
    bt.make_docs(src)

    def ours(workers: int):
        def go():
            # one worker runs in the process: its tokenizer gets one thread, as the bare one
            threads = 1 if workers == 1 else None
            s, n = bt.pipeline(src, work / f"w{workers}", workers, threads=threads)
            return s, n

        return go

    def bare(threads: int, method: str):
        return lambda: bt.bare(src, threads, method)

    fast = bt.fastest_bare()
    for n in (1, 2):
        C.compare("tokenize", f"{n} worker(s) vs {fast} on {n} thread(s)", ours(n), bare(n, fast))
    if fast != "encode_batch":  # the call (with offsets) the issue names as the baseline
        for n in (1, 2):
            C.compare(
                "tokenize",
                f"  {n} worker(s) vs encode_batch on {n} thread(s) (offsets; reference)",
                ours(n),
                bare(n, "encode_batch"),
                pairs=3,  # for reference only: a full run's section stays under five minutes
            )
    C.print_table(
        "tokenize",
        "tokenize JSONL -> flat-tokens (job time, start-up excluded)",
        f"bare tokenizers {fast} (the fastest bare call; lmdata calls it too), texts in memory",
        "PRACTICAL LIMIT (same tokenizer, same cores)",
        f"{bt.N_DOCS:,} docs of 1-3k chars, bpe5k (local tokenizer.json); outputs = token counts",
    )


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="lmdata-bench-reads-"))
    try:
        only = os.environ.get("LMDATA_BENCH_PARTS")  # e.g. "tokenize,mds": those row sets
        for part in (mds, atlas, flat_tokens, tokenize):
            if only and part.__name__ not in only.split(","):
                continue
            (work / part.__name__).mkdir()
            try:
                part(work / part.__name__)
            except Exception as exc:  # one broken row set must not stop the others
                print(f"\n{part.__name__}: FAILED: {exc!r}"[:600])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
    C.save_and_flag()
