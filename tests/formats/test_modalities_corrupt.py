"""modalities .pbin: corrupted, truncated and hostile files fail with a named, typed error."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata._report import MAX_REPORTED, overflow_line
from lmdata.errors import CorruptDataError, LmdataError, UnsafeDataError
from lmdata.formats import modalities

DATA = Path(__file__).parent.parent / "data" / "modalities"
REF = (DATA / "docs_bpe5k.pbin").read_bytes()


def pbin(
    tokens: list[int],
    index: object,
    width: int = 2,
    data_len: int | None = None,
    raw_index: bytes | None = None,
) -> bytes:
    data = np.asarray(tokens, dtype={1: "u1", 2: "<u2", 4: "<u4"}[width]).tobytes()
    n = len(data) if data_len is None else data_len
    tail = raw_index if raw_index is not None else pickle.dumps(index, protocol=4)
    return struct.pack("<QI", n, width) + data + tail


def open_fails(
    tmp_path: Path, blob: bytes, exc: type[Exception] = CorruptDataError, match: str | None = None
) -> str:
    p = tmp_path / "bad.pbin"
    p.write_bytes(blob)
    with pytest.raises(exc, match=match) as info:
        modalities.open(p)
    assert str(p) in str(info.value)
    problems = modalities.validate(p)
    assert problems, "validate must report what open refuses"
    return str(info.value)


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"", "fewer than the 12-byte header"),
        (REF[:7], "fewer than the 12-byte header"),
        (REF[:12], "truncated"),
        (REF[:5000], "truncated"),
        (REF[: 12 + 24778], "index is missing"),
        (REF[:-40], "cannot unpickle"),
        (struct.pack("<QI", 4, 3) + b"\0" * 4 + pickle.dumps([]), "must be 1, 2 or 4"),
        (struct.pack("<QI", 4, 0) + b"\0" * 4 + pickle.dumps([]), "must be 1, 2 or 4"),
        (struct.pack("<QI", 5, 2) + b"\0" * 5 + pickle.dumps([]), "not a multiple"),
        (struct.pack("<QI", 2**63, 2) + pickle.dumps([]), "truncated"),
        (REF[:12] + REF[12 : 12 + 24778] + b"garbage", "cannot unpickle"),
    ],
)
def test_bad_headers_and_truncation(tmp_path: Path, blob: bytes, match: str) -> None:
    open_fails(tmp_path, blob, match=match)


@pytest.mark.parametrize(
    ("index", "match"),
    [
        ({"a": 1}, "not a list"),
        ([(0, 2), (2,)], "entry 1"),
        ([(0, 2.0)], "entry 0"),
        ([(0, "2")], "entry 0"),
        ([(0, -2)], "negative"),
        ([(0, 3)], "multiples of the token width"),
        ([(1, 2)], "multiples of the token width"),
        ([(0, 4), (4, 8)], "outside"),
        ([(-2, 2)], "outside"),
        ([(0, 2**70)], "entry 0"),
    ],
)
def test_bad_index_entries(tmp_path: Path, index: object, match: str) -> None:
    open_fails(tmp_path, pbin([1, 2, 3, 4], index), match=match)


def test_hostile_pickle_is_refused_before_running(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    msg = open_fails(
        tmp_path, pbin([1, 2], None, raw_index=pickle.dumps([Evil()])), exc=UnsafeDataError
    )
    assert "system" in msg
    assert not marker.exists()


def test_numpy_ints_in_an_index_are_read_by_value(tmp_path: Path) -> None:
    # numpy scalars are plain data to the safe unpickler; their values are what counts
    p = tmp_path / "np.pbin"
    p.write_bytes(pbin([1, 2, 3], [(np.int64(0), np.int64(4)), (np.int64(4), np.int64(2))]))
    assert [d.tolist() for d in modalities.open(p)] == [[1, 2], [3]]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_random_damage_never_escapes_as_a_raw_exception(
    tmp_path: Path, data: st.DataObject
) -> None:
    blob = bytearray(REF)
    kind = data.draw(st.sampled_from(["flip", "truncate", "header"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            pos = data.draw(st.integers(0, len(blob) - 1))
            blob[pos] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    else:
        blob[:12] = data.draw(st.binary(min_size=12, max_size=12))
    p = tmp_path / "fuzz.pbin"
    p.write_bytes(bytes(blob))
    try:
        r = modalities.open(p)
    except LmdataError:
        assert modalities.validate(p)
        return
    # it opened: every document must be readable and inside the data
    for d in r:
        assert d.dtype == r.dtype
    assert r.num_tokens <= r.header.num_tokens or not r.contiguous
    assert isinstance(modalities.validate(p), list)


def test_damaged_pbin_is_still_detected_so_the_error_is_specific(tmp_path: Path) -> None:
    import lmdata

    p = tmp_path / "cut.pbin"
    p.write_bytes(REF[:5000])
    with pytest.raises(CorruptDataError, match="truncated"):
        lmdata.open(p)
    other = tmp_path / "cut.bin"
    other.write_bytes(REF[:5000])
    assert not modalities.detect(other)
    other.write_bytes(REF)
    assert modalities.detect(other)  # content alone is enough for an intact file


def test_validate_lists_twenty_problems_of_a_kind_and_counts_the_rest(tmp_path: Path) -> None:
    # 50 documents of one token each with a one-byte gap before every later one: 49 gaps
    # (offsets past the data would also be out of range: keep them inside)
    tokens = list(range(150))
    index = [(i * 6, 2) for i in range(50)]
    p = tmp_path / "gaps.pbin"
    p.write_bytes(pbin(tokens, index))
    problems = modalities.validate(p)
    gaps = [m for m in problems if "a gap" in m]
    assert len(gaps) == MAX_REPORTED
    assert problems[-1] == overflow_line("order", 49 + 1 - MAX_REPORTED)  # + the short last end
    # eod: 50 documents, none ending with the EOD token -> 20 listed, 30 counted
    p.write_bytes(pbin(tokens[:50], [(2 * i, 2) for i in range(50)][:25]))
    eod = modalities.validate(p, eod_id=9999)
    assert sum("not the end-of-document token" in m for m in eod) == MAX_REPORTED
    assert eod[-1] == overflow_line("eod", 25 - MAX_REPORTED)
