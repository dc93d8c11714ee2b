"""lmdata._json: orjson first, the depth of what only the standard library parses scanned in
bounded windows, metadata nesting capped on the parsed value."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmdata import _json


def _reference_depth(data: bytes) -> int:
    """Byte by byte: brackets inside strings skipped, a quote after an odd run of backslashes
    escaped (backslashes appear only in strings in JSON; the scanner does not need to know)."""
    depth = best = 0
    inside = escaped = False
    for c in data:
        was_escaped, escaped = escaped, c == 0x5C and not escaped
        if c == 0x22 and not was_escaped:
            inside = not inside
        elif not inside and c in b"[{":
            depth += 1
            best = max(best, depth)
        elif not inside and c in b"]}":
            depth -= 1
    return best


@given(
    st.binary(max_size=200).map(lambda b: bytes(b'[]{}"\\ a'[x % 8] for x in b)), st.integers(1, 9)
)
def test_windowed_scan_agrees_with_a_byte_by_byte_scan(data: bytes, window: int) -> None:
    want = _reference_depth(data)
    assert _json.nesting_depth(data, window=window) == want
    assert _json.nesting_depth(data) == want


def test_windowed_scan_carries_escapes_and_strings_across_windows() -> None:
    text = b'["' + b"\\" * 3 + b'"[[", [[' + b"]]]"  # an escaped quote split by the window
    for window in range(1, len(text) + 1):
        assert _json.nesting_depth(text, window=window) == 3


def test_valid_metadata_is_parsed_without_the_depth_scan(monkeypatch) -> None:
    def no_scan(*_a, **_k):
        raise AssertionError("the depth scan ran on JSON orjson parses")

    monkeypatch.setattr(_json, "nesting_depth", no_scan)
    index = {"version": 2, "shards": [{"raw_data": {"basename": f"s{i}"}} for i in range(100)]}
    assert _json.parse(json.dumps(index), _json.MAX_METADATA_DEPTH) == index
    # the metadata cap is checked on the parsed value, with its depth
    with pytest.raises(ValueError, match="nested 65 levels deep, more than the 64 allowed"):
        _json.parse(b"[" * 65 + b"]" * 65, max_depth=64)
    assert _json.parse(b"[" * 64 + b"]" * 64, max_depth=64) == json.loads(b"[" * 64 + b"]" * 64)


def test_the_standard_library_path_is_scanned_first() -> None:
    assert (
        _json.parse(b"[NaN, 123456789012345678901234567890]")[1] == 123456789012345678901234567890
    )
    with pytest.raises(ValueError, match="nested 2000 levels"):  # beyond orjson's 1024
        _json.parse(b"[" * 2000 + b"]" * 2000)
    with pytest.raises(ValueError, match="nested 70 levels"):  # json.loads-only text, too deep
        _json.parse(b"[" * 70 + b"NaN" + b"]" * 70, max_depth=64)


def test_the_scan_needs_memory_for_a_window_not_for_the_text() -> None:
    text = b'{"k": "' + b'a\\"[' * (1 << 20) + b'"}'  # 4 MiB, quotes and brackets throughout
    tracemalloc.start()
    try:
        assert _json.nesting_depth(text, window=32 << 10) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(text) // 2, peak  # a whole-text scan takes ~27 bytes per byte


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet="ab0123456789 ", max_size=40),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=120,
)


def _typed(v):
    """A value with its types spelled out (1 == 1.0 == True would hide a changed type)."""
    if isinstance(v, dict):
        return {k: _typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_typed(x) for x in v]
    return (type(v).__name__, repr(v))


@given(_VALUES)
def test_parse_gives_exactly_what_json_loads_gives_big_integers_included(value) -> None:
    # orjson reads an integer beyond 64 bits as a float: parse() must notice, in a small
    # document (its value is looked at) and in a large one (its bytes are scanned)
    for doc in (value, [value, *range(_json._WALK_BUDGET)]):
        text = json.dumps(doc).encode()
        assert _typed(_json.parse(text)) == _typed(json.loads(text))


def test_a_text_document_with_many_digits_is_parsed_by_orjson_alone(monkeypatch) -> None:
    # a run of 16-18 digits is common (timestamps, floats); only 19 can be beyond 64 bits
    doc = {"id": 7, "text": " ".join(["0.8444218515250481 word"] * 200)}
    big = json.dumps({**doc, "big": 2**65})
    assert _typed(_json.parse(big)) == _typed({**doc, "big": 2**65})  # found: an exact int
    called = []
    monkeypatch.setattr(_json, "_LONG_DIGITS", type("R", (), {"search": called.append})())
    assert _typed(_json.parse(json.dumps(doc))) == _typed(doc)
    assert called == []  # the value held no large float: the bytes were not searched
