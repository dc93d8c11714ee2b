"""The ``dedupe.minhash`` section of a dedupe config (:mod:`lmdata.dolma.minhash`), checked in
one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmdata.dolma._checks import as_int
from lmdata.errors import InvalidInputError

MAX_NGRAM = 64  # words in an n-gram at most (the C kernel's bound)
MAX_HASHES = 1024  # num_bands * band_size at most


@dataclass(frozen=True)
class MinHash:
    """MinHash-LSH settings: word ``ngram_size``-grams (after normalisation), ``num_bands``
    bands of ``band_size`` hash values (``num_bands * band_size`` hash functions from
    ``seed``); candidate pairs (a shared band) are confirmed when the exact Jaccard of their
    n-gram sets is at least ``jaccard_threshold`` (0: every candidate pair is a pair)."""

    ngram_size: int = 5
    num_bands: int = 14
    band_size: int = 8
    jaccard_threshold: float = 0.8
    seed: int = 0

    @property
    def hashes(self) -> int:
        return self.num_bands * self.band_size


def minhash_section(v: dict[str, Any]) -> MinHash:
    """``dedupe.minhash`` (its attribute_name is read by the caller), with the defaults of
    :class:`MinHash`."""
    where = "dedupe.minhash"
    d = MinHash()
    n = as_int(v.get("ngram_size", d.ngram_size), f"{where}.ngram_size", 1)
    bands = as_int(v.get("num_bands", d.num_bands), f"{where}.num_bands", 1)
    size = as_int(v.get("band_size", d.band_size), f"{where}.band_size", 1)
    seed = as_int(v.get("seed", d.seed), f"{where}.seed")
    thr = v.get("jaccard_threshold", d.jaccard_threshold)
    if n > MAX_NGRAM:
        raise InvalidInputError(f"{where}.ngram_size must be at most {MAX_NGRAM}, got {n}")
    if bands * size > MAX_HASHES:
        raise InvalidInputError(
            f"{where}: num_bands * band_size is {bands * size}; at most {MAX_HASHES} hash "
            "functions (datatrove's and the issue's 14 x 8 = 112 is the usual choice)"
        )
    if seed >= 1 << 64:
        raise InvalidInputError(f"{where}.seed must be below 2**64, got {seed}")
    if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0 <= thr <= 1:
        raise InvalidInputError(
            f"{where}.jaccard_threshold must be a number in 0..1 (0: no check), got {thr!r}"
        )
    return MinHash(n, bands, size, float(thr), seed)
