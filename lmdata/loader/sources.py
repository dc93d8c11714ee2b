"""One token source as the loader sees it: a count of rows and a way to read any of them.

A source wraps a token-sequence reader (``lmdata.protocols.TokenSequences``). Readers that
also offer the stored flat-tokens values (``encoded_windows`` / ``packed_rows``, found by duck
typing) are read without ever touching their sequence index in packed and eos modes: the start
bit is in each stored token. Other readers are read through ``span`` and ``boundaries``.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.loader.packing import (
    eos_from_encoded,
    eos_windows,
    fill_packed,
    packed_buffers,
    packed_from_encoded,
    packed_from_starts,
    pad_tail,
    starts_in_rows,
    unpacked_rows,
)

MODES = ("packed", "eos", "unpacked")
LONG_DOCS = ("truncate", "split", "error")
_NEEDS = ("span", "boundaries", "num_tokens", "__len__")


def open_source(source: Any, token_column: str | None, split: str | None) -> Any:
    """A token-sequence reader from a reader or a path (``token_column`` for record datasets)."""
    from lmdata._api import open as open_dataset
    from lmdata._api import token_view

    reader = source
    if isinstance(source, (str, os.PathLike)):
        reader = open_dataset(source, split=split, token_column=token_column)
    elif token_column is not None and getattr(reader, "token_column", None) != token_column:
        reader = token_view(reader, token_column)
    missing = [a for a in _NEEDS if not _has(reader, a)]
    if missing:
        raise InvalidInputError(
            f"the Loader needs a token-sequence reader; {reader!r} has no {missing[0]!r}. "
            "Tokenize the dataset first (`lmdata tokenize`), or pass token_column= naming the "
            "column that holds token ids"
        )
    return reader


def _takes_out(fn: Any) -> bool:
    """Whether ``fn`` accepts ``out=`` (an ``encoded_windows`` that gathers in place)."""
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _has(obj: Any, name: str) -> bool:
    """``hasattr`` without evaluating properties (``boundaries`` may read a whole index)."""
    return hasattr(type(obj), name) or name in getattr(obj, "__dict__", {})


class Source:
    """Rows of one reader in one mode: ``num_rows`` and ``read(rows)``.

    ``finite`` (an evaluation pass) keeps the partial last row of packed/eos data, padded;
    training drops it so every row is full.
    """

    def __init__(
        self,
        reader: Any,
        mode: str,
        seq_len: int,
        *,
        finite: bool,
        long_docs: str,
        dtype: np.dtype,
        bos: int,
        pad_id: int,
    ) -> None:
        self.reader = reader
        self.mode = mode
        self.seq_len = seq_len
        self.dtype, self.bos, self.pad_id = dtype, bos, pad_id
        self.long_docs = long_docs
        self.finite = finite
        self.num_tokens = int(reader.num_tokens)
        self._windows = getattr(reader, "encoded_windows", None)
        self._windows_out = self._windows is not None and _takes_out(self._windows)
        self._encoded = getattr(reader, "span_encoded", None)
        self._pieces: np.ndarray | None = None
        L = seq_len
        if mode == "unpacked":
            if long_docs == "split":
                b = np.asarray(reader.boundaries, dtype=np.int64)
                per_doc = -(-np.diff(b) // L)
                self._pieces = np.concatenate([[0], np.cumsum(per_doc)])
                self.num_rows = int(self._pieces[-1])
            else:
                self.num_rows = len(reader)
            return
        usable = self.num_tokens if mode == "packed" else max(self.num_tokens - 1, 0)
        self.full_rows = usable // L
        self.num_rows = -(-usable // L) if finite else self.full_rows
        self._usable = usable

    def describe(self) -> dict[str, Any]:
        return {"name": repr(self.reader), "tokens": self.num_tokens, "rows": self.num_rows}

    # ---- reading ---------------------------------------------------------------------------

    def read(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``rows`` (int64 row numbers, each < ``num_rows``)."""
        if self.mode == "unpacked":
            return self._read_unpacked(rows)
        L = self.seq_len
        full = rows < self.full_rows
        if full.all():
            out = self._read_full(rows)
            if self.finite:
                out["loss_mask"] = np.ones(out["targets"].shape, dtype=bool)
            return out
        # the partial last row of a finite pass: read it short, pad it
        parts = []
        length = L if self.mode == "packed" else L + 1
        for i in np.flatnonzero(~full).tolist():
            start = int(rows[i]) * L
            part = self._read_one(start, min(start + length, self.num_tokens), length)
            part["loss_mask"] = np.ones(part["targets"].shape, dtype=bool)
            pad_tail(part, 0, self._usable - start, self.pad_id)
            parts.append((i, part))
        if full.any():
            head = self._read_full(rows[full])
            head["loss_mask"] = np.ones(head["targets"].shape, dtype=bool)
            parts.append((full, head))
        out = {}
        for k, a in parts[0][1].items():
            out[k] = np.empty((len(rows), *a.shape[1:]), dtype=a.dtype)
        for where, part in parts:
            for k, a in part.items():
                out[k][where] = a[0] if isinstance(where, int) else a
        return out

    def _read_full(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        L = self.seq_len
        length = L if self.mode == "packed" else L + 1
        starts = rows.astype(np.int64) * L
        if self._windows is not None:
            if self.mode == "packed" and self._windows_out and self.dtype == np.int32:
                # gathered straight into the targets' memory and decoded there
                out = packed_buffers(len(starts), L, self.dtype)
                enc = out["targets"].view(np.uint32)
                self._windows(starts, length, out=enc)
                fill_packed(enc, out, self.bos)
                return out
            enc = self._windows(starts, length)
        elif self._encoded is not None:
            enc = np.empty((len(starts), length), dtype=np.uint32)
            for i, s in enumerate(starts.tolist()):
                enc[i] = self._encoded(s, s + length)
        else:
            return self._read_generic(starts, length)
        if self.mode == "eos":
            return eos_from_encoded(enc, self.dtype)
        return packed_from_encoded(enc, self.dtype, self.bos)

    def _read_generic(self, starts: np.ndarray, length: int) -> dict[str, np.ndarray]:
        ids = np.empty((len(starts), length), dtype=np.int64)
        for i, s in enumerate(starts.tolist()):
            ids[i] = self.reader.span(s, s + length)
        if self.mode == "eos":
            return eos_windows(ids, self.dtype)
        is_start = starts_in_rows(self.reader.boundaries, starts, length)
        return packed_from_starts(ids, is_start, self.dtype, self.bos)

    def _read_one(self, start: int, stop: int, length: int) -> dict[str, np.ndarray]:
        """One row from ``start`` to ``stop`` (short), zero-extended to ``length``."""
        if self._encoded is not None:
            enc = np.zeros((1, length), dtype=np.uint32)
            got = self._encoded(start, stop)
            enc[0, : len(got)] = got
            if self.mode == "eos":
                return eos_from_encoded(enc, self.dtype)
            return packed_from_encoded(enc, self.dtype, self.bos)
        ids = np.zeros((1, length), dtype=np.int64)
        got = self.reader.span(start, stop)
        ids[0, : len(got)] = got
        if self.mode == "eos":
            return eos_windows(ids, self.dtype)
        is_start = starts_in_rows(self.reader.boundaries, np.array([start]), length)
        return packed_from_starts(ids, is_start, self.dtype, self.bos)

    def _read_unpacked(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        L = self.seq_len
        if self._pieces is None:
            docs = self.reader.take(rows)
            if self.long_docs == "error":
                for d, r in zip(docs, rows.tolist(), strict=True):
                    if len(d) > L:
                        raise InvalidInputError(
                            f"document {r} of {self.reader!r} has {len(d)} tokens, more than "
                            f"seq_len {L}; pass long_docs='truncate' or 'split'"
                        )
            pieces = [d[:L] for d in docs]
        else:
            b = self.reader.boundaries
            doc = np.searchsorted(self._pieces, rows, side="right") - 1
            k = rows - self._pieces[doc]
            pieces = []
            for d, j in zip(doc.tolist(), k.tolist(), strict=True):
                a, z = int(b[d]), int(b[d + 1])
                pieces.append(self.reader.span(a + j * L, min(z, a + (j + 1) * L)))
        return unpacked_rows(pieces, L, self.dtype, self.bos, self.pad_id)
