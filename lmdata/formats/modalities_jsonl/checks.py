"""Checking a JSONL file against its raw index, in one pass over the lines: every entry must
be exactly one line that is JSON, every JSON line must be indexed, and nothing may follow
the data or the index that no entry covers."""

from __future__ import annotations

import contextlib
from pathlib import PurePath, PurePosixPath

import numpy as np

from lmdata._report import ProblemReport
from lmdata.formats._span_index import SpanIndex
from lmdata.formats._spec import Progress, Ticker
from lmdata.formats.modalities_jsonl.lines import LineError, loads, read_lines, shown_path
from lmdata.storage import Store

PROGRESS_BYTES = 1 << 20  # bytes of lines between progress reports


def _json_error(line: bytes) -> str | None:
    try:
        loads(line)
    except LineError as e:
        return str(e)
    return None


def index_problems(
    store: Store,
    key: str,
    index_path: PurePath | str,
    index: SpanIndex,
    progress: Progress | None = None,
) -> list[str]:
    """Every disagreement between object ``key`` and its ``index`` (already range-checked).

    The lines are read once, in order (ranged windows on object stores), against the entries
    sorted by offset, so memory holds the index, not a table of every line. ``progress``
    counts the bytes of the file checked, a report per MiB.
    """
    path = shown_path(store, key)
    name, iname = PurePosixPath(str(path)).name, PurePosixPath(str(index_path)).name
    tick = Ticker(progress, store.size(key) if progress is not None else 0)
    report_at = PROGRESS_BYTES if progress is not None else -1
    rep = ProblemReport()
    order = np.argsort(index.offsets, kind="stable")
    entries = order.tolist()
    offs = index.offsets[order].tolist()
    lens = index.lengths[order].tolist()
    j, n = 0, len(offs)
    tail: tuple[int, bytes] | None = None  # the last line, when no newline ends it
    end = 0

    def not_a_start(j: int) -> None:
        rep.add(
            "start",
            f"{iname} entry {entries[j]}: offset {offs[j]} is not the start of a line",
        )

    with contextlib.closing(read_lines(store, key)) as lines:
        for lineno, off, line in lines:
            if off >= report_at >= 0:
                tick.to(off)
                report_at = off + PROGRESS_BYTES
            while j < n and offs[j] < off:
                not_a_start(j)
                j += 1
            indexed, error = False, ""
            while j < n and offs[j] == off:
                where = f"{iname} entry {entries[j]}"
                indexed = True
                if lens[j] != len(line):
                    rep.add(
                        "length",
                        f"{where}: length {lens[j]}, but line {lineno} has {len(line)} bytes "
                        "(without its newline)",
                    )
                else:
                    error = error or _json_error(line) or ""
                    if error:
                        rep.add(
                            "json",
                            f"{name} line {lineno} (byte {off}): indexed but not JSON ({error})",
                        )
                j += 1
            if not indexed and _json_error(line) is None:
                rep.add(
                    "missing",
                    f"{name} line {lineno} (byte {off}): valid JSON but missing from "
                    f"the index; rebuild it with `lmdata index --overwrite {path}`",
                )
            end = off + len(line)
            tail = None if indexed else (off, line)
    tick.finish()
    for k in range(j, n):
        not_a_start(k)
    if index.trailing:
        rep.add(
            "trailing",
            f"{iname}: {index.trailing} bytes follow the end of the pickled index; "
            "every reader ignores them (rebuild the index with `lmdata index --overwrite`)",
        )
    # an unterminated last line that is neither JSON nor indexed: a write cut short
    # (--skip-invalid leaves out whole lines, not torn ones)
    if tail is not None and end == store.size(key) and _json_error(tail[1]) is not None:
        start, line = tail
        rep.add(
            "unindexed",
            f"{name}: the last {len(line)} bytes (from byte {start}) are an "
            "unterminated line that is not JSON and not in the index: a write cut "
            "short? Remove them, or complete the line and rebuild the index",
        )
    return rep.finish()
