"""The bestfit kernels of lmdata/_native/kernel_bestfit.h: the segment layout equals its numpy twin,
and hostile arguments (segments outside their windows or rows, rows out of order, wrong item
sizes, sizes outside the row) are refused with an error, never read or written out of bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.loader import packing
from lmdata.loader.binpack import _best_fit_py, best_fit

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

C = packing._C
needs_c = pytest.mark.skipif(C is None or not hasattr(C, "segments"), reason="no C kernel")


def _segments(data, rows: int, L: int, width: int):
    """Random segments that fit: per row a few, each inside a window of ``width``."""
    off, lens, where = [], [], []
    for r in range(rows):
        used = 0
        for _ in range(data.draw(st.integers(0, 4))):
            room = min(L - used, width)
            if room < 1:
                break
            k = data.draw(st.integers(1, room))
            off.append(data.draw(st.integers(0, width - k)))
            lens.append(k)
            where.append(r)
            used += k
    return (np.array(x, dtype=np.int64) for x in (off, lens, where))


@needs_c
@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    rows=st.integers(1, 5),
    L=st.integers(1, 24),
    width=st.integers(1, 24),
    wide=st.booleans(),
    bos=st.integers(0, 70000),
    pad=st.integers(0, 9),
    shift=st.sampled_from([0, 1]),
)
def test_segment_rows_in_c_equal_numpy(data, rows, L, width, wide, bos, pad, shift):
    off, lens, where = _segments(data, rows, L, width)
    rng = np.random.default_rng(len(off))
    windows = rng.integers(0, 2**31, (len(off), width), dtype=np.uint32)
    dt = np.dtype(np.int64 if wide else np.int32)
    args = (windows, width, off, lens, where, rows, L, dt, bos, pad, shift)
    got = {k: v.copy() for k, v in packing.segment_rows(*args).items()}
    before = C.simd(1)  # the plain (SSE2) loops too, where AVX2 was used above
    try:
        plain = {k: v.copy() for k, v in packing.segment_rows(*args).items()}
    finally:
        C.simd(before)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(packing, "_C", None)
        want = packing.segment_rows(*args)
    for k in want:
        assert np.array_equal(got[k], want[k]) and np.array_equal(plain[k], want[k]), k


def _outputs(rows: int, L: int):
    return [np.zeros((rows, L), t) for t in (np.int32, np.int32, np.int32, np.int32, np.uint8)]


@needs_c
@pytest.mark.parametrize(
    ("off", "lens", "where", "why"),
    [
        ([0], [9], [0], "do not fit"),  # longer than its window
        ([5], [4], [0], "do not fit"),  # past its window's end
        ([-1], [2], [0], "do not fit"),  # before it
        ([0], [0], [0], "do not fit"),  # an empty segment
        ([0, 0], [5, 5], [0, 0], "do not fit"),  # the row overflows
        ([0, 0], [2, 2], [1, 0], "do not fit"),  # rows out of order
        ([0], [2], [2], "do not fit"),  # a row past the batch
        ([0, 0], [2], [0, 0], "one offset, length and row"),
    ],
)
def test_hostile_segments_are_refused(off, lens, where, why):
    windows = np.ones((len(off), 8), dtype=np.uint32)
    a = [np.array(x, dtype=np.int64) for x in (off, lens, where)]
    with pytest.raises(ValueError, match=why):
        C.segments(windows, 8, *a, *_outputs(2, 8), 2, 8, 0, 0, 1, False)


@needs_c
def test_hostile_buffers_are_refused():
    a = [np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int64)]
    with pytest.raises(ValueError, match="bytes"):  # the windows' size is not theirs
        C.segments(np.ones((1, 4), np.uint32), 8, *a, *_outputs(1, 8), 1, 8, 0, 0, 1, False)
    with pytest.raises(ValueError, match="items"):  # int32 offsets
        C.segments(
            np.ones((1, 8), np.uint32),
            8,
            a[0].astype(np.int32),
            *a[1:],
            *_outputs(1, 8),
            1,
            8,
            0,
            0,
            1,
            False,
        )
    with pytest.raises(ValueError, match="int32"):  # a bos that int32 outputs cannot hold
        C.segments(np.ones((1, 8), np.uint32), 8, *a, *_outputs(1, 8), 1, 8, 2**40, 0, 1, False)
    with pytest.raises(ValueError, match="shift"):
        C.segments(np.ones((1, 8), np.uint32), 8, *a, *_outputs(1, 8), 1, 8, 0, 0, 40, False)


@needs_c
def test_hostile_best_fit_arguments_are_refused():
    starts, members = np.empty(3, np.int64), np.empty(2, np.int32)
    with pytest.raises(ValueError, match=r"outside 1 \.\. 8"):
        C.best_fit(np.array([3, 9]), 8, 10, starts, members)
    with pytest.raises(ValueError, match=r"outside 1 \.\. 8"):
        C.best_fit(np.array([3, 0]), 8, 10, starts, members)
    with pytest.raises(ValueError, match="n \\+ 1"):
        C.best_fit(np.array([3, 3]), 8, 10, starts[:2], members)
    with pytest.raises(ValueError, match="capacity"):
        C.best_fit(np.array([3, 3]), 0, 10, starts, members)
    with pytest.raises(ValueError, match="items"):
        C.best_fit(np.array([3, 3], dtype=np.int32), 8, 10, starts, members)
    with pytest.raises(ValueError, match="item sizes"):  # the Python twin says so too
        _best_fit_py(np.array([9]), 8, 1, np.empty(2, np.int64), np.empty(1, np.int32))
    assert best_fit(np.array([8, 1]), 8, 1)[0] == 1  # (one row: the 1 is left over)
