"""Modalities formats: raw index build, .pbin writing, random document reads.

Peers, measured in the same run on the same files:
- practical limit: a bare numpy memmap / mmap with the offsets already in arrays;
- origin algorithm: modalities 0.5.0's approach re-implemented from the research notes
  (readline + json.loads for the index; pickle.load + per-item memmap slicing for reads), since
  modalities itself (torch, transformers) is not installed here.
"""

from __future__ import annotations

import json
import mmap
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmdata.formats import modalities, modalities_jsonl
from lmdata.formats.modalities.views import ContinuousView

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _compare import QUICK, record

N_DOCS = 5_000 if QUICK else 20_000
N_READS = 5_000 if QUICK else 20_000
BATCH = 256
REPEATS = 3


def best(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def make_jsonl(path: Path) -> None:
    rng = np.random.default_rng(4)
    words = ["lorem", "ipsum", "dolor", "sit", "amet", "café", "数据", "naïve", "\u2028", "x"]
    with open(path, "wb") as f:
        for i in range(N_DOCS):
            n = int(rng.integers(150, 450))
            text = " ".join(words[j] for j in rng.integers(0, len(words), n))
            f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False).encode() + b"\n")


def origin_index(path: Path) -> list[tuple[int, int]]:
    """create_raw_index's algorithm: readline, strip the newline, json.loads every line."""
    index = []
    with open(path, "rb") as f:
        while True:
            cursor = f.tell()
            line = f.readline()
            if not line:
                break
            if line.endswith(b"\n"):
                line = line[:-1]
            json.loads(line)
            index.append((cursor, len(line)))
    return index


def bare_scan(path: Path) -> int:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return int(np.count_nonzero(np.frombuffer(mm, np.uint8) == 10))


def table(title: str, rows: list[tuple[str, float, str]], unit: str, base: float) -> None:
    """Print one table and record each row's rate and its fraction of the limit (the first
    row), for the next run's comparison."""
    print(f"\n{title}")
    print(f"  {'':44s} {unit:>14s}  {'vs limit':>8s}")
    what = title.split(":")[0].split(",")[0]  # the same name whatever the sizes
    for name, value, note in rows:
        record("bench_modalities", f"{what} / {name}: {unit}", value, unit=unit)
        if value != base:
            record("bench_modalities", f"{what} / {name}: vs limit", value / base)
        print(f"  {name:44s} {value:14,.1f}  {value / base:7.2f}x  {note}")


def bench_index(tmp: Path) -> None:
    src = tmp / "docs.jsonl"
    make_jsonl(src)
    mb = src.stat().st_size / 1e6
    t_lm = best(lambda: modalities_jsonl.build_index(src, overwrite=True))
    t_or = best(lambda: origin_index(src))
    t_bare = best(lambda: bare_scan(src))
    assert pickle.loads((tmp / "docs.idx").read_bytes()) == origin_index(src)
    table(
        f"raw index build: {N_DOCS:,} JSONL lines, {mb:.1f} MB (docs/s)",
        [
            ("bare newline scan (limit; no JSON check)", N_DOCS / t_bare, ""),
            ("lmdata index (orjson check per line)", N_DOCS / t_lm, f"{mb / t_lm:.0f} MB/s"),
            ("origin algorithm (readline + json.loads)", N_DOCS / t_or, f"{mb / t_or:.0f} MB/s"),
        ],
        "docs/s",
        N_DOCS / t_bare,
    )

    r = modalities_jsonl.open(src)
    offs, lens = r.offsets, r.lengths
    idx = np.random.default_rng(1).integers(0, N_DOCS, N_READS)

    def lm_single() -> None:
        for i in idx.tolist():
            r[i]

    def lm_take() -> None:
        for lo in range(0, N_READS, BATCH):
            r.take(idx[lo : lo + BATCH])

    f = open(src, "rb")
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    o_l, n_l = offs.tolist(), lens.tolist()

    def bare() -> None:
        for i in idx.tolist():
            orjson.loads(mm[o_l[i] : o_l[i] + n_l[i]])

    origin_idx = origin_index(src)

    def origin() -> None:  # LargeFileLinesReader: mmap slice, decode, then json.loads
        for i in idx.tolist():
            o, n = origin_idx[i]
            json.loads(mm[o : o + n].decode("utf-8"))

    rows = [
        ("bare mmap + orjson (limit)", N_READS / best(bare), ""),
        ("lmdata r[i]", N_READS / best(lm_single), ""),
        (f"lmdata take (batches of {BATCH})", N_READS / best(lm_take), ""),
        ("origin algorithm (decode + json.loads)", N_READS / best(origin), ""),
    ]
    table(f"random JSONL document reads, {N_READS:,} (docs/s)", rows, "docs/s", rows[0][1])
    mm.close()
    f.close()


def bench_pbin(tmp: Path) -> None:
    rng = np.random.default_rng(2)
    lengths = rng.integers(200, 3000, N_DOCS)
    flat = rng.integers(1, 5000, int(lengths.sum())).astype(np.uint16)
    cuts = np.cumsum(lengths)[:-1]
    docs = np.split(flat, cuts)
    ntok = int(lengths.sum()) + N_DOCS
    out = tmp / "t.pbin"

    def lm_write() -> None:
        with modalities.Writer(out, vocab_size=5000, eod_id=0, overwrite=True) as w:
            for d in docs:
                w.write(d)

    def bare_write() -> None:
        eod = np.zeros(1, np.uint16)
        with open(tmp / "bare.bin", "wb") as f:
            for d in docs:
                f.write(d.tobytes())
                f.write(eod.tobytes())

    t_w, t_b = best(lm_write), best(bare_write)
    table(
        f"writing .pbin: {N_DOCS:,} documents, {ntok / 1e6:.1f} M tokens (Mtok/s)",
        [
            ("bare file.write per document (limit)", ntok / t_b / 1e6, ""),
            (
                "lmdata Writer (checks ids, index, atomic)",
                ntok / t_w / 1e6,
                f"{N_DOCS / t_w:,.0f} docs/s",
            ),
        ],
        "Mtok/s",
        ntok / t_b / 1e6,
    )

    r = modalities.open(out)
    idx = np.random.default_rng(3).integers(0, N_DOCS, N_READS)
    starts, stops = r.doc_starts, r.doc_starts + r.doc_lengths
    bare_mm = np.memmap(out, dtype="<u2", mode="r", offset=12, shape=(r.header.num_tokens,))
    s_l, e_l = starts.tolist(), stops.tolist()

    def bare() -> None:
        for i in idx.tolist():
            np.array(bare_mm[s_l[i] : e_l[i]])

    def lm_single() -> None:
        for i in idx.tolist():
            r[i]

    def lm_take() -> None:
        for lo in range(0, N_READS, BATCH):
            r.take(idx[lo : lo + BATCH])

    def origin() -> None:  # PackedMemMapDatasetBase: pickle.load index, uint8 memmap, astype
        raw = out.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        index = pickle.loads(raw[12 + n :])
        data = np.memmap(out, mode="r", offset=12, shape=(n,))
        for i in idx.tolist():
            o, ln = index[i]
            np.frombuffer(data[o : o + ln], dtype="<u2").astype(np.int32)

    rows = [
        ("bare np.memmap slice + copy (limit)", N_READS / best(bare), ""),
        ("lmdata r[i]", N_READS / best(lm_single), ""),
        (f"lmdata take (batches of {BATCH})", N_READS / best(lm_take), ""),
        ("origin algorithm (Base dataset, incl. open)", N_READS / best(origin), ""),
    ]
    table(f"random .pbin document reads, {N_READS:,} (docs/s)", rows, "docs/s", rows[0][1])

    seq = 2048
    view = ContinuousView(r, seq)
    bidx = np.random.default_rng(5).integers(0, len(view), (40, 64))
    tok = r.tokens

    def bare_batches() -> None:
        for b in bidx:
            tok[(b * seq)[:, None] + np.arange(seq + 1)]

    def view_batches() -> None:
        for b in bidx:
            view.batch(b)

    nt = bidx.size * (seq + 1) / 1e6
    rows = [
        ("bare memmap fancy-index gather (limit)", nt / best(bare_batches), ""),
        ("lmdata ContinuousView.batch", nt / best(view_batches), ""),
    ]
    table(f"continuous samples, seq_len {seq}, batches of 64 (Mtok/s)", rows, "Mtok/s", rows[0][1])


def main() -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("LMDATA_BENCH_DIR")) as d:
        bench_index(Path(d))
        bench_pbin(Path(d))


if __name__ == "__main__":
    main()
