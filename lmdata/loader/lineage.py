"""Where every row of a global batch came from (``Loader.explain``): computed from the data
order and the sequence index, never stored, so any step of any run can be explained again."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class Segment(NamedTuple):
    """One document's tokens in a row: ``length`` tokens from ``offset`` of document
    ``document`` of source ``source`` (``id``: the document's id where the dataset records
    one, else None)."""

    source: int
    document: int
    id: Any
    offset: int
    length: int


@dataclass(frozen=True)
class Lineage:
    """The segments of every row of the global batch of ``step`` (rows of all ranks, in order:
    rank r's batch is rows ``r * local_batch_size`` on). ``lineage[i]`` is row i's list of
    ``Segment``, in the row's order over its ``targets``; padding is not listed. The
    columns (one entry per segment, sorted by row) are there for vectorised use."""

    step: int
    rows: int
    row: np.ndarray
    source: np.ndarray
    document: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    ids: tuple[Any, ...] | None = None

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> list[Segment]:
        if not -self.rows <= i < self.rows:
            raise IndexError(f"row {i} of a {self.rows}-row batch")
        i %= self.rows
        a, z = np.searchsorted(self.row, [i, i + 1]).tolist()
        ids = self.ids
        return [
            Segment(
                int(self.source[j]),
                int(self.document[j]),
                None if ids is None else ids[j],
                int(self.offset[j]),
                int(self.length[j]),
            )
            for j in range(a, z)
        ]

    def __iter__(self) -> Iterator[list[Segment]]:
        for i in range(self.rows):
            yield self[i]

    def to_json(self) -> dict[str, Any]:
        """Plain values: ``{"step": s, "rows": [[{"source": ..., ...}, ...], ...]}``."""
        return {"step": self.step, "rows": [[s._asdict() for s in row] for row in self]}


def lineage(
    sources: list[Any],
    step: int,
    src: np.ndarray,
    rows: np.ndarray,
    valid: np.ndarray,
    *,
    ids: bool = True,
) -> Lineage:
    """The ``Lineage`` of the batch whose slot ``i`` is row ``rows[i]`` of source
    ``src[i]`` (``valid`` False: a padding slot)."""
    parts = []
    for k in np.unique(src[valid]).tolist():
        sel = np.flatnonzero(valid & (src == k))
        r, doc, off, length = sources[k].segments(rows[sel])
        found = sources[k].document_ids(doc) if ids else None
        parts.append((sel[r], np.full(len(r), k, dtype=np.int64), doc, off, length, found))
    if not parts:
        e = np.zeros(0, dtype=np.int64)
        return Lineage(step, len(src), e, e, e, e, e)
    cols = [np.concatenate([p[i] for p in parts]) for i in range(5)]
    order = np.argsort(cols[0], kind="stable")
    id_lists = [p[5] for p in parts]
    found_ids: tuple[Any, ...] | None = None
    if ids and any(x is not None for x in id_lists):
        flat: list[Any] = []
        for p, got in zip(parts, id_lists, strict=True):
            flat.extend(got if got is not None else [None] * len(p[0]))
        found_ids = tuple(flat[i] for i in order.tolist())
    row, source, document, offset, length = (c[order] for c in cols)
    return Lineage(step, len(src), row, source, document, offset, length, found_ids)
