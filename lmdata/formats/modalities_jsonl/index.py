"""Building the raw ``.idx`` index of a JSONL file, byte-identical to modalities' own."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmdata.errors import (
    CorruptDataError,
    InvalidInputError,
    OutputExistsError,
)
from lmdata.formats._span_index import dump_span_index
from lmdata.formats.modalities_jsonl.lines import (
    LineError,
    check,
    data_object,
    default_index_path,
    iter_lines,
    map_object,
    release,
    shown_path,
)
from lmdata.storage import atomic_file, local_path, require_exists


@dataclass(frozen=True)
class SkippedLine:
    line: int  # from 1
    offset: int  # in bytes
    reason: str


@dataclass(frozen=True)
class IndexResult:
    """What :func:`build_index` did: ``documents`` indexed, lines it ``skipped``."""

    index_path: Path
    documents: int
    skipped: tuple[SkippedLine, ...]


def scan(
    path: str | os.PathLike[str],
    *,
    skip_invalid: bool = False,
    progress: Callable[[int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[list[int], list[int], list[SkippedLine]]:
    """(offsets, lengths, skipped) of the JSON lines of ``path``.

    Every line must parse as JSON (any value, as modalities accepts); the first that does not
    is a CorruptDataError naming its line and byte offset, unless ``skip_invalid``.
    ``progress`` is called with the number of bytes scanned so far, now and then.
    """
    store, key = data_object(path, storage_options)
    p = shown_path(store, key)
    buf = map_object(store, key)
    offsets: list[int] = []
    lengths: list[int] = []
    skipped: list[SkippedLine] = []
    try:
        for lineno, off, ln in iter_lines(buf):
            assert buf is not None
            try:
                check(buf[off : off + ln])
            except LineError as e:
                reason = "an empty line" if ln == 0 else f"not valid JSON ({e})"
                if not skip_invalid:
                    raise CorruptDataError(
                        f"{reason}; fix the line, or pass skip_invalid=True (--skip-invalid) "
                        "to leave it out of the index",
                        path=p,
                        position=f"line {lineno} (byte {off})",
                    ) from None
                skipped.append(SkippedLine(lineno, off, reason))
                continue
            offsets.append(off)
            lengths.append(ln)
            if progress is not None and lineno % 65536 == 0:
                progress(off + ln)
    finally:
        release(buf)
    return offsets, lengths, skipped


def build_index(
    path: str | os.PathLike[str],
    index_path: str | os.PathLike[str] | None = None,
    *,
    skip_invalid: bool = False,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
) -> IndexResult:
    """Write the raw index of the JSONL file ``path`` (``foo.jsonl`` -> ``foo.idx``).

    The index is what modalities' ``create_raw_index`` writes: a protocol-4 pickle of
    ``[(byte offset, byte length without the newline), ...]``. A malformed line is an error
    and no index is written, unless ``skip_invalid`` leaves such lines out (counted in the
    result). An empty file gets an empty index (modalities refuses it).
    """
    src = require_exists(local_path(path, "lmdata index"))
    dest = Path(index_path) if index_path is not None else default_index_path(src)
    if dest.resolve() == src.resolve():
        raise InvalidInputError("the index path is the data file itself; choose another", path=dest)
    if dest.exists() and not overwrite:
        # fail before the scan, not after it
        raise OutputExistsError(
            "index already exists; pass overwrite=True (--overwrite)", path=dest
        )
    offsets, lengths, skipped = scan(src, skip_invalid=skip_invalid, progress=progress)
    with atomic_file(dest, overwrite=overwrite) as tmp:
        tmp.write_bytes(dump_span_index(offsets, lengths))
    return IndexResult(dest, len(offsets), tuple(skipped))
