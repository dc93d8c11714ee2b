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
