"""Opening a 10^12-token flat-tokens dataset and reading its first batches costs the same as
for a small one: every store access is recorded, and the index (``seq_starts``) is touched only
by the two end checks of open, never by packed or eos reads."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.storage.local import LocalStore

TOKENS = 10**12
SEQS = 10**9  # documents of 1000 tokens on average
CHUNK = 1 << 14  # tokens per chunk of the simulated store (64 KiB files)
SEQ_CHUNK = 1 << 27  # seq_starts entries per chunk (1 GiB files, sparse)


def _array(d: Path, shape: int, chunk: int, dtype: str) -> None:
    d.mkdir(parents=True)
    meta = {"chunks": [chunk], "compressor": None, "dtype": dtype, "fill_value": 0}
    meta |= {"filters": None, "order": "C", "shape": [shape], "zarr_format": 2}
    (d / ".zarray").write_text(json.dumps(meta))


def simulated(root: Path, chunks: set[int]) -> Path:
    """Metadata of a 10^12-token split; ``seq_starts`` as sparse files (holes read as zeros,
    the last entry the token count); only token ``chunks`` exist, holding random values."""
    split = root / "big.zarr" / "train"
    _array(split / "encoded_tokens", TOKENS, CHUNK, "<u4")
    _array(split / "seq_starts", SEQS + 1, SEQ_CHUNK, "<u8")
    for p in (root / "big.zarr", split):
        (p / ".zgroup").write_text('{"zarr_format": 2}')
    (split / ".zattrs").write_text('{"max_token_id": 50256}')
    last = SEQS // SEQ_CHUNK
    for k in range(last + 1):
        with open(split / "seq_starts" / str(k), "wb") as f:
            f.truncate(SEQ_CHUNK * 8)
            if k == last:
                f.seek((SEQS - last * SEQ_CHUNK) * 8)
                f.write(np.array([TOKENS], dtype="<u8").tobytes())
    rng = np.random.default_rng(0)
    for k in chunks:
        enc = rng.integers(2, 100_000, CHUNK, dtype=np.uint32)
        enc.tofile(split / "encoded_tokens" / str(k))
    return root / "big.zarr"


class Recorder:
    """Every key the local store reads, maps or lists, with the bytes read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, int]] = []
        for name in ("read", "read_range", "read_ranges", "mmap", "list"):
            monkeypatch.setattr(LocalStore, name, self._wrap(name, getattr(LocalStore, name)))

    def _wrap(self, name, fn):
        def wrapped(store, key, *args, **kwargs):
            out = fn(store, key, *args, **kwargs)
            n = sum(map(len, out)) if name == "read_ranges" else len(out)
            self.calls.append((name, key, 0 if name in ("mmap", "list") else n))
            return out

        return wrapped


@pytest.mark.parametrize("mode", ["packed", "eos"])
def test_a_huge_dataset_opens_and_serves_without_reading_its_index(tmp_path, monkeypatch, mode):
    kw = {"seq_len": 2048, "global_batch_size": 8, "mode": mode, "seed": 3}
    kw |= {"rank": 0, "world_size": 1}
    plan = simulated(tmp_path / "plan", set())
    rows = lmdata.Loader(lmdata.open(plan), **kw)
    probe = [rows.indices(s)[1] for s in range(3)]
    need = {int(r) * 2048 // CHUNK for rr in probe for r in rr} | {
        (int(r) * 2048 + 2048) // CHUNK for rr in probe for r in rr
    }
    path = simulated(tmp_path / "real", need)
    rec = Recorder(monkeypatch)
    tracemalloc.start()
    try:
        reader = lmdata.open(path)
        loader = lmdata.Loader(reader, **kw)
        opened = len(rec.calls)
        batches = [loader.batch(s) for s in range(3)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert loader.num_rows == (TOKENS - (mode == "eos")) // 2048
    # nothing that grows with the dataset: a few MB, where one index entry per document
    # would be 8 GB
    assert peak < 16 << 20, peak
    assert reader._boundaries is None
    index = [(op, Path(k).name) for op, k, _ in rec.calls if "seq_starts" in k]
    last = str(SEQS // SEQ_CHUNK)
    # open: metadata, the first and last entries (their chunk maps), listings for holes;
    # the batches: nothing
    assert {name for op, name in index if op == "mmap"} <= {"0", last}
    assert len(index) <= 8, index
    assert not [c for c in rec.calls[opened:] if "seq_starts" in c[1]]
    token_maps = {int(Path(k).name) for op, k, _ in rec.calls if op == "mmap" and "encoded" in k}
    assert token_maps <= need
    assert sum(n for _, _, n in rec.calls) < 64 << 10  # JSON metadata only
    # and the rows are the stored tokens
    for s, b in enumerate(batches):
        for i, r in enumerate(probe[s].tolist()):
            span = reader.span(r * 2048, r * 2048 + 2048 + (mode == "eos"))
            assert np.array_equal(b["targets"][i], span[1:] if mode == "eos" else span)


def test_bestfit_opens_and_serves_a_huge_dataset_from_a_few_index_reads(tmp_path, monkeypatch):
    """The bestfit layout is sampled and its blocks packed from searches and short runs of the
    sequence index: a 10^12-token dataset opens and serves its first batches in bounded
    memory, without loading the index (8 GB), and its rows are the stored tokens."""
    kw = {"seq_len": 2048, "global_batch_size": 8, "mode": "bestfit", "seed": 3}
    kw |= {"rank": 0, "world_size": 1}
    plan = lmdata.Loader(lmdata.open(simulated(tmp_path / "plan", set())), **kw)
    need = set()
    for s in range(3):
        lin = plan.explain(s)
        for start in (lin.offset).tolist():  # one document: offsets are token positions
            first = min(start, TOKENS - 2048)
            need |= {first // CHUNK, (first + 2047) // CHUNK}
    path = simulated(tmp_path / "real", need)
    rec = Recorder(monkeypatch)
    tracemalloc.start()
    try:
        reader = lmdata.open(path)
        loader = lmdata.Loader(reader, **kw)
        batches = [loader.batch(s) for s in range(3)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert loader.layout()[0]["padding"] < 0.01
    assert peak < 16 << 20, peak
    assert reader._boundaries is None
    read = sum(n for op, k, n in rec.calls if "seq_starts" in k)
    assert read < 1 << 20, read  # the index is mapped (sparse), never read whole
    for s, b in enumerate(batches):
        lin = loader.explain(s)
        for i, row in enumerate(lin):
            at = 0
            for seg in row:
                span = reader.span(seg.offset, seg.offset + seg.length)
                assert np.array_equal(b["targets"][i, at : at + seg.length], span)
                at += seg.length
