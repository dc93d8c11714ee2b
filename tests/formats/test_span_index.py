"""The Modalities span index: pickles of int pairs load at C speed, anything else is checked."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata._pickle import safe_load_prefix
from lmdata.errors import CorruptDataError, LmdataError, UnsafeDataError
from lmdata.formats import _span_index
from lmdata.formats._span_index import dump_span_index, load_span_index

I64 = st.integers(-(2**63), 2**63 - 1)
pairs = st.lists(st.tuples(I64, st.integers(0, 2**63 - 1)), max_size=40)


def _dumps(obj: object, protocol: int, pure: bool) -> bytes:
    """A pickle from the C pickler (what modalities runs) or the pure-Python one."""
    if not pure:
        return pickle.dumps(obj, protocol=protocol)
    f = io.BytesIO()
    pickle._Pickler(f, protocol=protocol).dump(obj)  # type: ignore[attr-defined]
    return f.getvalue()


def _checked(data: bytes) -> object:
    """What load_span_index gives (value or error text) on the generic checked path."""
    with mock.patch.object(_span_index, "_load_plain", return_value=None):
        return _outcome(data)


def _outcome(data: bytes) -> object:
    try:
        got = load_span_index(data, path="d.pbin", where="index")
    except LmdataError as e:
        return type(e), str(e)
    return got.offsets.tolist(), got.lengths.tolist(), got.trailing


def _self_listing() -> list:
    spans: list = [(0, 5)]
    spans.append(spans)
    return spans


@pytest.mark.parametrize("n", [0, 1, 2, 999, 1000, 1001, 2500, 20_000])
@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("pure", [False, True])
def test_every_index_modalities_writes_takes_the_fast_path(n, protocol, pure):
    # offsets past 2**32 (LONG1), negative ones (modalities' merge bug) and small lengths
    rng = np.random.default_rng(n)
    offs = rng.integers(-(2**40), 2**40, n).tolist()
    lens = rng.integers(0, 70_000, n).tolist()
    spans = list(zip(offs, lens, strict=True))
    if n > 3:
        spans[3] = spans[1]  # the same pair listed twice: a BINGET
        offs[3], lens[3] = offs[1], lens[1]
    data = _dumps(spans, protocol, pure)
    if protocol == 4 and not pure and n <= 3:
        assert data == dump_span_index(offs, lens)
    assert _span_index._load_plain(data) is not None  # 20,000 pairs: several frames
    got = load_span_index(data + b"tail", path="d.pbin", where="index")
    assert got.offsets.tolist() == offs and got.lengths.tolist() == lens
    assert got.trailing == 4


@settings(max_examples=60, deadline=None)
@given(spans=pairs, protocol=st.integers(4, 5), pure=st.booleans())
def test_fast_path_round_trips_any_int_pairs(spans, protocol, pure):
    data = _dumps(spans, protocol, pure)
    assert _span_index._load_plain(data) is not None
    assert _outcome(data) == ([o for o, _ in spans], [n for _, n in spans], 0)


@settings(max_examples=150, deadline=None)
@given(
    spans=st.lists(st.tuples(I64, I64), min_size=1, max_size=12),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.binary(max_size=6), st.booleans()), max_size=4
    ),
    cut=st.integers(0, 10**6),
)
def test_fast_path_agrees_with_the_checked_path_on_damaged_indexes(spans, edits, cut):
    # the fast path either declines or gives exactly the checked path's value, bytes used and
    # errors, whatever the damage (negative lengths, ints for pairs, tuples of tuples, ...)
    data = bytearray(dump_span_index([o for o, _ in spans], [n for _, n in spans]))
    for at, new, insert in edits:
        at %= len(data) + 1
        data[at : at if insert else at + len(new)] = new
    data = bytes(data[: max(1, cut % (len(data) + 2))])
    plain = _span_index._load_plain(data)
    if plain is not None:
        value, used = safe_load_prefix(data)
        assert plain == (value, used)
    assert _outcome(data) == _checked(data)


def test_origin_indexes_take_the_fast_path():
    # written by modalities 0.5.0; the reordered raw index lists a document twice (a BINGET)
    shown = Path(__file__).parent.parent / "data" / "modalities"
    for name in (
        "docs_bpe5k.pbin",
        "docs_reordered_jq_bpe5k.pbin",
        "docs.idx",
        "docs_reordered.idx",
    ):
        raw = (shown / name).read_bytes()
        if name.endswith(".pbin"):
            raw = raw[12 + int.from_bytes(raw[:8], "little") :]
        assert _span_index._load_plain(raw) is not None, name
        assert _outcome(raw) == _checked(raw), name


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x04]\x94(K\x00K\x01\x86r\x00\x00\x00\x48e.",  # LONG_BINPUT: a 19 GB memo
        b"\x80\x04]\x94(K\x00K\x01\x86p1200000000\ne.",  # PUT, the text form
    ],
)
def test_memo_bombs_in_an_index_are_refused(data):
    assert _span_index._load_plain(data) is None
    with pytest.raises(UnsafeDataError, match="memo slot") as ei:
        load_span_index(data, path="d.pbin", where="index")
    assert "d.pbin" in str(ei.value)


def test_globals_in_an_index_are_refused():
    data = b"\x80\x04]\x94(cos\nsystem\n\x94K\x00\x86\x94e."
    assert _span_index._load_plain(data) is None
    with pytest.raises(UnsafeDataError, match=r"os\.system"):
        load_span_index(data, path="d.pbin", where="index")


@pytest.mark.parametrize(
    ("obj", "says", "plain"),
    [
        ([(0, 5), 7], "entry 1 is 7", True),
        ([(0, 5), ((1, 2), 3)], "entry 1 is", True),
        ([(0, -5)], "cannot be negative", True),
        (_self_listing(), "entry 1 is", True),  # the list itself, by BINGET
        ([(0, 2**64)], "entry 0", False),  # a 9-byte int: the fast path's ints fit int64
    ],
)
def test_wrong_entries_in_an_index_are_named(obj, says, plain):
    data = pickle.dumps(obj, protocol=4)
    assert (_span_index._load_plain(data) is not None) == plain
    with pytest.raises(CorruptDataError, match=says):
        load_span_index(data, path="d.pbin", where="index")
