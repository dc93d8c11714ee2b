"""Words, n-gram hashes, MinHash signatures and evaluation-set matching for MinHash dedupe
(:mod:`lmdata.dolma.minhash`) and ``decontaminate`` (:mod:`lmdata.dolma.decontam`), a batch
of documents per call into ``lmdata/_native/minhash.c`` (no Python work per word or n-gram), or into
the same numbers in numpy (:mod:`lmdata.dolma._shingle_py`) where no compiler built it.

Normalisation: a word is a run of letters, marks and digits (Unicode categories L, M, N;
any code point above U+FFFF counts as one), lower-cased (``str.lower`` of each code point that
lowers to one code point); everything else (punctuation, symbols, whitespace, line breaks)
only separates words. So case, punctuation and how the text is wrapped change no n-gram, and
n-grams run across line breaks. The fold table comes from this Python's ``unicodedata``: the
same on every worker of a job.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

import numpy as np

from lmdata._native import load
from lmdata.dolma import _shingle_py as _py

_C = load("minhash")  # lmdata/_native/minhash.c; None: numpy does the same
_READY = False
M64 = _py.M64


@functools.cache
def fold_table() -> np.ndarray:
    """uint32[65536]: each BMP code point folded (lower-cased letter, mark or digit), or 0
    for a separator."""
    out = np.zeros(0x10000, dtype=np.uint32)
    for c in range(0x10000):
        ch = chr(c)
        if unicodedata.category(ch)[0] in "LMN":
            low = ch.lower()
            out[c] = ord(low) if len(low) == 1 else c
    out.flags.writeable = False
    return out


def _kernel():  # the C module, its fold table set; None without it (or while tests say so)
    global _READY
    if _C is not None and not _READY:
        _C.set_fold(fold_table())
        _READY = True
    return _C


def in_c() -> bool:
    """True where the C kernels run."""
    return _kernel() is not None


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class HashFunctions:
    """MinHash's hash functions ``a[i] x + b[i] mod 2^64`` (top 32 bits), ``a`` odd, and the
    seed of the band keys: all from ``seed`` by splitmix64 (the same on any machine)."""

    a: np.ndarray
    b: np.ndarray
    key_seed: int

    @classmethod
    def make(cls, k: int, seed: int) -> HashFunctions:
        vals = [_splitmix((seed * 0x100000001 + i) & M64) for i in range(2 * k + 1)]
        a = np.array([v | 1 for v in vals[0 : 2 * k : 2]], dtype=np.uint64)
        b = np.array(vals[1 : 2 * k : 2], dtype=np.uint64)
        return cls(a, b, vals[-1])


def grams(texts: list[str], n: int, short: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(n-gram count of each text, every n-gram hash in order, repeats kept); ``short``: a
    text of 1..n-1 words gives one hash of all its words (else none)."""
    c = _kernel()
    if c is None:
        return _py.grams(texts, n, short, fold_table())
    counts, hashes = c.grams(texts, n, short)
    return np.frombuffer(counts, dtype=np.int64), np.frombuffer(hashes, dtype=np.uint64)


def spans(text: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hash, start, end) of each full n-gram of ``text``, in code points (str indices)."""
    c = _kernel()
    if c is None:
        return _py.spans(text, n, fold_table())
    h, s, e = c.spans(text, n)
    return (
        np.frombuffer(h, dtype=np.uint64),
        np.frombuffer(s, dtype=np.int64),
        np.frombuffer(e, dtype=np.int64),
    )


def sign(
    texts: list[str], n: int, fns: HashFunctions, rows: int, keep: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each text's LSH band keys ((texts, bands) uint64; 0 for a text without words), its
    n-gram count (short texts as in :func:`grams`) and, with ``keep``, its n-gram hashes."""
    if rows < 1 or len(fns.a) % rows:
        raise ValueError(f"{len(fns.a)} hash functions are not bands of {rows} rows")
    c = _kernel()
    if c is None:
        keys, counts, hashes = _py.sign(
            texts, n, fns.a, fns.b, rows, fns.key_seed, keep, fold_table()
        )
    else:
        kb, cb, hb = c.sign(texts, n, fns.a, fns.b, rows, fns.key_seed, keep)
        keys = np.frombuffer(kb, dtype=np.uint64)
        counts = np.frombuffer(cb, dtype=np.int64)
        hashes = np.frombuffer(hb, dtype=np.uint64) if hb is not None else None
    return keys.reshape(len(texts), len(fns.a) // rows), counts, hashes


def jaccard(
    hashes: np.ndarray,
    starts: np.ndarray,
    ia: np.ndarray,
    ib: np.ndarray,
    in_place: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(intersection, union) sizes of the n-gram sets of docs ``ia[p]`` and ``ib[p]``, doc d
    being ``hashes[starts[d]:starts[d + 1]]`` (repeats allowed). ``in_place``: ``hashes`` (a
    writable uint64 array) may be reordered within each document (no copy is made)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    ia = np.ascontiguousarray(ia, dtype=np.int64)
    ib = np.ascontiguousarray(ib, dtype=np.int64)
    c = _kernel()
    if c is None:
        return _py.jaccard(hashes, starts, ia, ib)
    ok = in_place and hashes.dtype == np.uint64 and hashes.flags.writeable
    work = hashes if ok and hashes.flags.c_contiguous else np.array(hashes, dtype=np.uint64)
    inter, union = c.jaccard(work, starts, ia, ib)
    return np.frombuffer(inter, dtype=np.int64), np.frombuffer(union, dtype=np.int64)


def distinct(hashes: np.ndarray) -> np.ndarray:
    """The distinct values of ``hashes``, sorted (a sort and a pass: np.unique hashes first)."""
    keys = np.sort(np.asarray(hashes, dtype=np.uint64))
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if len(keys) else keys


@dataclass(frozen=True)
class Table:
    """An evaluation set's distinct n-gram hashes, sorted, with a directory of where each
    ``dbits``-bit prefix starts and a bitmap of the ``fbits``-bit prefixes present (so most
    lookups of a document's n-grams end in a few MB of cache)."""

    keys: np.ndarray
    dir: np.ndarray
    dbits: int
    bits: np.ndarray
    fbits: int

    @classmethod
    def build(cls, hashes: np.ndarray) -> Table:
        keys = distinct(hashes)
        n = len(keys)
        dbits = int(min(22, max(0, int(np.ceil(np.log2(max(n, 1)))) - 1)))
        fbits = int(min(30, dbits + 5)) if n else 0
        pre = keys >> np.uint64(64 - dbits) if dbits else np.zeros(n, dtype=np.uint64)
        d = np.searchsorted(pre, np.arange((1 << dbits) + 1, dtype=np.uint64)).astype(np.int64)
        bits = np.zeros(max(1, 1 << max(0, fbits - 6)), dtype=np.uint64)
        if n:
            f = keys >> np.uint64(64 - fbits)
            np.bitwise_or.at(bits, f >> np.uint64(6), np.uint64(1) << (f & np.uint64(63)))
        return cls(keys, d, dbits, bits, fbits)


def match(texts: list[str], n: int, table: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(text number, start, end) of every span of the texts covered by n-grams in ``table``,
    in code points; overlapping or touching n-grams make one span; in order."""
    c = _kernel()
    if c is None:
        return _py.match(texts, n, table.keys, fold_table())
    d, s, e = c.match(texts, n, table.keys, table.dir, table.dbits, table.bits, table.fbits)
    return (
        np.frombuffer(d, dtype=np.int64),
        np.frombuffer(s, dtype=np.int64),
        np.frombuffer(e, dtype=np.int64),
    )
