"""The fast packed/eos paths: in-place gathers and one-block outputs give the generic results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.loader import Loader
from lmdata.loader.packing import packed_buffers, packed_from_encoded
from tests.loader.conftest import Plain, random_seqs, write_flat

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), length=st.integers(1, 30), dtype=st.sampled_from(["i4", "i8"]))
def test_block_arrays_are_disjoint_and_typed(rows, length, dtype):
    out = packed_buffers(rows, length, np.dtype(dtype))
    for k, a in enumerate(out.values()):
        a[...] = k + 1
    for k, (key, a) in enumerate(out.items()):
        assert a.shape == (rows, length) and (a == k + 1).all()
        assert a.dtype == (np.dtype(dtype) if key in ("inputs", "targets") else np.int32)


@pytest.mark.parametrize("mode", ["packed", "eos"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_fast_path_equals_generic_reader(tmp_path: Path, mode, dtype):
    seqs = random_seqs(5, 60)
    fast = write_flat(tmp_path / "x.zarr", seqs, chunk_tokens=16)
    opts = dict(seq_len=7, global_batch_size=6, mode=mode, dtype=dtype, seed=2, bos_id=3)
    a, b = Loader(fast, **opts), Loader(Plain(seqs), **opts)
    kept = [a.batch(s) for s in range(12)]  # batches handed out are never overwritten later
    for s in range(12):
        want = b.batch(s)
        assert set(kept[s]) == set(want)
        for k, v in want.items():
            assert kept[s][k].dtype == v.dtype and np.array_equal(kept[s][k], v), (s, k)


def test_encoded_windows_into_out(tmp_path: Path):
    r = write_flat(tmp_path / "x.zarr", random_seqs(1, 40), chunk_tokens=16)
    starts = np.array([0, 5, 14, 30])
    out = np.zeros((4, 9), dtype=np.uint32)
    got = r.encoded_windows(starts, 9, out=out)
    assert got is out
    assert np.array_equal(out, np.stack([r.span_encoded(s, s + 9) for s in starts]))
    with pytest.raises(ValueError, match="C-contiguous"):
        r.encoded_windows(starts, 9, out=np.zeros((4, 8), dtype=np.uint32))


def test_packed_from_encoded_int64_matches_int32():
    enc = np.array([[3, 4, 6, 9], [8, 11, 12, 14]], dtype=np.uint32)
    a = packed_from_encoded(enc.copy(), np.dtype(np.int32), bos=7)
    b = packed_from_encoded(enc.copy(), np.dtype(np.int64), bos=7)
    assert a["targets"].tolist() == [[1, 2, 3, 4], [4, 5, 6, 7]]
    assert a["inputs"].tolist() == [[7, 1, 2, 7], [7, 7, 5, 6]]
    assert a["segment_ids"].tolist() == [[1, 1, 1, 2], [1, 2, 2, 2]]
    assert a["positions"].tolist() == [[0, 1, 2, 0], [0, 0, 1, 2]]
    for k in a:
        assert np.array_equal(a[k], b[k])
    assert b["targets"].dtype == np.int64 and b["segment_ids"].dtype == np.int32


@pytest.mark.parametrize("chunk_tokens", [16, 64])
def test_packed_rows_aligned_to_chunks_match_the_tokens(tmp_path: Path, chunk_tokens):
    seqs = random_seqs(6, 80)
    r = write_flat(tmp_path / "x.zarr", seqs, chunk_tokens=chunk_tokens)
    L = 8  # divides the chunk: the row-by-row copy path
    n = r.num_packed_rows(L)
    rows = np.array([0, n - 1, 3, 3, 5, 1, 2])
    want = np.stack([r.span_encoded(i * L, (i + 1) * L) for i in rows.tolist()])
    assert np.array_equal(r.packed_rows(rows, L), want)
    out = np.full((len(rows), L), 7, dtype=np.uint32)
    assert r.packed_rows(rows, L, out=out) is out and np.array_equal(out, want)
    assert np.array_equal(r.packed_rows(np.array([-1]), L), want[1:2])  # from the end
    assert r.packed_rows(np.zeros(0, dtype=np.int64), L).shape == (0, L)
    with pytest.raises(IndexError):
        r.packed_rows(np.array([n]), L)
    with pytest.raises(ValueError, match="C-contiguous"):
        r.packed_rows(rows, L, out=np.zeros((len(rows), L + 1), dtype=np.uint32))


@pytest.mark.parametrize("mode", ["packed", "eos"])
def test_row_aligned_fast_path_equals_generic_reader(tmp_path: Path, mode):
    seqs = random_seqs(7, 120)
    fast = write_flat(tmp_path / "x.zarr", seqs, chunk_tokens=32)
    opts = dict(seq_len=8, global_batch_size=6, mode=mode, seed=4)
    a, b = Loader(fast, **opts), Loader(Plain(seqs), **opts)
    kept = [a.batch(s) for s in range(20)]
    for s in range(20):
        want = b.batch(s)
        for k, v in want.items():
            assert kept[s][k].dtype == v.dtype and np.array_equal(kept[s][k], v), (s, k)


def test_encoded_windows_inside_chunks_and_across_them(tmp_path: Path):
    r = write_flat(tmp_path / "x.zarr", random_seqs(9, 40), chunk_tokens=16)
    for starts, length in (([0, 3, 17, 40, 3], 5), ([0, 12, 30], 9)):  # inside; straddling
        want = np.stack([r.span_encoded(s, s + length) for s in starts])
        out = np.zeros((len(starts), length), dtype=np.uint32)
        assert r.encoded_windows(np.array(starts), length, out=out) is out
        assert np.array_equal(out, want)
        assert np.array_equal(r.encoded_windows(starts, length), want)
