"""Building the raw ``.idx`` index of a JSONL file, byte-identical to modalities' own."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmdata._progress import OnProgress, Ticker
from lmdata.errors import (
    CorruptDataError,
    InvalidInputError,
    OutputExistsError,
)
from lmdata.formats._span_index import dump_span_index
from lmdata.formats.modalities_jsonl.lines import (
    LineError,
    check,
    check_block,
    data_object,
    default_index_path,
    line_spans,
    read_lines,
    release,
    shown_path,
)
from lmdata.formats.modalities_jsonl.reader import open_data
from lmdata.storage import Store, atomic_file, is_url, local_path, require_exists

_PROGRESS_LINES = 65536  # lines between progress calls (and lines checked as one block)


@dataclass(frozen=True)
class SkippedLine:
    line: int  # from 1
    offset: int  # in bytes
    reason: str


@dataclass(frozen=True)
class IndexResult:
    """What :func:`build_index` did: ``documents`` indexed, lines it ``skipped``."""

    index_path: Path  # a str for an index on an object store (its URL)
    documents: int
    skipped: tuple[SkippedLine, ...]


def scan(
    path: str | os.PathLike[str],
    *,
    skip_invalid: bool = False,
    reached: Callable[[int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[list[int], list[int], list[SkippedLine]]:
    """(offsets, lengths, skipped) of the JSON lines of ``path``.

    Every line must parse as JSON (any value, as modalities accepts); the first that does not
    is a CorruptDataError naming its line and byte offset, unless ``skip_invalid``.
    ``reached`` is called with the number of bytes scanned so far, now and then.
    """
    store, key = data_object(path, storage_options)
    return scan_object(store, key, skip_invalid=skip_invalid, reached=reached)


def scan_object(
    store: Store,
    key: str,
    *,
    skip_invalid: bool = False,
    reached: Callable[[int], None] | None = None,
) -> tuple[list[int], list[int], list[SkippedLine]]:
    """:func:`scan` of an object already resolved (memory for one window of it at a time)."""
    p = shown_path(store, key)
    offsets: list[int] = []
    lengths: list[int] = []
    skipped: list[SkippedLine] = []

    def take(lineno: int, off: int, line: bytes) -> None:
        try:
            check(line)
        except LineError as e:
            reason = "an empty line" if not line else f"not valid JSON ({e})"
            if not skip_invalid:
                raise CorruptDataError(
                    f"{reason}; fix the line, or pass skip_invalid=True (--skip-invalid) "
                    "to leave it out of the index",
                    path=p,
                    position=f"line {lineno} (byte {off})",
                ) from None
            skipped.append(SkippedLine(lineno, off, reason))
            return
        offsets.append(off)
        lengths.append(len(line))
        if reached is not None and lineno % _PROGRESS_LINES == 0:
            reached(off + len(line))

    buf = store.mmap(key)
    if buf is None:  # an object store: ranged windows
        with contextlib.closing(read_lines(store, key)) as lines:
            for lineno, off, line in lines:
                take(lineno, off, line)
        return offsets, lengths, skipped
    try:  # mapped: blocks of lines that orjson parses whole are taken at once
        lineno = 0
        for offs_a, lens_a in line_spans(buf if len(buf) else None):
            for lo in range(0, len(offs_a), _PROGRESS_LINES):
                offs = offs_a[lo : lo + _PROGRESS_LINES].tolist()
                lens = lens_a[lo : lo + _PROGRESS_LINES].tolist()
                if check_block(buf, offs, lens):
                    offsets += offs
                    lengths += lens
                    if reached is not None:
                        reached(offs[-1] + lens[-1])
                else:
                    for j, (off, n) in enumerate(zip(offs, lens, strict=True)):
                        take(lineno + j + 1, off, buf[off : off + n])
                lineno += len(offs)
    finally:
        release(buf)
    return offsets, lengths, skipped


def build_index(
    path: str | os.PathLike[str],
    index_path: str | os.PathLike[str] | None = None,
    *,
    skip_invalid: bool = False,
    overwrite: bool = False,
    progress: OnProgress | None = None,
    storage_options: dict[str, Any] | None = None,
) -> IndexResult:
    """Write the raw index of the JSONL file ``path`` (``foo.jsonl`` -> ``foo.idx``).

    The index is what modalities' ``create_raw_index`` writes: a protocol-4 pickle of
    ``[(byte offset, byte length without the newline), ...]``. A malformed line is an error
    and no index is written, unless ``skip_invalid`` leaves such lines out (counted in the
    result). An empty file gets an empty index (modalities refuses it). ``path`` and
    ``index_path`` may be URLs (``s3://`` ...), with ``storage_options`` for their stores.
    ``progress`` gets events of the phase "index", in bytes of the file scanned.
    """
    if is_url(path) or (index_path is not None and is_url(index_path)):
        return _build_index_on_store(
            path, index_path, skip_invalid, overwrite, progress, storage_options
        )
    src = require_exists(local_path(path, "lmdata index"))
    dest = Path(index_path) if index_path is not None else default_index_path(src)
    if dest.resolve() == src.resolve():
        raise InvalidInputError("the index path is the data file itself; choose another", path=dest)
    if dest.exists() and not overwrite:
        # fail before the scan, not after it
        raise OutputExistsError(
            "index already exists; pass overwrite=True (--overwrite)", path=dest
        )
    store, key = data_object(src, None)
    tick = Ticker(progress, store.size(key) if progress is not None else 0, "index")
    offsets, lengths, skipped = scan_object(store, key, skip_invalid=skip_invalid, reached=tick.to)
    tick.finish()
    with atomic_file(dest, overwrite=overwrite) as tmp:
        tmp.write_bytes(dump_span_index(offsets, lengths))
    return IndexResult(dest, len(offsets), tuple(skipped))


def _build_index_on_store(
    path: str | os.PathLike[str],
    index_path: str | os.PathLike[str] | None,
    skip_invalid: bool,
    overwrite: bool,
    progress: OnProgress | None,
    storage_options: dict[str, Any] | None,
) -> IndexResult:
    """:func:`build_index` where the data or the index is a URL: the index is one object,
    written whole after the scan (a failed scan writes nothing)."""
    store, key, istore, ikey = open_data(path, index_path, storage_options)
    if istore.url(ikey) == store.url(key):
        raise InvalidInputError(
            "the index path is the data file itself; choose another", path=istore.url(ikey)
        )
    if istore.exists(ikey) and not overwrite:
        raise OutputExistsError(
            "index already exists; pass overwrite=True (--overwrite)", path=istore.url(ikey)
        )
    tick = Ticker(progress, store.size(key) if progress is not None else 0, "index")
    offsets, lengths, skipped = scan_object(store, key, skip_invalid=skip_invalid, reached=tick.to)
    tick.finish()
    out = istore.output(ikey, directory=False, overwrite=overwrite)
    try:
        out.write_last("", dump_span_index(offsets, lengths))
        out.commit()
    except BaseException:
        out.abort()
        raise
    return IndexResult(istore.url(ikey), len(offsets), tuple(skipped))  # type: ignore[arg-type]
