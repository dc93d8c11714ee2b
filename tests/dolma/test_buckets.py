"""dedupe's bucket records: the hash unit's column buffer and the write phase's walk over a
file's marks give what the plain Python structures they replace give."""

from __future__ import annotations

import tempfile
import uuid

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.dolma._buckets import MARK, Dups, Rows, Spill


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(), st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4))))
def test_buffered_columns_are_the_keys_hashes_and_places(rows):
    """The hash unit's column buffer gives each key's xxh3-128 halves and its place, in order."""
    buf = Rows()
    for key, where in rows:
        buf.add(key, *where)
    got = buf.entries()
    assert len(buf) == len(got) == len(rows)
    for rec, (key, where) in zip(got.tolist(), rows, strict=True):
        h = xxhash.xxh3_128_intdigest(key.encode("utf-8", "surrogatepass"))
        assert rec == (h >> 64, h & (2**64 - 1), *where)
    buf.clear()
    assert len(buf) == 0 and len(buf.entries()) == 0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4), st.integers(0, 5)), unique=True),
    st.data(),
)
def test_a_files_marks_walked_in_order_are_its_marks(places, data):
    """Asked for paragraphs in write order, the pointer walk gives each paragraph's marked
    n-grams, as a dict of sets would, and None where nothing is marked."""
    marks = np.array(places, dtype=MARK.descr[1:])  # (line, para, sub)
    marks = marks[np.lexsort((marks["sub"], marks["para"], marks["line"]))]
    want: dict = {}
    for line, para, sub in places:
        want.setdefault((line, para), set()).add(sub)
    asked = data.draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 5)), unique=True))
    walk = Dups(marks)
    for line, para in sorted(asked):
        assert walk.get(line, para) == want.get((line, para))


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 30)), max_size=12),
    st.integers(1, 200),
)
def test_a_store_fetches_pieces_in_batches_and_in_order(pieces, fetch_bytes):
    """On a store, pieces are fetched several at a time (cat_ranges, at most about FETCH_BYTES
    a call) and come back in order, as the local folder gives them; a piece past an object's
    end is a CorruptDataError naming it."""
    import pytest

    from lmdata.dolma import _buckets
    from lmdata.errors import CorruptDataError
    from lmdata.storage import resolve

    objs = [np.arange(k * 100, k * 100 + 25, dtype=np.uint32) for k in range(3)]
    root = f"memory://buckets-{uuid.uuid4().hex}"
    store, key = resolve(root)
    local = Spill(tempfile.mkdtemp())
    local.make()
    for k, arr in enumerate(objs):
        store.put(f"{key}/h/{k}", arr.tobytes())
        local.save("h", str(k), arr)
    ranges = [(f"h/{k}", min(a, b), max(a, b)) for k, a, b in pieces]
    ok = [r for r in ranges if r[2] <= 25]
    want = np.concatenate([objs[int(n[2:])][a:b] for n, a, b in ok] or [np.zeros(0, np.uint32)])
    remote = Spill(root)
    calls = []
    fs = remote._where[0].fs
    real = fs.cat_ranges
    held = _buckets.FETCH_BYTES
    _buckets.FETCH_BYTES = fetch_bytes
    try:
        fs.cat_ranges = lambda p, st, en, **kw: (
            calls.append([e - b for b, e in zip(st, en, strict=True)]) or real(p, st, en, **kw)
        )
        got = remote.load(ok, np.dtype(np.uint32))
        assert np.array_equal(got, want)
        assert np.array_equal(local.load(ok, np.dtype(np.uint32)), want)
        nonempty = sum(b > a for _, a, b in ok)
        assert sum(map(len, calls)) == nonempty  # every non-empty piece, once
        assert all(sum(c) >= fetch_bytes for c in calls[:-1])  # full batches...
        assert all(sum(c[:-1]) < fetch_bytes for c in calls)  # ...closed once full
        bad = [r for r in ranges if r[2] > 25 and r[2] > r[1]]  # (an empty piece reads nothing)
        if bad:
            with pytest.raises(CorruptDataError, match="ends early"):
                remote.load(bad, np.dtype(np.uint32))
    finally:
        _buckets.FETCH_BYTES = held
        del fs.cat_ranges
        store.remove(key)
        local.remove()
