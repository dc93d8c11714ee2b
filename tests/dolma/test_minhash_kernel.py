"""The near-duplicate kernels (lmdata/_native/minhash.c) give exactly the numpy twin's numbers
(lmdata/dolma/_shingle_py.py), and the numbers mean what the docs say: normalisation folds
case, punctuation and line wrapping; Jaccard counts are exact; matched spans cover the
evaluation passage.

The numpy side runs in every test run; the C side of each comparison is skipped where no
compiler built the kernel."""

from __future__ import annotations

import re
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.dolma import _shingle
from lmdata.dolma import _shingle_py as py

pytestmark = pytest.mark.native  # run again with LMDATA_PURE_PYTHON=1 (make test)

needs_c = pytest.mark.skipif(
    _shingle._C is None, reason="the C kernel lmdata._native.minhash is not built"
)
FNS = _shingle.HashFunctions.make(24, 3)


@contextmanager
def numpy_only():
    saved = _shingle._C
    _shingle._C = None
    try:
        yield
    finally:
        _shingle._C = saved


def both(fn, *args):
    """``fn(*args)`` with the C kernel and with numpy."""
    got = fn(*args)
    with numpy_only():
        want = fn(*args)
    return got, want


def _same(a, b) -> None:
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif a is None:
        assert b is None
    else:
        assert np.asarray(a).dtype == np.asarray(b).dtype
        assert np.array_equal(np.asarray(a), np.asarray(b))


# text with words, punctuation, every kind of whitespace, case pairs, marks, CJK, surrogates,
# astral code points: each str kind of CPython (1, 2 and 4-byte)
ALPHABET = st.sampled_from(
    [
        *"abcXYZ019 \t\n\r.,;:!?'\"-_()",
        *["\u00e9", "\u00c9", "\u00df", "\u0130", "\u01c5", "\u03a3", "\u03c3", "\u03c2"],
        *["\u0416", "\u0436", "\u4e2d", "\u3002", "\u0301", "\u00a0", "\u2019", "\u2028"],
        *["\ud800", "\U0001f600", "\U0001d400", "\U00020000"],
    ]
)
texts = st.lists(ALPHABET, max_size=80).map("".join)


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(texts, max_size=6), st.integers(1, 6), st.booleans())
def test_c_and_numpy_give_the_same_hashes_signatures_and_spans(ts, n, short):
    _same(*both(_shingle.grams, ts, n, short))
    _same(*both(_shingle.sign, ts, n, FNS, 4, True))
    for t in ts:
        _same(*both(_shingle.spans, t, n))
    keys = _shingle.grams(ts[:2], n)[1]
    table = _shingle.Table.build(keys)
    _same(*both(_shingle.match, ts, n, table))


@needs_c
@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=40), min_size=1, max_size=8), st.data())
def test_c_and_numpy_count_the_same_intersections(sets, data):
    hashes = np.concatenate([np.array(s, dtype=np.uint64) for s in sets])
    starts = np.concatenate(([0], np.cumsum([len(s) for s in sets]))).astype(np.int64)
    idx = st.integers(0, len(sets) - 1)
    pairs = data.draw(st.lists(st.tuples(idx, idx), max_size=10))
    ia = np.array([a for a, _ in pairs], dtype=np.int64)
    ib = np.array([b for _, b in pairs], dtype=np.int64)
    got, want = both(_shingle.jaccard, hashes, starts, ia, ib)
    _same(got, want)
    for (a, b), i, u in zip(pairs, *got, strict=True):
        assert (i, u) == (len(set(sets[a]) & set(sets[b])), len(set(sets[a]) | set(sets[b])))


def test_words_fold_case_punctuation_and_wrapping():
    a = "The quick brown fox, jumps over the lazy dog!"
    b = "the QUICK\nbrown fox jumps...\r\n over -- the\tlazy   dog"
    for run in (
        lambda: _shingle.grams([a, b], 3),
        lambda: _numpy(lambda: _shingle.grams([a, b], 3)),
    ):
        counts, hashes = run()
        assert list(counts) == [7, 7]
        assert np.array_equal(hashes[:7], hashes[7:])
    # an accent is part of its word, a changed word changes the n-grams that hold it
    c1 = _shingle.grams(["école normale supérieure"], 3)[1]
    c2 = _shingle.grams(["ÉCOLE Normale Supérieure"], 3)[1]
    c3 = _shingle.grams(["ecole normale superieure"], 3)[1]
    assert np.array_equal(c1, c2) and not np.array_equal(c1, c3)


def _numpy(fn):
    with numpy_only():
        return fn()


def test_short_texts_give_one_ngram_only_when_asked():
    counts, _ = _shingle.grams(["", "one two", "a b c d e", ". , !"], 5, short=True)
    assert list(counts) == [0, 1, 1, 0]
    counts, _ = _shingle.grams(["", "one two", "a b c d e"], 5)
    assert list(counts) == [0, 0, 1]
    keys, counts, _ = _shingle.sign(["", "x y z", "x y z"], 5, FNS, 4)
    assert list(counts) == [0, 1, 1] and not keys[0].any()
    assert np.array_equal(keys[1], keys[2])


def test_spans_are_code_point_ranges_of_the_ngrams():
    text = "Ünï, code\npoints 😀 here and there"
    h, s, e = _shingle.spans(text, 2)
    words = [(m.start(), m.end()) for m in re.finditer(r"[^\W_]+|😀", text)]
    assert [(a, b) for a, b in zip(s, e, strict=True)] == [
        (words[j][0], words[j + 1][1]) for j in range(len(words) - 1)
    ]
    assert len(set(h.tolist())) == len(h)


def test_jaccard_of_documents_at_known_overlap():
    base = [f"w{i}" for i in range(24)]  # 20 distinct 5-grams
    other = [*base[:12], "x", *base[13:]]  # word 12 changed: 5 of the 20 n-grams differ
    _, hashes = _shingle.grams([" ".join(base), " ".join(other)], 5)
    starts = np.array([0, 20, 40])
    inter, union = _shingle.jaccard(hashes, starts, np.array([0, 0]), np.array([1, 0]))
    assert list(inter) == [15, 20] and list(union) == [25, 20]


def test_signatures_estimate_jaccard():
    """The share of equal signature values estimates the Jaccard of the n-gram sets (as a
    MinHash must), here within 4 standard errors over 512 hash functions."""
    fns = _shingle.HashFunctions.make(512, 0)
    rng = np.random.default_rng(0)
    for shared in (50, 200, 350):
        a = rng.integers(0, 2**63, 400, dtype=np.uint64)
        b = np.concatenate((a[:shared], rng.integers(0, 2**63, 400 - shared, dtype=np.uint64)))
        j = shared / (800 - shared)
        sig = []
        for x in (a, b):
            v = x[:, None] * fns.a[None, :] + fns.b[None, :]
            sig.append(v.min(axis=0) >> np.uint64(32))
        est = float(np.mean(sig[0] == sig[1]))
        assert abs(est - j) < 4 * np.sqrt(j * (1 - j) / 512), (shared, est, j)


def test_band_keys_follow_the_signature_in_c_and_numpy():
    texts = ["alpha beta gamma delta epsilon zeta eta theta", "one two three four five six"]
    keys, counts, hashes = _shingle.sign(texts, 3, FNS, 4, keep=True)
    sig = np.zeros((2, 24), dtype=np.uint64)
    at = np.concatenate(([0], np.cumsum(counts)))
    for d in range(2):
        x = hashes[at[d] : at[d + 1]]
        sig[d] = (x[:, None] * FNS.a[None, :] + FNS.b[None, :]).min(axis=0) >> np.uint64(32)
    assert np.array_equal(keys, py.band_keys(sig, 4, FNS.key_seed))


def test_the_evaluation_table_finds_exactly_its_keys():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64)
    t = _shingle.Table.build(keys)
    assert t.dir[-1] == len(t.keys) == len(np.unique(keys))
    empty = _shingle.Table.build(np.zeros(0, dtype=np.uint64))
    assert _shingle.match(["a b c d"], 2, empty)[0].size == 0


@needs_c
def test_the_c_kernel_refuses_buffers_that_do_not_fit():
    c = _shingle._kernel()
    with pytest.raises(ValueError, match="n-gram size"):
        c.grams(["a"], 0, False)
    with pytest.raises(ValueError, match="bands"):
        c.sign(["a"], 2, FNS.a, FNS.b, 5, 0, False)
    h = np.zeros(4, dtype=np.uint64)
    with pytest.raises(ValueError, match="outside"):
        c.jaccard(h, np.array([0, 9], dtype=np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="names a doc"):
        c.jaccard(h, np.array([0, 4], dtype=np.int64), np.array([1]), np.array([0]))
    with pytest.raises(TypeError):
        c.grams([b"bytes"], 2, False)
    t = _shingle.Table.build(np.arange(10, dtype=np.uint64))
    with pytest.raises(ValueError, match="directory"):
        c.match(["a"], 2, t.keys, t.dir[::-1].copy(), t.dbits, t.bits, t.fbits)


@needs_c
def test_large_sets_are_sorted_and_counted_as_numpy_does():
    """Sets past the insertion-sort size are radix-sorted in C: the same counts as numpy's."""
    rng = np.random.default_rng(7)
    sizes = [0, 1, 47, 48, 300, 5000, 5000]
    parts = [rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True) for n in sizes]
    parts[-1] = np.concatenate((parts[-2][:2500], parts[-1][:2500], parts[-2][:100]))
    parts[3] = np.full(48, 7, dtype=np.uint64)  # one value: every byte shared
    hashes = np.concatenate(parts)
    starts = np.concatenate(([0], np.cumsum([len(p) for p in parts]))).astype(np.int64)
    n = len(parts)
    ia = np.repeat(np.arange(n), n)
    ib = np.tile(np.arange(n), n)
    got, want = both(_shingle.jaccard, hashes, starts, ia, ib)
    _same(got, want)
    assert got[0][5 * n + 6] == 2500 and got[1][5 * n + 6] == 7500
