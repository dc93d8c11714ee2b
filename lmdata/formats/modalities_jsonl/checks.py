"""Checking a JSONL file against its raw index, in one pass over the lines: every entry must
be exactly one line that is JSON, every JSON line must be indexed, and nothing may follow
the data or the index that no entry covers."""

from __future__ import annotations

import contextlib
from pathlib import PurePath, PurePosixPath

import numpy as np

from lmdata._progress import OnProgress, Ticker
from lmdata._report import ProblemReport
from lmdata.formats._span_index import SpanIndex
from lmdata.formats.modalities_jsonl.lines import (
    MAX_LINE_BYTES,
    LineError,
    loads,
    read_spans,
    shown_path,
)
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
    progress: OnProgress | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> list[str]:
    """Every disagreement between object ``key`` and its ``index`` (already range-checked).

    The lines are read once, in order, in ranged windows (a local file too), against the
    entries sorted by offset, so memory holds the index and one window, not a table of every
    line nor a mapping of the file. A line longer than ``max_line_bytes`` is reported and not
    parsed (its bytes are never gathered). ``progress`` counts the bytes of the file checked,
    a report per MiB.
    """
    path = shown_path(store, key)
    name, iname = PurePosixPath(str(path)).name, PurePosixPath(str(index_path)).name
    size = store.size(key)
    tick = Ticker(progress, size if progress is not None else 0, "validate")
    report_at = PROGRESS_BYTES if progress is not None else -1
    rep = ProblemReport()
    order = np.argsort(index.offsets, kind="stable")
    entries = order.tolist()
    offs = index.offsets[order].tolist()
    lens = index.lengths[order].tolist()
    j, n = 0, len(offs)

    def not_a_start(j: int) -> None:
        rep.add(
            "start",
            f"{iname} entry {entries[j]}: offset {offs[j]} is not the start of a line",
        )

    def too_long(lineno: int, off: int, length: int, what: str) -> None:
        rep.add(
            "long",
            f"{name} line {lineno} (byte {off}): {length:,} bytes, {what}; longer than "
            f"max_line_bytes ({max_line_bytes:,}), so not read as JSON (pass a larger "
            "max_line_bytes to check it)",
        )

    lines = read_spans(store, key, max_line_bytes=max_line_bytes)
    with contextlib.closing(lines):
        for lineno, off, length, line in lines:
            if off >= report_at >= 0:
                tick.to(off)
                report_at = off + PROGRESS_BYTES
            while j < n and offs[j] < off:
                not_a_start(j)
                j += 1
            indexed, checked = False, False
            while j < n and offs[j] == off:
                where = f"{iname} entry {entries[j]}"
                indexed = True
                if lens[j] != length:
                    rep.add(
                        "length",
                        f"{where}: length {lens[j]}, but line {lineno} has {length} bytes "
                        "(without its newline)",
                    )
                elif not checked:  # a line listed twice is checked once
                    checked = True
                    if line is None:
                        too_long(lineno, off, length, "indexed")
                    elif error := _json_error(line):
                        rep.add(
                            "json",
                            f"{name} line {lineno} (byte {off}): indexed but not JSON ({error})",
                        )
                j += 1
            if indexed:
                continue
            if line is None:
                too_long(lineno, off, length, "not in the index")
                continue
            error = _json_error(line)
            if error is None:
                rep.add(
                    "missing",
                    f"{name} line {lineno} (byte {off}): valid JSON but missing from "
                    f"the index; rebuild it with `lmdata index --overwrite {path}`",
                )
            elif j == n:  # after every line the index covers
                _after_the_index(rep, path, lineno, off, length, off + length == size, error)
            # else: a line --skip-invalid left out, between indexed ones
    tick.finish()
    for k in range(j, n):
        not_a_start(k)
    if index.trailing:
        rep.add(
            "trailing",
            f"{iname}: {index.trailing} bytes follow the end of the pickled index; "
            "every reader ignores them (rebuild the index with `lmdata index --overwrite`)",
        )
    return rep.finish()


def _after_the_index(
    rep: ProblemReport,
    path: PurePath | str,
    lineno: int,
    off: int,
    length: int,
    last: bool,
    error: str,
) -> None:
    """A line that is not JSON after the last indexed one: data appended after indexing, or a
    write cut short (``--skip-invalid`` leaves such lines out too, but nothing tells the two
    apart, and readers never see the line either way)."""
    name = PurePosixPath(str(path)).name
    if last and length:
        rep.add(
            "appended",
            f"{name}: the last {length} bytes (from byte {off}, line {lineno}) are an "
            "unterminated line that is not JSON and not in the index: a write cut short? "
            "Remove them, or complete the line and rebuild the index",
        )
        return
    reason = error if length else "an empty line"
    rep.add(
        "appended",
        f"{name} line {lineno} (byte {off}): not JSON ({reason}) and after the last line "
        "the index covers: appended after indexing? Remove it (if `lmdata index "
        "--skip-invalid` left it out on purpose, this check cannot tell)",
    )
