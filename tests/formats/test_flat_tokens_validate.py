"""flat-tokens validate on chunk files of the wrong size: an uncompressed chunk cut short
below its full size (even where only zarr's padding is lost) is reported with its file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import lmdata

SEQS = [np.arange(1, 1 + (i % 6)) for i in range(12)]  # 30 tokens: chunks of 16 and 14


def _written(tmp_path: Path) -> Path:
    p = tmp_path / "t.zarr"
    with lmdata.writer(p, "flat-tokens", chunk_tokens=16, manifest=False) as w:
        for s in SEQS:
            w.write(s)
    return p


def test_a_last_chunk_cut_to_its_items_is_reported(tmp_path: Path) -> None:
    p = _written(tmp_path)
    n = sum(len(s) for s in SEQS)
    last = (n - 1) // 16
    chunk = p / "train" / "encoded_tokens" / str(last)
    assert chunk.stat().st_size == 16 * 4  # the writer pads it, as zarr does
    os.truncate(chunk, (n - 16 * last) * 4)  # only the padding goes
    problems = lmdata.validate(p)
    assert len(problems) == 1, problems
    assert f"chunk {last} ({chunk})" in problems[0] and "cut short" in problems[0]
    assert [x.tolist() for x in lmdata.open(p)] == [s.tolist() for s in SEQS]  # still read


def test_a_chunk_cut_below_its_items_is_reported_once(tmp_path: Path) -> None:
    p = _written(tmp_path)
    chunk = p / "train" / "encoded_tokens" / "0"
    os.truncate(chunk, 10)
    problems = lmdata.validate(p)
    assert len(problems) == 1 and "chunk 0" in problems[0] and "has 10 bytes" in problems[0]
    starts = p / "validation" / "seq_starts" / "0"
    with open(starts, "ab") as f:
        f.write(b"\0" * 8)  # a longer file: zarr-python refuses it as well
    problems = lmdata.validate(p)
    assert any("validation/seq_starts: chunk 0" in m and "something else" in m for m in problems)


def test_compressed_chunks_are_not_held_to_the_raw_size(tmp_path: Path) -> None:
    p = tmp_path / "c.zarr"
    with lmdata.writer(p, "flat-tokens", chunk_tokens=16, compression="zstd", manifest=False) as w:
        for s in SEQS:
            w.write(s)
    assert lmdata.validate(p) == []
