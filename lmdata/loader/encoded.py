"""The Loader's fast path: a source whose reader stores ``id*2 + start bit`` (:class:`lmdata.
protocols.EncodedTokens`, flat-tokens) is read as stored. Packed rows and eos windows never
touch the sequence index (each stored token carries its document-start bit); where the reader
knows where its chunks lie, the C kernel lays a batch out from there in one call, no gather.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from lmdata.loader.packing import (
    PACKED_KEYS,
    Parts,
    eos_from_encoded,
    fill_packed,
    in_c,
    laid_out_at,
    packed_buffers,
    packed_from_encoded,
    packed_out,
    segment_rows,
    segment_rows_at,
    unpacked_from_encoded,
)
from lmdata.loader.spans import Source
from lmdata.protocols import EncodedTokens

_SCRATCH = threading.local()


def _scratch(shape: tuple[int, int]) -> np.ndarray:
    """A uint32 array of ``shape`` reused by this thread: stored values are gathered into it
    and expanded out of it (fresh memory per batch costs page faults)."""
    a = getattr(_SCRATCH, "enc", None)
    if a is None or a.shape != shape:
        a = _SCRATCH.enc = np.empty(shape, dtype=np.uint32)
    return a


class EncodedSource(Source):
    """A :class:`~lmdata.loader.spans.Source` over an :class:`EncodedTokens` reader: rows laid
    out from stored windows where they lie (one C call per batch where it can), gathered
    into the batch's memory where not; ``span`` only for the windows that run off the end."""

    reader: EncodedTokens

    def __init__(self, reader: EncodedTokens, mode: str, seq_len: int, **options: Any) -> None:
        super().__init__(reader, mode, seq_len, **options)
        # training's packed rows and eos windows, laid out in C from where they lie
        self._direct = mode in ("packed", "eos") and not self.finite
        # ... looked up by the same C call, from row numbers (one call per batch)
        self._into = reader.encoded_windows_into if self._direct else None
        # bestfit rows: their segments' windows found and laid out by one C call too
        self._seg_into = reader.encoded_windows_into if mode == "bestfit" else None

    def _read_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        L = self.seq_len
        if self._into is not None:  # the common cases: one C call
            out = laid_out_at(self._into, self._eos, rows, L, self.dtype, self.bos)
            if out is not None:
                return out
        if self._direct and in_c():  # the same, rows looked up first
            if self._eos:  # windows of L + 1 from row starts (inside: full rows)
                parts = self.reader.encoded_window_parts(rows * L, L + 1)
                if parts is not None:
                    return eos_from_encoded(parts, self.dtype, (len(rows), L + 1))
            else:
                parts = self.reader.encoded_window_parts(rows, L, scale=L)
                if parts is not None:
                    out = packed_buffers(len(rows), L, self.dtype, PACKED_KEYS)
                    fill_packed(parts, out, self.bos)
                    return out
        partial = rows >= self.full_rows if self.finite else None
        if self.mode == "packed" and (partial is None or not partial.any()):
            # gathered straight into the batch's memory and expanded there
            out, enc = packed_out(len(rows), L, self.dtype)
            parts = self._where(rows * L, L)
            if parts is not None:
                fill_packed(parts, out, self.bos)
            else:
                self.reader.encoded_windows(rows, L, scale=L, out=enc)
                fill_packed(enc, out, self.bos)
            return self._padded(out, rows, partial)
        starts = rows.astype(np.int64) * L
        width = L + self._eos
        values = self._stored(starts, width)
        shape = (len(starts), width)
        if self._eos:
            out = eos_from_encoded(values, self.dtype, shape)
        else:
            out = packed_from_encoded(values, self.dtype, self.bos, shape)
        return self._padded(out, rows, partial)

    def _where(self, starts: np.ndarray, length: int) -> Parts | None:
        """The stored windows ``tokens[s : s + length]`` where they lie in memory, when the
        layouts run in C (:func:`packing.in_c`); else None."""
        return self.reader.encoded_window_parts(starts, length) if in_c() else None

    def _stored(self, starts: np.ndarray, length: int) -> np.ndarray | Parts:
        """Stored windows ``tokens[s : s + length]`` for each start, zero past the end, or
        where they lie."""
        n = self.num_tokens
        if not (starts + length > n).any():
            parts = self._where(starts, length)
            if parts is not None:
                return parts
            # into a recycled scratch: the layout copies out of it
            return self.reader.encoded_windows(starts, length, out=_scratch((len(starts), length)))
        read = self.reader.span_encoded
        out = np.zeros((len(starts), length), dtype=np.uint32)
        for i, s in enumerate(starts.tolist()):
            got = read(s, min(s + length, n))
            out[i, : len(got)] = got
        return out

    def _unpacked(self, a: np.ndarray, z: np.ndarray) -> dict[str, np.ndarray]:
        L, n = self.seq_len, self.num_tokens
        if n < L:
            return super()._unpacked(a, z)
        # one gather of L stored tokens from each piece's start (from n - L for pieces in the
        # last L tokens, moved into place after), decoded, masked past the piece
        s = np.minimum(a, n - L)
        enc: np.ndarray | Parts | None = self._where(s, L)
        if enc is None:
            enc = self.reader.encoded_windows(s, L, out=_scratch((len(s), L)))
        return unpacked_from_encoded(
            enc, a - s, z - a, self.dtype, self.bos, self.pad_id, seq_len=L
        )

    def _segment_rows(
        self,
        row: np.ndarray,
        s: np.ndarray,
        off: np.ndarray,
        length: np.ndarray,
        width: int,
        rows: int,
    ) -> dict[str, np.ndarray]:
        L = self.seq_len
        if self._seg_into is not None:  # the common case: one C call
            out = segment_rows_at(
                self._seg_into, s, width, off, length, row, rows, L, self.dtype, self.bos,
                self.pad_id,
            )  # fmt: skip
            if out is not None:
                return out
        enc: np.ndarray | Parts | None = self._where(s, width)
        if enc is None:
            enc = self.reader.encoded_windows(s, width, out=_scratch((len(s), width)))
        return segment_rows(
            enc, width, off, length, row, rows, L, self.dtype, self.bos, self.pad_id, 1
        )
