"""The one-call batch (lmdata/_native/kernel.c ``packed_at`` / ``eos_at``: the row lookup and the
layout together) gives exactly the batches of the unfused path, and the shuffle in C exactly
the numpy permutation; both decline what they cannot do instead of reading outside a buffer."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.loader import Loader, Permutation, packing, shuffle
from tests.loader.conftest import random_seqs, write_flat
from tests.loader.test_kernel import _copy, _same, numpy_only, simd

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

C = packing._C
needs_c = pytest.mark.skipif(C is None, reason="the C kernel is not built")


@needs_c
@settings(max_examples=200, deadline=None)
@given(
    n=st.one_of(st.integers(2, 5000), st.integers(2, 2**63 - 1)),
    seed=st.integers(0, 2**63 - 1),
    data=st.data(),
)
def test_the_shuffle_in_c_is_the_numpy_permutation(n, seed, data):
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=150)), dtype=np.int64)
    p = Permutation(n, seed)
    got = p(idx)
    saved, shuffle._feistel_c = shuffle._feistel_c, None
    try:
        want = p(idx)
    finally:
        shuffle._feistel_c = saved
    assert got.dtype == want.dtype == np.int64 and got.tolist() == want.tolist()
    assert ((got >= 0) & (got < n)).all()
    if n <= 300:  # a bijection: every value once
        assert sorted(p(np.arange(n)).tolist()) == list(range(n))


@needs_c
def test_the_c_shuffle_declines_indices_outside_its_range():
    p = Permutation(100, 1)
    out = np.zeros(3, np.int64)
    for bad in ([0, 100, 1], [-1, 0, 1]):
        assert C.feistel(np.array(bad), out, 100, p._half, p._keys) is False
        assert not out.any()  # nothing written
    assert C.feistel(np.arange(3), out, 1, p._half, p._keys) is False  # n < 2
    with pytest.raises(ValueError):
        C.feistel(np.arange(3, dtype=np.int32), out, 100, p._half, p._keys)
    with pytest.raises(ValueError, match="one item per index"):
        C.feistel(np.arange(4), out, 100, p._half, p._keys)
    # indices outside go the numpy way, as before
    assert p(np.array([5, 150])).tolist()[0] == p(np.array([5]))[0]
    assert p(2**70 % 100).shape == ()  # a scalar in, a 0-d array out, as before


def _straddles(rows: list[int], L: int, width: int, chunk: int) -> bool:
    return width > chunk or any((r * L) // chunk != (r * L + width - 1) // chunk for r in rows)


@needs_c
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    chunk=st.sampled_from([8, 16, 24, 64, 256]),
    L=st.integers(1, 40),
    mode=st.sampled_from(["packed", "eos"]),
    dtype=st.sampled_from(["int32", "int64"]),
    bos=st.integers(0, 2**31 - 1),
    level=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_one_call_batches_equal_the_unfused_path(seed, chunk, L, mode, dtype, bos, level, data):
    with tempfile.TemporaryDirectory() as tmp:
        r = write_flat(Path(tmp) / "x.zarr", random_seqs(seed, 40, 60), chunk_tokens=chunk)
        if r.num_tokens < L + 1:
            return
        loader = Loader(r, seq_len=L, global_batch_size=1, mode=mode, dtype=dtype, bos_id=bos)
        src = loader.sources[0]
        n = src.num_rows
        drawn = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=12))
        rows = np.array(drawn, dtype=np.int64)
        width = L + (mode == "eos")
        with simd(level):
            into, src._into = src._into, None
            try:
                want = _copy(src.read(rows))  # the lookup, then the layout
            finally:
                src._into = into
            fused = packing.laid_out_at(into, mode == "eos", rows, L, src.dtype, src.bos)
            got = src.read(rows)
        if _straddles(rows.tolist(), L, width, chunk):
            assert fused is None  # declined: the general path read it
        else:
            assert fused is not None
            _same(fused, want)
        _same(got, want)
        with numpy_only():
            _same(_copy(src.read(rows)), want)
        if mode == "packed" and len(rows):
            flat = r.span_encoded(0, r.num_tokens) >> 1
            assert got["targets"].tolist() == [flat[x * L : x * L + L].tolist() for x in rows]


def _views(*units: np.ndarray) -> dict[int, memoryview]:
    return {u: memoryview(a.astype(np.uint32).view(np.uint8)) for u, a in enumerate(units)}


@needs_c
def test_packed_at_declines_asks_for_missing_units_and_refuses_misfits():
    unit = 8
    views = _views(np.arange(0, 16, 2), np.arange(16, 32, 2) | 1, np.arange(32, 40, 2))  # short
    outs = packing.packed_buffers(2, 4, np.dtype(np.int32))
    args = (outs["inputs"], outs["targets"], outs["segment_ids"], outs["positions"], 7, False)
    assert C.packed_at(views, unit, np.array([1, 2]), 4, 100, 4, *args) is True
    assert outs["targets"].tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert outs["inputs"].tolist() == [[7, 4, 5, 6], [7, 7, 7, 7]]  # every value of row 1 starts
    assert outs["segment_ids"].tolist() == [[1, 1, 1, 1], [1, 2, 3, 4]]
    for k in outs.values():
        k.fill(-1)
    assert C.packed_at(views, unit, np.array([10, 12]), 4, 100, 4, *args) == [5, 6]
    assert C.packed_at(views, unit, np.array([1, 6]), 4, 100, 1, *args) is False  # straddles
    assert C.packed_at(views, unit, np.array([4, 5]), 4, 100, 4, *args) is False  # short unit
    assert C.packed_at(views, unit, np.array([0, 3]), 4, 14, 4, *args) is False  # past total
    assert C.packed_at(views, unit, np.array([0, -1]), 4, 100, 4, *args) is False
    assert C.packed_at(views, unit, np.array([0, 2**62]), 4, 100, 4, *args) is False  # wraps
    assert C.packed_at(views, unit, np.array([0, 1]), 9, 100, 1, *args) is False  # > unit
    assert (outs["targets"] == -1).all()  # declined: nothing written
    with pytest.raises(ValueError, match="int64"):
        C.packed_at(views, unit, np.array([0, 1], np.int32), 4, 100, 4, *args)
    with pytest.raises(ValueError, match="bytes"):  # outputs for 2 rows, 3 asked
        C.packed_at(views, unit, np.array([0, 1, 2]), 4, 100, 4, *args)
    with pytest.raises(ValueError, match="int32"):
        C.packed_at(views, unit, np.array([0, 1]), 4, 100, 4, *args[:4], 2**31, False)
    eo = packing.packed_buffers(2, 3, np.dtype(np.int64), packing.IO_KEYS)
    assert C.eos_at(views, unit, np.array([0, 1]), 4, 100, 3, eo["inputs"], eo["targets"], True)
    assert eo["inputs"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert eo["targets"].tolist() == [[1, 2, 3], [4, 5, 6]]
    ro = np.zeros((2, 3), np.int64)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError, TypeError)):
        C.eos_at(views, unit, np.array([0, 1]), 4, 100, 3, ro, eo["targets"], True)
    empty = packing.packed_buffers(0, 4, np.dtype(np.int32))
    e = (empty["inputs"], empty["targets"], empty["segment_ids"], empty["positions"], 0, False)
    assert C.packed_at(views, unit, np.zeros(0, np.int64), 4, 100, 4, *e) is True


@pytest.mark.parametrize("compression", [None, "blosc"])
def test_a_loader_on_chunks_the_byte_cache_evicted_still_reads_right(tmp_path: Path, compression):
    """The one-call path asks for missing chunks (mapped files or decoded blosc chunks), and
    falls back when they vanish again."""
    from lmdata.formats.flat_tokens import Writer

    with Writer(tmp_path / "x.zarr", chunk_tokens=64, compression=compression) as w:
        for s in random_seqs(9, 200, 60):
            w.write(np.asarray(s, dtype=np.int64))
    import lmdata

    r = lmdata.open(tmp_path / "x.zarr")
    loader = Loader(r, seq_len=16, global_batch_size=8, seed=2)
    done = []
    into = loader.sources[0]._into
    loader.sources[0]._into = lambda *a: done.append(into(*a)) or done[-1]
    with numpy_only():
        want = [_copy(loader.batch(s)) for s in range(6)]
    for s in range(6):
        r.tokens._views.clear()  # as after an eviction: every chunk missing again
        _same(loader.batch(s), want[s])
    assert done.count(True) == 6 if C is not None else not done
