"""Checks of a JSONL file against its raw index beyond entry-by-entry agreement: data that no
entry covers although nothing says it was left out on purpose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmdata.formats._span_index import SpanIndex
from lmdata.formats.modalities_jsonl.lines import LineError, loads


def unindexed_problems(path: Path, index_path: Path, index: SpanIndex, buf: Any) -> list[str]:
    """Bytes after the pickled index, and an unterminated last line that is neither JSON nor
    indexed (a write cut short: ``--skip-invalid`` leaves out whole lines, not torn ones)."""
    out = []
    if index.trailing:
        out.append(
            f"{index_path.name}: {index.trailing} bytes follow the end of the pickled index; "
            "every reader ignores them (rebuild the index with `lmdata index --overwrite`)"
        )
    size = len(buf) if buf is not None else 0
    if size and buf[size - 1 : size] != b"\n":
        start = buf.rfind(b"\n") + 1
        if not (len(index) and int(index.offsets[-1]) == start):
            try:
                loads(buf[start:size])
            except LineError:
                out.append(
                    f"{path.name}: the last {size - start} bytes (from byte {start}) are an "
                    "unterminated line that is not JSON and not in the index: a write cut "
                    "short? Remove them, or complete the line and rebuild the index"
                )
    return out
