"""Staged record blocks come back equal, of the same types, and never through pickle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.errors import CorruptDataError
from lmdata.parallel.records import pack, unpack

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.just("\x00lmdata"), inner, max_size=4)
    ),
    max_leaves=12,
)
records = st.lists(st.dictionaries(st.text(max_size=8), values, max_size=5), max_size=6)


def same(a, b) -> bool:
    """Equal values of the same types (NaN equal to NaN, arrays by dtype, shape and values)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


@settings(max_examples=75, deadline=None)  # (recursive strategies: seconds to generate)
@given(records)
def test_records_round_trip_with_their_types(recs):
    assert same(unpack(pack(recs)), recs)


def test_binary_values_nan_and_numpy_round_trip():
    recs = [
        {
            "img": b"\x00\xff" * 3,
            "emb": np.arange(6, dtype=np.float16).reshape(2, 3),
            "n": np.int64(-5),
            "u": np.uint8(250),
            "nan": float("nan"),
            "inf": [float("-inf"), (1, "a")],
            "\x00lmdata": ["t", []],  # a record's own key that looks like a tag
        },
        {},
    ]
    back = unpack(pack(recs))
    assert same(back, recs)
    assert back[0]["emb"].flags.writeable  # a fresh array, not a view of the staged bytes


@pytest.mark.parametrize("bad", [{"x": {1, 2}}, {"x": 1 << 70}, {"x": {1: "a"}}, {"x": object()}])
def test_a_value_that_cannot_be_staged_exactly_is_a_type_error(bad):
    with pytest.raises(TypeError):
        pack([bad])


def test_damaged_blocks_are_corrupt_data_naming_the_part():
    data = pack([{"a": b"xyz", "b": [1.5, None]}])
    for broken in (data[:-1], b"junk" + data, data[:12] + b"{" + data[13:]):
        with pytest.raises(CorruptDataError, match=r"parts/x\.rec"):
            unpack(broken, "work/parts/x.rec")
