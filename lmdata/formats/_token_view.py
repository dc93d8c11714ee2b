"""The token-sequence view of a records dataset whose column holds token arrays.

A dataset's kind comes from its format: an Atlas or MDS dataset opens as records (dicts), even
when its only column holds token ids. ``lmdata.open(path, token_column="tokens")`` asks for
this view explicitly; formats with a faster one of their own (MDS reads lengths from its array
headers) provide it through ``FormatSpec.token_view``, the rest get :class:`TokenColumn`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.protocols import normalize_indices


def span_of(reader: Any, start: int, stop: int) -> np.ndarray:
    """Tokens ``start:stop`` of the concatenation of ``reader``'s sequences, reading only the
    sequences that overlap the range (through ``boundaries`` and ``take``)."""
    b = reader.boundaries
    start, stop = max(0, int(start)), min(int(stop), int(b[-1]))
    if stop <= start:
        return np.zeros(0, dtype=np.int64)
    first = int(np.searchsorted(b, start, side="right")) - 1
    last = int(np.searchsorted(b, stop, side="left"))
    flat = np.concatenate(reader.take(np.arange(first, last)))
    off = start - int(b[first])
    return flat[off : off + (stop - start)]


class TokenColumn:
    """``r[i]`` is the 1-D integer array in column ``column`` of record ``i`` of ``records``.

    ``boundaries`` and ``max_token_id`` need every record's length: they are computed by one
    pass over the dataset the first time they are asked for, then kept.
    """

    def __init__(self, records: Any, column: str) -> None:
        self.records = records
        self.token_column = column
        self.format = getattr(records, "format", "records")
        self._boundaries: np.ndarray | None = None
        self._max_token_id: int | None = None
        if len(records):
            self[0]  # a wrong column fails here, naming the columns there are

    def __repr__(self) -> str:
        return f"TokenColumn({self.records!r}, {self.token_column!r})"

    def __len__(self) -> int:
        return len(self.records)

    def _tokens(self, rec: Any, i: int) -> np.ndarray:
        where = getattr(self.records, "path", None) or getattr(self.records, "root", None)
        if not isinstance(rec, dict) or self.token_column not in rec:
            keys = ", ".join(map(str, rec)) if isinstance(rec, dict) else type(rec).__name__
            raise InvalidInputError(
                f"record {i} has no column {self.token_column!r} ({keys}); pass the column "
                "that holds the token ids as token_column=",
                path=where,
            )
        arr = np.asarray(rec[self.token_column])
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise CorruptDataError(
                f"column {self.token_column!r} holds a {arr.dtype} array of shape "
                f"{arr.shape}; tokens are 1-D integers",
                path=where,
                position=f"record {i}",
            )
        return arr

    def __getitem__(self, index: int) -> np.ndarray:
        i = int(index)
        return self._tokens(self.records[i], i)

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        idx = normalize_indices(indices, len(self))
        recs = self.records.take(idx)
        return [self._tokens(r, i) for i, r in zip(idx.tolist(), recs, strict=True)]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i, rec in enumerate(self.records):
            yield self._tokens(rec, i)

    def _scan(self) -> None:
        n = len(self)
        lengths = np.zeros(n, dtype=np.int64)
        hi = 0
        block = 1024
        for lo in range(0, n, block):
            for j, arr in enumerate(self.take(np.arange(lo, min(n, lo + block)))):
                lengths[lo + j] = len(arr)
                if len(arr):
                    hi = max(hi, int(arr.max()))
        b = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(lengths, out=b[1:])
        self._boundaries, self._max_token_id = b, hi

    @property
    def boundaries(self) -> np.ndarray:
        if self._boundaries is None:
            self._scan()
        assert self._boundaries is not None
        return self._boundaries

    @property
    def num_tokens(self) -> int:
        return int(self.boundaries[-1])

    @property
    def max_token_id(self) -> int:
        if self._max_token_id is None:
            self._scan()
        assert self._max_token_id is not None
        return self._max_token_id

    def span(self, start: int, stop: int) -> np.ndarray:
        return span_of(self, start, stop)

    def document_ids(self, docs: np.ndarray) -> list[Any] | None:
        """The ``id`` field of records ``docs`` (None where no record has one)."""
        if not len(docs):
            return None
        recs = self.records.take(np.asarray(docs, dtype=np.int64))
        got = [r.get("id") if isinstance(r, dict) else None for r in recs]
        return got if any(g is not None for g in got) else None

    def info(self) -> dict[str, Any]:
        out = dict(self.records.info()) if hasattr(self.records, "info") else {}
        out.update({"token_column": self.token_column, "sequences": len(self)})
        return out

    def close(self) -> None:
        close = getattr(self.records, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> TokenColumn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
