"""The kernels of ``lmdata/_native/minhash.c`` in numpy, for where no compiler built it: the same
numbers (words, n-gram hashes, signatures, band keys, Jaccard counts, matched spans), slower.
The tests compare the two on generated text. All arithmetic is on uint64 arrays, modulo 2^64
as in C."""

from __future__ import annotations

import numpy as np

U64 = np.uint64
P_WORD = 0x100000001B3
Q_GRAM = 0x9E3779B97F4A7C15
K_BAND = 0xD6E8FEB86659FD93
M64 = (1 << 64) - 1
_P_INV = pow(P_WORD, -1, 1 << 64)
_C1, _C2 = U64(0xFF51AFD7ED558CCD), U64(0xC4CEB9FE1A85EC53)
_S33 = U64(33)


def fmix(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, elementwise (a new array)."""
    h = np.asarray(h, dtype=U64).copy()
    h ^= h >> _S33
    h *= _C1
    h ^= h >> _S33
    h *= _C2
    h ^= h >> _S33
    return h


def fmix_int(h: int) -> int:
    """:func:`fmix` of one Python integer."""
    return int(fmix(np.array([h & M64], dtype=U64))[0])


def _powers(base: int, n: int) -> np.ndarray:
    """``base ** i mod 2^64`` for i in 0..n-1."""
    out = np.empty(n, dtype=U64)
    if n:
        out[0] = 1
        out[1:] = np.cumprod(np.full(n - 1, base, dtype=U64), dtype=U64)
    return out


def words(text: str, fold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hash, start, end) of each word of ``text``: the code points the fold table maps to
    non-zero (above U+FFFF: as they are), hashed as ``fmix64(sum f_i P^i + length)``."""
    cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    f = np.where(cp < 0x10000, fold[np.minimum(cp, 0xFFFF)], cp).astype(U64)
    inside = np.concatenate(([0], (f != 0).view(np.int8) if len(f) else [], [0])).astype(np.int8)
    edges = np.flatnonzero(np.diff(inside))
    starts, ends = edges[0::2], edges[1::2]
    if not len(starts):
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros(0, dtype=U64), empty, empty
    sums = np.add.reduceat(f * _powers(P_WORD, len(f)), starts, dtype=U64)
    raw = sums * _powers(_P_INV, len(f))[starts] + (ends - starts).astype(U64)
    return fmix(raw), starts.astype(np.int64), ends.astype(np.int64)


def gram_hashes(w: np.ndarray, n: int, short: bool) -> np.ndarray:
    """The n-gram hashes of word hashes ``w``: ``fmix64(sum_k w[j+k] Q^k)`` per n-gram; with
    ``short`` a text of 1..n-1 words gives one over all its words."""
    m = len(w)
    width = n if m >= n else (m if short and m else 0)
    if not width:
        return np.zeros(0, dtype=U64)
    count = m - width + 1
    h = np.zeros(count, dtype=U64)
    q = 1
    for k in range(width):
        h += w[k : k + count] * U64(q)
        q = q * Q_GRAM & M64
    return fmix(h)


def grams(texts: list[str], n: int, short: bool, fold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(counts, hashes) as ``minhash.grams``."""
    parts = [gram_hashes(words(t, fold)[0], n, short) for t in texts]
    counts = np.array([len(p) for p in parts], dtype=np.int64)
    return counts, np.concatenate(parts) if parts else np.zeros(0, dtype=U64)


def spans(text: str, n: int, fold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashes, starts, ends) of each full n-gram, as ``minhash.spans``."""
    h, s, e = words(text, fold)
    g = gram_hashes(h, n, False)
    return g, s[: len(g)], e[n - 1 : n - 1 + len(g)]


def band_keys(sig: np.ndarray, rows: int, seed: int) -> np.ndarray:
    """(docs, bands) keys of (docs, k) signatures (uint64 holding 32-bit values)."""
    docs, k = sig.shape
    out = np.empty((docs, k // rows), dtype=U64)
    for j in range(k // rows):
        h = np.full(docs, fmix_int(seed ^ (j * K_BAND & M64)), dtype=U64)
        for r in range(rows):
            h = (h ^ sig[:, j * rows + r]) * U64(K_BAND)
        out[:, j] = fmix(h)
    return out


def sign(
    texts: list[str],
    n: int,
    a: np.ndarray,
    b: np.ndarray,
    rows: int,
    key_seed: int,
    keep: bool,
    fold: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(keys, counts, hashes or None) as ``minhash.sign``."""
    counts, hashes = grams(texts, n, True, fold)
    k = len(a)
    sig = np.zeros((len(texts), k), dtype=U64)
    at = np.concatenate(([0], np.cumsum(counts)))
    for d in range(len(texts)):
        x = hashes[at[d] : at[d + 1]]
        if not len(x):
            continue
        low = np.full(k, M64, dtype=U64)
        for c in range(0, len(x), 4096):  # bounded (4096, k) blocks
            v = x[c : c + 4096, None] * a[None, :] + b[None, :]
            np.minimum(low, v.min(axis=0), out=low)
        sig[d] = low >> U64(32)
    keys = band_keys(sig, rows, key_seed)
    keys[counts == 0] = 0
    return keys.reshape(-1), counts, hashes if keep else None


def jaccard(
    hashes: np.ndarray, starts: np.ndarray, ia: np.ndarray, ib: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(intersection, union) sizes of the pairs' n-gram sets, as ``minhash.jaccard``."""
    sets = [np.unique(hashes[starts[d] : starts[d + 1]]) for d in range(len(starts) - 1)]
    inter = np.array(
        [
            len(np.intersect1d(sets[i], sets[j], assume_unique=True))
            for i, j in zip(ia, ib, strict=True)
        ],
        dtype=np.int64,
    )
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    union = sizes[np.asarray(ia, dtype=np.int64)] + sizes[np.asarray(ib, dtype=np.int64)] - inter
    return inter, union.astype(np.int64)


def match(
    texts: list[str], n: int, keys: np.ndarray, fold: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc, start, end) of the merged spans of n-grams found in ``keys``, as
    ``minhash.match``."""
    docs, starts, ends = [], [], []
    for d, t in enumerate(texts):
        g, s, e = spans(t, n, fold)
        hit = np.isin(g, keys)
        if not hit.any():
            continue
        s, e = s[hit], e[hit]
        new = np.concatenate(([True], s[1:] > e[:-1]))  # ends ascend with the n-grams
        first = np.flatnonzero(new)
        starts.append(s[first])
        ends.append(np.maximum.reduceat(e, first))
        docs.append(np.full(len(first), d, dtype=np.int64))
    if not docs:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    return np.concatenate(docs), np.concatenate(starts), np.concatenate(ends)
