"""MDS column encodings: exact bytes, round trips, and refusals."""

from __future__ import annotations

import struct
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lmdata.errors import InvalidInputError
from lmdata.formats.mds.encodings import DTYPE_CODES, coder, infer_encoding
from lmdata.formats.mds.mds import SampleDecoder, SampleEncoder, shard_config

RESEARCH_COLUMNS = {
    "arr": "ndarray",
    "arrf": "ndarray:int16:2,3",
    "f": "float32",
    "id": "int",
    "txt": "str",
    "u8": "uint8",
}


def test_sample_bytes_match_the_layout_verified_against_streaming() -> None:
    enc = SampleEncoder(shard_config(RESEARCH_COLUMNS, None, [], 1 << 26))
    got = enc.encode(
        {
            "arr": np.zeros(1, np.uint16),
            "arrf": np.zeros((2, 3), np.int16),
            "f": 0.0,
            "id": 0,
            "txt": "ab",
            "u8": 0,
        }
    )
    want = (
        bytes.fromhex("05000000 02000000 10 04 01 0000".replace(" ", ""))
        + bytes(12)
        + bytes(4)
        + bytes(8)
        + b"ab"
        + b"\x00"
    )
    assert got == want


def test_shard_layout_and_config_json() -> None:
    cfg = shard_config({"b": "int", "a": "str"}, "zstd:7", ["sha1"], 100)
    assert cfg["column_names"] == ["a", "b"] and cfg["column_sizes"] == [None, 8]
    enc = SampleEncoder(cfg)
    data = enc.shard([enc.encode({"a": "x", "b": 1}), enc.encode({"a": "yz", "b": 2})])
    n, *offsets = struct.unpack_from("<4I", data)
    assert n == 2
    text = data[16 : offsets[0]].decode()
    assert text.startswith('{"column_encodings": ["str", "int"], "column_names": ["a", "b"]')
    assert offsets[2] == len(data) and offsets[1] - offsets[0] == 4 + 1 + 8


@pytest.mark.parametrize(("biggest", "code"), [(255, 0), (256, 1), (65535, 1), (65536, 2)])
def test_ndarray_shape_type_is_the_smallest_that_fits(biggest: int, code: int) -> None:
    b = coder("ndarray:uint8").encode(np.zeros((1, biggest), np.uint8))
    assert b[0] == (2 << 2) | code
    assert np.array_equal(coder("ndarray:uint8").decode(b), np.zeros((1, biggest), np.uint8))


dtypes = st.sampled_from(sorted(DTYPE_CODES))


@settings(max_examples=80, deadline=None)
@given(
    dtype=dtypes,
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6),
    data=st.data(),
)
def test_ndarray_round_trip_any_dtype_and_shape(dtype: str, shape, data) -> None:
    arr = data.draw(hnp.arrays(np.dtype(dtype), shape))
    for enc in ("ndarray", f"ndarray:{dtype}", f"ndarray:{dtype}:{','.join(map(str, shape))}"):
        c = coder(enc)
        out = c.decode(c.encode(arr))
        assert out.dtype == arr.dtype and out.shape == arr.shape
        assert out.tobytes() == arr.tobytes()
        assert c.size is None or c.size == arr.nbytes


@settings(max_examples=60, deadline=None)
@given(st.text(), st.integers(-(2**63), 2**63 - 1), st.integers(), st.floats(allow_nan=False))
def test_scalar_and_string_round_trips(s: str, i: int, big: int, f: float) -> None:
    assert coder("str").decode(coder("str").encode(s)) == s
    assert coder("int").decode(coder("int").encode(i)) == i
    assert coder("str_int").decode(coder("str_int").encode(big)) == big
    assert coder("str_float").decode(coder("str_float").encode(f)) == f
    out = coder("float64").decode(coder("float64").encode(f))
    assert isinstance(out, np.float64) and out == f


def test_decoded_types_are_streamings() -> None:
    assert isinstance(coder("int").decode(coder("int").encode(5)), int)
    assert isinstance(coder("uint16").decode(coder("uint16").encode(5)), np.uint16)
    d = coder("str_decimal").decode(coder("str_decimal").encode(Decimal("1.50")))
    assert d == Decimal("1.50") and str(d) == "1.50"
    j = coder("json").decode(coder("json").encode(np.arange(3)))
    assert j == [0, 1, 2]


@pytest.mark.parametrize(
    ("enc", "value"),
    [
        ("ndarray", np.zeros(0, np.int32)),  # empty
        ("ndarray", np.array(3, np.int32)),  # 0-d
        ("ndarray", np.zeros(2, np.bool_)),  # bool has no code
        ("ndarray:int16", np.zeros(2, np.float32)),  # wrong dtype
        ("ndarray:int16", np.full(2, 40000)),  # integers that do not fit
        ("ndarray:int16:2", np.zeros(3, np.int16)),  # wrong shape
        ("int", 2**63),
        ("int", "5"),
        ("uint8", 256),
        ("str", b"x".decode() and 5),
        ("str_float", 1),
        ("str_decimal", 1.5),
        ("json", {1, 2}),
        ("pil", "not an image"),
        ("jpeg_array", ["x"]),
    ],
)
def test_unstorable_values_are_invalid_input(enc: str, value) -> None:
    with pytest.raises(InvalidInputError):
        coder(enc).encode(value)


@pytest.mark.parametrize(
    "enc", ["ndarray:bool", "ndarray:int16:0", "ndarray:int8:2:3", "float128", "list[str]"]
)
def test_unknown_encodings_are_refused(enc: str) -> None:
    with pytest.raises(ValueError):
        coder(enc)


def test_bytes_pass_through_any_encoding_but_fixed_sizes_hold() -> None:
    enc = SampleEncoder(shard_config({"a": "json", "b": "int"}, None, [], None))
    raw = enc.encode({"a": b"[1]", "b": (7).to_bytes(8, "little")})
    dec = SampleDecoder(("a", "b"), ("json", "int"), (None, 8))
    assert dec(raw) == {"a": [1], "b": 7}
    with pytest.raises(InvalidInputError, match="exactly 8 bytes"):
        enc.encode({"a": 1, "b": b"123"})


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x22",
        b"\x22\x04",
        b"\x22\x04\x05" + bytes(3),
        b"\x07\x04\x01" + bytes(8),
        b"\x22\xfc" + bytes(10),
    ],
)
def test_corrupt_ndarray_bytes_raise_value_error(blob: bytes) -> None:
    with pytest.raises(ValueError):
        coder("ndarray").decode(blob)


def test_pil_decoder_refuses_sizes_its_bytes_cannot_hold() -> None:
    blob = struct.pack("<III", 100000, 100000, 1) + b"L" + bytes(10)
    with pytest.raises(ValueError):
        coder("pil").decode(blob)


def test_inferred_encodings_never_pickle() -> None:
    assert infer_encoding(np.arange(3, dtype=np.uint16)) == "ndarray:uint16"
    assert infer_encoding(np.float32(1)) == "float32"
    assert infer_encoding(1) == "int" and infer_encoding(2**70) == "str_int"
    assert infer_encoding(object()) == "json" and infer_encoding({"a": 1}) == "json"
    assert infer_encoding(Decimal(1)) == "str_decimal" and infer_encoding(b"") == "bytes"
