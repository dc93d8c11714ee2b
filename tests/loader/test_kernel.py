"""The C row layouts (lmdata/_native/kernel.c) give exactly the numpy layouts, and refuse
buffers that do not fit instead of reading or writing outside them.

The numpy path runs in every test run (``numpy_only`` switches the kernel off); the C side of
each comparison is skipped where no compiler built the kernel.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lmdata
from lmdata.errors import CorruptDataError
from lmdata.loader import Loader, packing
from tests.loader.conftest import random_seqs, write_flat

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

C = packing._C
needs_c = pytest.mark.skipif(C is None, reason="the C kernel is not built")


@contextmanager
def numpy_only():
    """The fallbacks, as where no compiler built the kernel: numpy layouts, and the
    flat-tokens reader's row lookup and copy in Python."""
    from lmdata.formats.flat_tokens import _windows as ft

    saved = packing._C, ft._copy_rows, ft._unit_windows
    packing._C = ft._copy_rows = ft._unit_windows = None
    try:
        yield
    finally:
        packing._C, ft._copy_rows, ft._unit_windows = saved


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


def _copy(batch: dict) -> dict:
    return {k: v.copy() for k, v in batch.items()}


encoded = st.integers(1, 6).flatmap(
    lambda rows: st.integers(1, 40).flatmap(
        lambda length: st.lists(
            st.integers(0, 2**32 - 1), min_size=rows * length, max_size=rows * length
        ).map(lambda v: np.array(v, dtype=np.uint32).reshape(rows, length))
    )
)
dtypes = st.sampled_from([np.dtype(np.int32), np.dtype(np.int64)])


def _parts(values: np.ndarray) -> tuple[list, list]:
    """The rows of ``values`` where they lie in one bigger buffer (as mapped chunks give)."""
    big = np.concatenate([np.zeros(3, np.uint32), values.reshape(-1)])
    bases = [memoryview(big.view(np.uint8))] * len(values)
    return bases, [(3 + i * values.shape[1]) * 4 for i in range(len(values))]


def _sparse_starts(enc: np.ndarray, every: int) -> np.ndarray:
    """Mostly clear start bits (runs long enough for the vector groups of four)."""
    out = enc & ~np.uint32(1)
    out.reshape(-1)[::every] |= 1
    return out


@settings(max_examples=80, deadline=None)
@given(enc=encoded, dtype=dtypes, bos=st.integers(0, 2**31 - 1), every=st.integers(1, 50))
def test_packed_c_equals_numpy(enc, dtype, bos, every):
    for values in (enc, _sparse_starts(enc, every)):
        with numpy_only():
            want = _copy(packing.packed_from_encoded(values.copy(), dtype, bos))
        for level in (1, 2) if C is not None else ():  # the SSE2 row and the AVX2 one
            with simd(level):
                _same(packing.packed_from_encoded(values.copy(), dtype, bos), want)
                # in place, from the batch's own positions memory (as the Loader gathers)
                out, buf = packing.packed_out(*values.shape, dtype)
                buf[...] = values
                packing.fill_packed(buf, out, bos)
                _same(out, want)
                # from a buffer and a byte offset per row (rows read straight from chunks)
                out, _ = packing.packed_out(*values.shape, dtype)
                packing.fill_packed(_parts(values), out, bos)
                _same(out, want)


@contextmanager
def simd(level: int):
    """The kernel's vector rows up to ``level`` (1: SSE2, 2: AVX2 where the CPU has it)."""
    before = C.simd(level)
    try:
        yield
    finally:
        C.simd(before)


def test_packed_layout_by_hand():
    enc = np.array([[3, 4, 6, 9], [8, 11, 12, 14]], dtype=np.uint32)
    for ctx in (numpy_only(), _nothing()):
        with ctx:
            a = packing.packed_from_encoded(enc.copy(), np.dtype(np.int64), bos=7)
            assert a["targets"].tolist() == [[1, 2, 3, 4], [4, 5, 6, 7]]
            assert a["inputs"].tolist() == [[7, 1, 2, 7], [7, 7, 5, 6]]
            assert a["segment_ids"].tolist() == [[1, 1, 1, 2], [1, 2, 2, 2]]
            assert a["positions"].tolist() == [[0, 1, 2, 0], [0, 0, 1, 2]]


def test_packed_int64_with_a_bos_past_int32_in_every_row():
    """The AVX2 int64 row widens int32 groups; a bos that needs 64 bits goes value by value."""
    rng = np.random.default_rng(3)
    enc = rng.integers(0, 2**32, (3, 70), dtype=np.uint64).astype(np.uint32) & ~np.uint32(1)
    enc[:, ::23] |= 1
    with numpy_only():
        want = _copy(packing.packed_from_encoded(enc.copy(), np.dtype(np.int64), 2**40))
    for level in (1, 2) if C is not None else ():
        with simd(level):
            _same(packing.packed_from_encoded(enc.copy(), np.dtype(np.int64), 2**40), want)
    assert (want["inputs"][:, ::23] == 2**40).all()


@contextmanager
def _nothing():
    yield


@settings(max_examples=50, deadline=None)
@given(enc=encoded, dtype=dtypes)
def test_eos_c_equals_numpy(enc, dtype):
    with numpy_only():
        want = _copy(packing.eos_from_encoded(enc, dtype))
    assert np.array_equal(want["targets"], (enc[:, 1:] >> 1).astype(dtype))
    for level in (1, 2) if C is not None else ():
        with simd(level):
            _same(packing.eos_from_encoded(enc, dtype), want)
            _same(packing.eos_from_encoded(_parts(enc), dtype, enc.shape), want)


@settings(max_examples=80, deadline=None)
@given(
    enc=encoded,
    dtype=dtypes,
    bos=st.integers(0, 1000),
    pad=st.integers(0, 1000),
    data=st.data(),
)
def test_unpacked_c_equals_numpy(enc, dtype, bos, pad, data):
    rows, length = enc.shape
    off = np.array(data.draw(st.lists(st.integers(0, length), min_size=rows, max_size=rows)))
    ln = np.array([data.draw(st.integers(0, length - o)) for o in off.tolist()])
    with numpy_only():
        want = _copy(packing.unpacked_from_encoded(enc.copy(), off, ln, dtype, bos, pad))
    ids = enc >> 1
    for i in range(rows):  # the piece, then padding
        k = int(ln[i])
        assert want["targets"][i, :k].tolist() == ids[i, off[i] : off[i] + k].tolist()
        assert (want["targets"][i, k:] == pad).all() and not want["loss_mask"][i, k:].any()
    for level in (1, 2) if C is not None else ():
        with simd(level):
            _same(packing.unpacked_from_encoded(enc.copy(), off, ln, dtype, bos, pad), want)
            got = packing.unpacked_from_encoded(_parts(enc), off, ln, dtype, bos, pad, length)
            _same(got, want)


@needs_c
def test_kernel_refuses_buffers_that_do_not_fit():
    out = packing.packed_buffers(2, 8, np.dtype(np.int32))
    io = [out[k] for k in packing.PACKED_KEYS]
    with pytest.raises(ValueError, match="bytes"):
        C.packed(np.zeros((2, 7), np.uint32), *io, 2, 8, 0, False)
    with pytest.raises(ValueError, match="bytes"):  # int64 claimed for int32 arrays
        C.packed(np.zeros((2, 8), np.uint32), *io, 2, 8, 0, True)
    for bases, offsets, what in (
        ([bytes(32), bytes(60)], [0, 32], "row 1: 32 bytes at offset 32"),  # past the end
        ([bytes(64), bytes(64)], [-4, 0], "row 0"),  # before the start
        ([bytes(64), bytes(64)], [2, 0], "row 0"),  # misaligned
        ([bytes(64)], [0], "one base"),
        ([bytes(64), bytes(64)], [0], "one base"),
    ):
        with pytest.raises(ValueError, match=what):
            C.packed((bases, offsets), *io, 2, 8, 0, False)
    with pytest.raises(TypeError):
        C.packed(([bytes(64), bytes(64)], [0, "x"]), *io, 2, 8, 0, False)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        C.packed(np.zeros((2, 16), np.uint32)[:, ::2], *io, 2, 8, 0, False)
    u = packing.packed_buffers(2, 8, np.dtype(np.int32), packing.UNPACKED_KEYS)
    uo = [u[k] for k in packing.UNPACKED_KEYS]
    enc = np.zeros((2, 8), np.uint32)
    for off, ln in (([0, 5], [8, 4]), ([-1, 0], [1, 1]), ([0, 0], [9, 0])):
        with pytest.raises(ValueError, match="outside"):
            C.unpacked(enc, np.array(off), np.array(ln), *uo, 2, 8, 0, 0, 1, False)
    ro = np.zeros((2, 8), np.int32)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError, TypeError)):
        C.eos(np.zeros((2, 9), np.uint32), ro, io[1], 2, 8, False)


OPTIONS = [
    dict(mode="packed"),
    dict(mode="packed", dtype="int64", bos_id=5),
    dict(mode="packed", epochs=1, shuffle=False),
    dict(mode="eos"),
    dict(mode="eos", dtype="int64"),
    dict(mode="eos", dtype="int64", epochs=1),
    dict(mode="unpacked"),
    dict(mode="unpacked", dtype="int64", bos_id=2, pad_id=9, long_docs="split"),
    dict(mode="unpacked", epochs=1, long_docs="split", shuffle=False),
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("chunk_tokens", [16, 64])
def test_loader_batches_are_the_same_in_c_and_numpy(tmp_path: Path, opts, chunk_tokens):
    r = write_flat(tmp_path / "x.zarr", random_seqs(4, 80, 60), chunk_tokens=chunk_tokens)
    loader = Loader(r, seq_len=16, global_batch_size=4, seed=3, **opts)
    steps = range(min(10, loader.num_steps or 10))
    with numpy_only():
        want = [_copy(loader.batch(s)) for s in steps]
    got = [loader.batch(s) for s in steps]  # kept: handed-out batches are never overwritten
    for a, b in zip(got, want, strict=True):
        _same(a, b)


def test_a_truncated_chunk_is_an_error_on_both_paths(tmp_path: Path):
    write_flat(tmp_path / "c.zarr", random_seqs(3, 200), chunk_tokens=64)
    chunk = tmp_path / "c.zarr" / "train" / "encoded_tokens" / "1"
    chunk.write_bytes(chunk.read_bytes()[:100])
    import lmdata

    for ctx in (numpy_only(), _nothing()):
        with ctx:
            loader = Loader(
                lmdata.open(tmp_path / "c.zarr"), seq_len=32, global_batch_size=2, shuffle=False
            )
            with pytest.raises(CorruptDataError, match="encoded_tokens"):
                loader.batch(1)


def test_a_truncated_seq_starts_chunk_is_an_error_for_unpacked_rows(tmp_path: Path):
    """The C pair lookup declines a short chunk; the general read reports it."""
    from lmdata.formats.flat_tokens import Writer

    path = tmp_path / "s.zarr"
    with Writer(path, chunk_tokens=64, seq_starts_chunk=16, manifest=False) as w:
        for s in random_seqs(5, 60):
            w.write(np.asarray(s, dtype=np.int64))
    chunk = path / "train" / "seq_starts" / "1"
    chunk.write_bytes(chunk.read_bytes()[:20])
    for ctx in (numpy_only(), _nothing()):
        with ctx:
            r = lmdata.open(path)
            loader = Loader(r, seq_len=8, global_batch_size=4, mode="unpacked", shuffle=False)
            with pytest.raises(CorruptDataError, match="seq_starts"):
                for s in range(6):  # documents 16-23: their pairs lie in the short chunk
                    loader.batch(s)


@pytest.mark.parametrize("chunk_tokens", [16, 64])
def test_flat_tokens_rows_are_the_same_with_the_c_gather(tmp_path: Path, chunk_tokens):
    r = write_flat(tmp_path / "x.zarr", random_seqs(5, 60), chunk_tokens=chunk_tokens)
    flat = r.span_encoded(0, r.num_tokens)
    L = 8
    rows = np.array([3, 0, 5, 3, r.num_packed_rows(L) - 1])
    want = np.stack([flat[x * L : (x + 1) * L] for x in rows.tolist()])
    windows = np.stack([flat[s : s + 9] for s in [0, 5, 14, 30]])
    for ctx in (_nothing(), numpy_only()):  # the C lookup and copy when built, then Python
        with ctx:
            assert np.array_equal(r.packed_rows(rows, L), want)
            assert np.array_equal(r.encoded_windows(np.array([0, 5, 14, 30]), 9), windows)
            parts = r.encoded_window_parts(np.array([0, 17, 40]), 8)
            got = [np.frombuffer(b, np.uint32, 8, o) for b, o in zip(*parts, strict=True)]
            assert [g.tolist() for g in got] == [flat[s : s + 8].tolist() for s in [0, 17, 40]]


def test_window_parts_decline_straddling_windows_and_refuse_outside_ones(tmp_path: Path):
    r = write_flat(tmp_path / "x.zarr", random_seqs(5, 60), chunk_tokens=16)
    for ctx in (_nothing(), numpy_only()):
        with ctx:
            assert r.encoded_window_parts(np.array([12]), 8) is None  # straddles two chunks
            with pytest.raises(IndexError, match="outside"):
                r.encoded_window_parts(np.array([r.num_tokens - 4]), 8)


@needs_c
def test_unit_windows_finds_declines_and_asks_for_missing_units():
    unit = 8
    views = {0: memoryview(np.arange(8, dtype=np.uint32).view(np.uint8))}
    views[1] = memoryview(np.arange(8, 16, dtype=np.uint32).view(np.uint8))
    views[2] = memoryview(np.arange(16, 20, dtype=np.uint32).view(np.uint8))  # short
    bases, offsets = C.unit_windows(views, unit, np.array([1, 8, 12]), 4, 100)
    got = [np.frombuffer(b, np.uint32, 4, o).tolist() for b, o in zip(bases, offsets, strict=True)]
    assert got == [[1, 2, 3, 4], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert C.unit_windows(views, unit, np.array([1, 40, 35]), 4, 100) == [5, 4]  # missing
    assert C.unit_windows(views, unit, np.array([6]), 4, 100) is False  # straddles
    assert C.unit_windows(views, unit, np.array([18]), 4, 100) is False  # past a short unit
    assert C.unit_windows(views, unit, np.array([-1]), 1, 100) is False  # outside
    assert C.unit_windows(views, unit, np.array([97]), 4, 100) is False
    with pytest.raises(ValueError, match="int64"):
        C.unit_windows(views, unit, np.array([1], dtype=np.int32), 4, 100)
    # row numbers times a scale (the row length): checked against total before multiplying
    bases, offsets = C.unit_windows(views, unit, np.array([1, 2]), 4, 16, 4)
    got = [np.frombuffer(b, np.uint32, 4, o).tolist() for b, o in zip(bases, offsets, strict=True)]
    assert got == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert C.unit_windows(views, unit, np.array([3]), 4, 16, 4) is not False  # the last row
    assert C.unit_windows(views, unit, np.array([4]), 4, 16, 4) is False  # past the end
    assert C.unit_windows(views, unit, np.array([2**62]), 4, 16, 4) is False  # 2**64 wraps to 0
    assert C.unit_windows(views, unit, np.array([0]), 4, 16, 0) is False


def test_packed_rows_refuse_rows_whose_start_would_wrap(tmp_path: Path):
    r = write_flat(tmp_path / "x.zarr", random_seqs(5, 60), chunk_tokens=16)
    flat = r.span_encoded(0, r.num_tokens)
    for ctx in (_nothing(), numpy_only()):
        with ctx:
            for bad in (2**61, 2**62 + 1, -(2**62), -1, r.num_packed_rows(8)):
                # (times 8 the first three wrap to (near) row 0)
                with pytest.raises(IndexError):
                    r.packed_row_parts(np.array([0, bad]), 8)
                if bad >= 0 or bad < -r.num_packed_rows(8):  # (-1 is the last row there)
                    with pytest.raises(IndexError):
                        r.packed_rows(np.array([0, bad]), 8)
            with pytest.raises(TypeError):
                r.packed_row_parts(np.array([1.5]), 8)
            rows = np.array([3, 0, 1])  # chunks of 16 tokens: rows of 8 never straddle
            got = [
                np.frombuffer(b, np.uint32, 8, o)
                for b, o in zip(*r.packed_row_parts(rows, 8), strict=True)
            ]
            assert [g.tolist() for g in got] == [flat[x * 8 : x * 8 + 8].tolist() for x in rows]
            last = r.num_packed_rows(8) - 1
            assert np.array_equal(r.packed_rows(np.array([-1]), 8), r.packed_rows([last], 8))


def test_windows_past_int64_are_an_index_error_on_both_paths(tmp_path: Path):
    """Starts given as Python ints beyond int64 are outside the tokens, as the Python
    lookup says, not an OverflowError from the conversion for the C lookup."""
    r = write_flat(tmp_path / "x.zarr", random_seqs(5, 60), chunk_tokens=16)
    for ctx in (_nothing(), numpy_only()):
        with ctx:
            for bad in ([2**63], [0, -(2**63) - 1], [10**30]):
                with pytest.raises(IndexError, match="outside"):
                    r.encoded_window_parts(bad, 8)
                with pytest.raises(IndexError, match="outside"):
                    r.encoded_windows(bad, 8)
            assert r.packed_row_parts([], 8) == ([], [])  # (an empty list: no rows)
            assert r.encoded_window_parts([0, 16], 8) is not None


def test_a_truncated_chunk_is_an_error_from_packed_rows(tmp_path: Path):
    import lmdata

    write_flat(tmp_path / "c.zarr", random_seqs(3, 200), chunk_tokens=64)
    chunk = tmp_path / "c.zarr" / "train" / "encoded_tokens" / "1"
    chunk.write_bytes(chunk.read_bytes()[:100])
    r = lmdata.open(tmp_path / "c.zarr")
    assert r.packed_rows(np.array([0]), 32).shape == (1, 32)  # chunk 0 is whole
    with pytest.raises(CorruptDataError, match="encoded_tokens"):
        r.packed_rows(np.array([0, 3]), 32)


@needs_c
@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 80), min_size=1, max_size=5),
    offsets=st.lists(st.integers(-8, 90), min_size=1, max_size=5),
    width=st.integers(1, 12),
)
def test_rows_outside_their_buffers_are_refused_never_read(sizes, offsets, width):
    n = min(len(sizes), len(offsets))
    bases = [np.arange(k, dtype=np.uint8).tobytes() for k in sizes[:n]]
    offs = offsets[:n]
    out = np.zeros((n, width), np.uint32)
    fits = all(
        0 <= o and o % 4 == 0 and o + width * 4 <= len(b) for b, o in zip(bases, offs, strict=True)
    )
    if not fits:
        with pytest.raises(ValueError, match="outside"):
            C.copy_rows((bases, offs), out, n, width)
        return
    C.copy_rows((bases, offs), out, n, width)
    for i, (b, o) in enumerate(zip(bases, offs, strict=True)):
        assert out[i].tolist() == np.frombuffer(b, np.uint32, width, o).tolist()


@pytest.mark.parametrize("compression", [None, "blosc"])
@pytest.mark.parametrize("seq_starts_chunk", [3, 4, 1 << 20])
def test_sequence_ranges_by_the_c_lookup_equal_the_index(
    tmp_path: Path, seq_starts_chunk, compression
):
    """Pairs of seq_starts entries read in C (chunks of 3 and 4 entries: pairs straddle them
    and go to the general path) equal the index, on both paths."""
    from lmdata.formats.flat_tokens import Writer
    from lmdata.formats.flat_tokens._windows import pairs

    seqs = random_seqs(11, 40)
    path = tmp_path / "x.zarr"
    with Writer(
        path, chunk_tokens=64, seq_starts_chunk=seq_starts_chunk, compression=compression
    ) as w:
        for s in seqs:
            w.write(np.asarray(s, dtype=np.int64))
    b = np.cumsum([0] + [len(s) for s in seqs])
    idx = np.random.default_rng(0).integers(0, len(seqs), 50)
    want = np.stack([b[idx], b[idx + 1]], axis=1)

    def want_of(i: list[int]) -> np.ndarray:
        return np.stack([b[i], b[np.array(i) + 1]], axis=1)

    for in_c, ctx in ((C is not None, _nothing()), (False, numpy_only())):
        with ctx:
            r = lmdata.open(path)  # (no boundaries read: the pairs come from the chunks)
            if in_c and seq_starts_chunk > len(seqs):  # one chunk: the C lookup serves all
                assert pairs(r.seq_starts, idx) is not None
            assert np.array_equal(r.sequence_ranges(idx), want)
            assert np.array_equal(r.sequence_ranges(idx[::-1].copy()), want[::-1])
            assert r.sequence_ranges(np.array([], dtype=np.int64)).shape == (0, 2)
            assert np.array_equal(r.sequence_ranges(np.array([-1, 0])), want_of([39, 0]))
            assert np.array_equal(r.sequence_ranges([3, 5]), want_of([3, 5]))
            for bad in ([40], [0, -41], [2**62]):
                with pytest.raises(IndexError):
                    r.sequence_ranges(np.array(bad))


@needs_c
def test_the_avx2_rows_serve_where_the_cpu_has_them() -> None:
    """simd(level) returns the level in effect before: on a CPU with AVX2 (and a GCC/Clang x86
    build), the AVX2 rows must be the ones in use, not silently the SSE2 ones."""
    import platform
    from pathlib import Path

    kernel = C
    info = Path("/proc/cpuinfo")
    flags = info.read_text() if info.exists() else ""
    if platform.machine() != "x86_64" or " avx2" not in flags:
        pytest.skip("no AVX2 on this CPU")
    before = kernel.simd(2)
    try:
        assert kernel.simd(2) == 2
    finally:
        kernel.simd(before)
