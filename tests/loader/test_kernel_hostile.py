"""Hostile inputs to the C kernel (lmdata/_native/kernel.c) and its callers: non-spec dtypes,
arguments that would wrap, buffers that change under the kernel, corrupt sequence starts. Each
is refused with an error, never read wrong, on both the C and the numpy paths."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import lmdata
from lmdata.errors import CorruptDataError, FormatError, InvalidInputError
from lmdata.formats.flat_tokens import _windows as ft
from lmdata.formats.flat_tokens._zarr import ZArray
from lmdata.loader import Loader, packing
from tests.loader.conftest import write_flat
from tests.loader.test_kernel import _nothing, numpy_only

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

C = packing._C
needs_c = pytest.mark.skipif(C is None, reason="the C kernel is not built")


def _retype_tokens(path: Path, dtype: str) -> Path:
    """The split's encoded_tokens rewritten with the same values in ``dtype``."""
    d = path / "train" / "encoded_tokens"
    meta = json.loads((d / ".zarray").read_text())
    meta["dtype"] = dtype
    (d / ".zarray").write_text(json.dumps(meta))
    for c in d.iterdir():
        if c.name.isdigit():
            c.write_bytes(np.frombuffer(c.read_bytes(), "<u4").astype(dtype).tobytes())
    return d


@pytest.mark.parametrize("dtype", ["<u8", "<u2", "<i4"])
def test_tokens_that_are_not_uint32_are_refused_at_open(tmp_path: Path, dtype):
    write_flat(tmp_path / "d.zarr", [np.arange(1, 33)] * 4, chunk_tokens=64)
    d = _retype_tokens(tmp_path / "d.zarr", dtype)
    for ctx in (_nothing(), numpy_only()):
        with ctx, pytest.raises(FormatError, match="only uint32") as e:
            lmdata.open(tmp_path / "d.zarr")
        assert "encoded_tokens" in str(e.value)
    arr = ZArray(*_store_key(d))
    if arr.dtype.itemsize != 4:  # the row lookup itself declines them (the C reads uint32)
        assert ft.window_parts(arr, np.array([0, 8]), 8, len(arr)) is None


def _store_key(d: Path):
    from lmdata.storage import resolve

    return resolve(str(d), None)


def _unpacked_args(rows: int, length: int, wide: bool = False) -> list:
    dt = np.int64 if wide else np.int32
    out = [np.zeros((rows, length), t) for t in (dt, dt, np.int32, np.int32, np.uint8)]
    return [
        np.zeros((rows, length), np.uint32),
        np.zeros(rows, np.int64),
        np.zeros(rows, np.int64),
        *out,
    ]


@needs_c
def test_row_counts_that_would_wrap_are_refused():
    # unpacked with length 0: rows * 8 (the offsets' bytes) wrapped to 8, and the check read on
    off = np.zeros(1 << 18, np.int64)[-1:]  # the last 8 bytes of an allocation
    e = np.zeros(0, np.int32)
    with pytest.raises(ValueError, match="bad shape"):
        C.unpacked(np.zeros(0, np.uint32), off, off, e, e, e, e, np.zeros(0, np.uint8),
                   2**61 + 1, 0, 0, 0, 1, False)  # fmt: skip
    # eos: length + 1 overflowed, and a negative length passed the shape check
    for length in (2**63 - 1, -1):
        with pytest.raises(ValueError, match="bad shape"):
            C.eos(np.zeros(0, np.uint32), e, e, 1, length, False)


@needs_c
def test_unpacked_uses_the_pieces_it_checked():
    """The lengths overlap inputs[0]: row 0's padding rewrites row 1's (checked) length while
    the kernel runs; the kernel must lay out row 1 with the length it checked."""
    enc, off, _, inputs, tg, seg, pos, mask = _unpacked_args(2, 4, wide=True)
    lengths = inputs.reshape(-1)[1:3]
    lengths[...] = [0, 1]
    C.unpacked(enc, off, lengths, inputs, tg, seg, pos, mask, 2, 4, 0, 1 << 40, 1, True)
    assert mask.tolist() == [[0, 0, 0, 0], [1, 0, 0, 0]]
    assert tg[1].tolist() == [0] + [1 << 40] * 3


@needs_c
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**32 + 7])
def test_ids_that_do_not_fit_int32_outputs_are_refused_not_truncated(value):
    enc = np.array([[3, 4, 6, 9]], np.uint32)
    for wide in (False, True):
        out, _ = packing.packed_out(1, 4, np.dtype(np.int64 if wide else np.int32))
        args = (enc, out["inputs"], out["targets"], out["segment_ids"], out["positions"], 1, 4)
        un = _unpacked_args(1, 4, wide)
        un[2][...] = 2
        if wide:
            C.packed(*args, value, wide)
            assert out["inputs"][0, 0] == value
            C.unpacked(*un, 1, 4, value, value, 1, wide)
            assert un[3][0].tolist() == [value, 0, value, value]
            continue
        with pytest.raises(ValueError, match=r"bos .* int32"):
            C.packed(*args, value, wide)
        with pytest.raises(ValueError, match=r"bos .* int32"):
            C.unpacked(*un, 1, 4, value, 0, 1, wide)
        with pytest.raises(ValueError, match=r"pad .* int32"):
            C.unpacked(*un, 1, 4, 0, value, 1, wide)


@needs_c
def test_buffers_of_other_items_or_unaligned_are_refused():
    # the right byte count, the wrong items: int64 outputs where uint32 rows go
    with pytest.raises(ValueError, match="8-byte items, expected 4"):
        C.copy_rows(np.zeros((1, 4), np.uint32), np.zeros(2, np.int64), 1, 4)
    with pytest.raises(ValueError, match="int64"):
        C.unit_windows({}, 8, np.zeros(8, np.uint8), 4, 100)
    # int64 offsets at an odd address
    raw = bytearray(8 * 3)
    off = np.frombuffer(raw, np.int64, 2, 1)
    assert not off.flags.aligned
    args = _unpacked_args(2, 4)
    with pytest.raises(ValueError, match="aligned"):
        C.unpacked(args[0], off, off, *args[3:], 2, 4, 0, 0, 1, False)


@needs_c
def test_unit_windows_with_huge_units_or_widths_decline():
    views = {0: memoryview(np.arange(8, dtype=np.uint32).view(np.uint8))}
    # (o + width) * 4 wrapped for units past 2**61, and gave a negative offset
    assert C.unit_windows(views, 2**62, np.array([2**62 - 8]), 4, 2**63 - 1) is False
    assert C.unit_windows(views, 8, np.array([0]), 4, 2) is False  # wider than the array
    assert C.unit_windows(views, 8, np.array([0]), 4, -(2**63)) is False


@pytest.mark.parametrize(
    "starts", [[0, 50, 5, 30, 40, 45, 60], [0, 10, 100, 30, 40, 50, 60], [0, 10, 2**63 + 5, 60]]
)
def test_corrupt_seq_starts_are_an_error_in_split_mode(tmp_path: Path, starts):
    """Decreasing, past the end or past 2**63 (the ends are right, so opening passes): the
    split layout refuses them on both paths instead of serving wrong pieces."""
    p = tmp_path / "h.zarr"
    write_flat(p, [np.arange(1, 11)] * 6, chunk_tokens=16)
    chunk = p / "train" / "seq_starts" / "0"
    raw = np.frombuffer(chunk.read_bytes(), np.uint64).copy()
    raw[: len(starts)] = starts
    raw[len(starts) - 1 : 7] = 60
    chunk.write_bytes(raw.tobytes())
    for ctx in (_nothing(), numpy_only()):
        with ctx, pytest.raises(CorruptDataError, match="boundaries are corrupt") as e:
            loader = Loader(
                lmdata.open(p), seq_len=8, global_batch_size=4, mode="unpacked",
                long_docs="split", shuffle=False,
            )  # fmt: skip
            loader.batch(0)
        assert "seq_starts" in str(e.value)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_packed_rows_refuses_a_row_number_that_wraps(tmp_path: Path, dtype):
    """(2**61 + 1) * 8 wraps to row 1's start: refused on both paths, never row 1's tokens."""
    r = write_flat(tmp_path / "w.zarr", [np.arange(1, 65)], chunk_tokens=64)
    for ctx in (_nothing(), numpy_only()):
        with ctx, pytest.raises(IndexError, match="out of range"):
            r.packed_rows(np.array([2**61 + 1], dtype=dtype), 8)


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
@pytest.mark.parametrize("name", ["bos_id", "pad_id"])
def test_loader_refuses_ids_that_do_not_fit_its_dtype(tmp_path: Path, name, value):
    r = write_flat(tmp_path / "d.zarr", [np.arange(1, 33)] * 2, chunk_tokens=64)
    with pytest.raises(InvalidInputError, match=f"{name} .* int32"):
        Loader(r, seq_len=8, global_batch_size=2, dtype="int32", **{name: value})
    b = Loader(r, seq_len=8, global_batch_size=2, dtype="int64", mode="unpacked", **{name: value})
    assert b.batch(0)["targets"].dtype == np.int64  # int64 outputs take it


@needs_c
@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python buffer exporters need 3.12")
def test_a_buffer_export_that_empties_the_lists_is_survived():
    """Exporting a buffer may run code (``__buffer__``) that drops the only references to
    the other rows or views: the kernel holds its own."""
    bases: list = []
    offsets = [0, 0]

    class Hostile:
        def __buffer__(self, flags):
            bases.clear()
            offsets.clear()
            return memoryview(np.arange(4, dtype=np.uint32).view(np.uint8))

    bases += [Hostile(), np.arange(4, 8, dtype=np.uint32).tobytes()]
    out = np.zeros((2, 4), np.uint32)
    C.copy_rows((bases, offsets), out, 2, 4)
    assert out.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]

    views: dict = {}

    class Dropper:
        def __buffer__(self, flags):
            views.clear()  # the dict held the only reference to self
            return memoryview(bytearray(64))

    views[0] = Dropper()
    got = C.unit_windows(views, 16, np.array([0]), 4, 100)
    assert isinstance(got[0][0], Dropper) and got[1] == [0]


@needs_c
def test_many_empty_rows_allocate_and_loop_nothing():
    """Rows of no values from one buffer: nothing per row is allocated or visited (it was a
    rows-sized allocation, and a loop of 2**59 empty rows with the GIL released)."""
    e = np.zeros(0, np.uint32)
    assert C.copy_rows(e, e, 2**59, 0) is None
    z = np.zeros(0, np.int32)
    assert C.packed(e, z, z, z, z, 2**59, 0, 0, False) is None
    with pytest.raises(ValueError, match="one base and one offset per row"):
        C.copy_rows(([], []), e, 2**59, 0)
