"""Every rule of the ``.pbin`` layout checked, each problem reported with its place."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from lmdata._progress import OnProgress, Ticker
from lmdata._report import MAX_REPORTED, ProblemReport
from lmdata.errors import LmdataError
from lmdata.formats._span_index import SpanIndex, load_span_index
from lmdata.formats.modalities.layout import HEADER_SIZE, header_problems
from lmdata.formats.modalities.reader import PbinData, undo_origin_merge_shift
from lmdata.storage import resolve


def validate(
    path: str | os.PathLike[str],
    *,
    eod_id: int | None = None,
    allow_unsafe_pickle: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
) -> list[str]:
    """All problems in the ``.pbin`` at ``path`` (empty when valid).

    With ``eod_id``, also every document that does not end with it. ``progress`` counts the
    file's bytes: the header and index once read, the token data once checked.
    """
    store, key = resolve(path, storage_options)
    p = Path(key) if store.can_mmap else store.url(key)
    name = PurePosixPath(key).name  # every problem names the file: "d.pbin index entry 3: ..."
    size = store.size(key)
    tick = Ticker(progress, size, "validate")
    raw = store.read_range(key, 0, HEADER_SIZE)
    problems = [f"{name} header: {m}" for m in header_problems(raw, size)]
    if problems:
        return problems
    data_len = int.from_bytes(raw[:8], "little")
    width = int.from_bytes(raw[8:12], "little")
    index_bytes = store.read_range(key, HEADER_SIZE + data_len, size - HEADER_SIZE - data_len)
    try:
        index = load_span_index(
            index_bytes, path=p, where="index", allow_unsafe=allow_unsafe_pickle
        )
    except LmdataError as e:
        return [str(e)]
    tick.add(HEADER_SIZE + len(index_bytes))
    rep = ProblemReport()
    add = rep.add
    if index.trailing:
        add(
            "trailing",
            f"{name} index: {index.trailing} bytes follow the end of the pickled index; every "
            "reader ignores them (data appended after the file was written?); a rewrite drops them",
        )
    fixed = undo_origin_merge_shift(index, data_len)
    if fixed is not None:
        files = int(np.count_nonzero(index.offsets[1:] != index.ends[:-1])) + 1
        add(
            "merge",
            f"{name} index: offsets are 12 bytes too low per earlier input file ({files} "
            "files), the bug of modalities' merge_packed_data; lmdata reads the file with "
            "corrected offsets, and `lmdata merge` or a rewrite fixes it for other readers",
        )
        index = fixed
    offs, lens, ends = index.offsets, index.lengths, index.ends
    misaligned = np.flatnonzero((offs % width != 0) | (lens % width != 0))
    for i in _listed(rep, "align", misaligned):
        add(
            "align",
            f"{name} index entry {i}: offset {offs[i]} / length {lens[i]} is not a multiple "
            f"of the token width {width}",
        )
    outside = np.flatnonzero((offs < 0) | (ends > data_len))
    for i in _listed(rep, "range", outside):
        add(
            "range",
            f"{name} index entry {i}: bytes {offs[i]}..{ends[i]} lie outside the "
            f"{data_len} bytes of token data",
        )
    if fixed is None and len(index):
        if offs[0] != 0:
            add("order", f"{name} index entry 0: starts at byte {offs[0]}, not 0")
        for i in _listed(rep, "order", np.flatnonzero(offs[1:] != ends[:-1])):
            kind = "a gap" if offs[i + 1] > ends[i] else "an overlap"
            add(
                "order",
                f"{name} index entry {i + 1}: starts at byte {offs[i + 1]} but entry {i} "
                f"ends at {ends[i]} ({kind}; documents must be contiguous)",
            )
        if ends[-1] < data_len:
            add(
                "order",
                f"{name} index: the last document ends at byte {ends[-1]}, but the header "
                f"says {data_len} bytes of data",
            )
    elif len(index) == 0 and data_len:
        add("order", f"{name} index: empty, but the header says {data_len} bytes of data")
    if eod_id is not None and len(index) and not len(misaligned) and not len(outside):
        _check_eod(path, storage_options, width, index, eod_id, rep, name)
    tick.finish()
    return rep.finish()


def _listed(rep: ProblemReport, kind: str, found: np.ndarray) -> Iterator[int]:
    """The first of ``found``, to describe; once they are, the rest are counted in ``rep``."""
    yield from found[:MAX_REPORTED].tolist()
    rep.count(kind, max(0, len(found) - MAX_REPORTED))


def _check_eod(
    path: str | os.PathLike[str],
    storage_options: dict[str, Any] | None,
    width: int,
    index: SpanIndex,
    eod_id: int,
    rep: ProblemReport,
    name: str,
) -> None:
    offs, lens = index.offsets, index.lengths
    tokens = PbinData(path, storage_options).tokens
    last = (offs + lens) // width - 1
    nonempty = lens > 0
    ok = np.zeros(len(lens), dtype=bool)
    ok[nonempty] = tokens[last[nonempty]] == eod_id
    for i in _listed(rep, "eod", np.flatnonzero(~ok)):
        what = "is empty" if lens[i] == 0 else f"ends with {int(tokens[last[i]])}"
        rep.add("eod", f"{name} document {i}: {what}, not the end-of-document token {eod_id}")
