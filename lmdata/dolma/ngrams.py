"""Paragraph n-grams as dolma 1.2.1's deduper checks them (``dedupe.paragraphs.by_ngram``).

Written from dolma's documentation and from its output on probe corpora:

- tokens are the Unicode (UAX #29) word-bound segments of the paragraph, whitespace-only
  segments dropped (punctuation stays: ``"Hello, world"`` is ``Hello`` ``,`` ``world``);
- the windows of ``ngram_length`` tokens are checked in order; with a ``stride`` a window is
  checked when it starts ``stride`` or more tokens after the last checked one, and the second
  window is always checked (dolma tests the last start against 0);
- a paragraph with fewer than two checked windows is checked once more as a whole (unless
  ``skip_short_paragraphs``); with ``ngram_length`` 1 that key is the one-token window itself;
- the score is ``duplicates / checked`` in 32-bit floats, compared with the 32-bit threshold,
  and written as the float64 of that float32 (``2/3`` is ``0.6666666865348816``); a paragraph
  that fell back scores ``1.0`` when its whole text was seen before.

A key is a duplicate when any earlier key (in input order) was the same: dolma's Bloom filter
inserts every key it checks, so this is its result without false positives.
"""

from __future__ import annotations

import numpy as np
import regex

from lmdata.dolma.config import Ngrams

_BOUNDS = regex.compile(r"(?wV1)\b")  # the WORD flag: Unicode default word boundaries
_SPACE = regex.compile(r"\p{White_Space}+")  # Rust's char::is_whitespace


__all__ = ["Ngrams", "keys", "score", "tokens"]


def tokens(paragraph: str) -> list[str]:
    """The word-bound segments of ``paragraph`` that are not only whitespace."""
    return [t for t in _BOUNDS.split(paragraph) if t and not _SPACE.fullmatch(t)]


def keys(paragraph: str, ng: Ngrams) -> tuple[list[str], bool]:
    """The keys ``paragraph`` checks, in dolma's order, and whether the last one is the whole
    paragraph (the fallback). Keys of windows and of whole paragraphs share one namespace,
    as in dolma's filter: ``<items>\\0<item>\\0<item>...``."""
    toks = tokens(paragraph)
    n = ng.length
    out = []
    last = 0
    for start in range(len(toks) - n + 1):
        if last == 0 or start - last >= ng.stride:
            last = start
            out.append(f"{n}\0" + "\0".join(toks[start : start + n]))
    fallback = len(out) < 2 and not ng.skip_short
    if fallback:
        out.append("1\0" + paragraph)
    return out, fallback


def score(paragraph: str, ng: Ngrams, dup_subs: set[int]) -> float | None:
    """The span score of a paragraph whose keys number ``dup_subs`` were duplicates, or None
    when it is not flagged."""
    ks, fallback = keys(paragraph, ng)
    if fallback:
        return 1.0 if len(ks) - 1 in dup_subs else None
    if not ks:  # skip_short_paragraphs and no window: 0/0 is never above a threshold
        return None
    frac = np.float32(sum(1 for j in dup_subs if j < len(ks))) / np.float32(len(ks))
    return float(frac) if frac >= np.float32(ng.threshold) else None
