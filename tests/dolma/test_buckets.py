"""dedupe's bucket records: the hash unit's column buffer and the write phase's walk over a
file's marks give what the plain Python structures they replace give."""

from __future__ import annotations

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.dolma._buckets import MARK, Dups, Rows


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
