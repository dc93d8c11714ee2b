"""A reader's sequence index as the bestfit layout and ``explain`` read it: searches and short
runs of it, never the whole of it where the reader can read it in parts (flat-tokens)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError
from lmdata.protocols import SequenceIndex, satisfies


class Documents:
    """The sequence boundaries of a reader, read where needed: by contiguous runs
    (``sequence_starts``) and gathers (``sequence_ranges``) of its index where it has them
    (flat-tokens never loads its index), else from the whole ``boundaries`` array."""

    def __init__(self, reader: Any, num_docs: int, num_tokens: int, boundaries: Any) -> None:
        self.reader = reader
        self.n, self.tokens = num_docs, num_tokens
        self._bounds = boundaries  # a function giving the whole int64 array, when used
        lazy = satisfies(reader, SequenceIndex)
        self._ranges = reader.sequence_ranges if lazy else None
        self._run = reader.sequence_starts if lazy else None

    def ranges(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, stop) int64 of documents ``docs`` (each in 0 .. n-1)."""
        if self._ranges is not None:
            r = np.asarray(self._ranges(np.asarray(docs, dtype=np.int64)), dtype=np.int64)
            return r[:, 0], r[:, 1]
        b = self._bounds()
        return b[docs], b[docs + 1]

    def starts(self, lo: int, hi: int) -> np.ndarray:
        """The starts of documents ``lo .. hi - 1`` (document n's is the token count)."""
        if self._run is not None:
            return self._run(lo, hi)
        return self._bounds()[lo:hi]

    def containing(self, t: np.ndarray) -> np.ndarray:
        """For each token ``t`` (0 <= t < tokens), the document holding it: the last ``d``
        whose start is at most ``t``."""
        t = np.asarray(t, dtype=np.int64)
        if self._ranges is None:
            return np.searchsorted(self._bounds(), t, side="right") - 1
        lo, hi = self.bracket(t, 8)
        # the documents strictly between lo and hi, gathered at once: those starting by t
        inner = lo[:, None] + np.arange(1, 8, dtype=np.int64)
        inside = inner < hi[:, None]
        starts = self.ranges(np.where(inside, inner, 0).reshape(-1))[0].reshape(inner.shape)
        return lo + ((starts <= t[:, None]) & inside).sum(axis=1)

    def bracket(self, t: np.ndarray, narrow: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) for each token ``t``: the document holding it is in ``lo .. hi - 1``,
        at most ``narrow`` documents apart. Without the whole index: an interpolation search guarded
        by bisection (a gather of three index entries per search a round, for all ``t`` at
        once; a few rounds: documents of random lengths put a guess off by a few square roots
        of the bracket's width, so a probe on each side of it usually brackets ``t``)."""
        t = np.asarray(t, dtype=np.int64)
        if self._ranges is None:
            lo = np.searchsorted(self._bounds(), t, side="right") - 1
            return lo, lo + 1
        lo = np.zeros(len(t), dtype=np.int64)  # start(lo) <= t < start(hi)
        hi = np.full(len(t), self.n, dtype=np.int64)
        s_lo = np.zeros(len(t), dtype=np.int64)
        s_hi = np.full(len(t), self.tokens, dtype=np.int64)
        for _ in range(130):  # (bisection halves every bracket each round: at most 64)
            if not len(t) or int((hi - lo).max()) <= narrow:
                return lo, hi
            wide = hi - lo > narrow
            guess = lo + (t - s_lo) * (hi - lo) // np.maximum(s_hi - s_lo, 1)
            near = 4 * np.sqrt(hi - lo).astype(np.int64) + 1
            cand = np.stack([guess - near, guess + near, (lo + hi) // 2])
            cand = np.clip(cand, lo + 1, np.maximum(hi - 1, lo + 1))
            probes = np.where(wide, cand, 0)  # (narrow ones probe doc 0)
            start = self.ranges(probes.reshape(-1))[0].reshape(3, -1)
            for p, s in zip(probes, start, strict=True):
                below = wide & (s <= t) & (p > lo) & (p < hi)
                lo = np.where(below, p, lo)
                s_lo = np.where(below, s, s_lo)
                above = wide & (s > t) & (p > lo) & (p < hi)
                hi = np.where(above, p, hi)
                s_hi = np.where(above, s, s_hi)
        raise CorruptDataError(  # pragma: no cover - a non-monotone index
            "the sequence index is not ordered (a search did not end); run `lmdata validate`",
            path=str(self.reader),
        )
