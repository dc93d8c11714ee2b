"""Finding lines in JSONL files and parsing them the way modalities accepts them.

Lines end at ``\\n`` bytes only: U+2028, U+0085 and U+FEFF are ordinary characters inside JSON
strings (``str.splitlines`` would break on the first two). A final line needs no newline, and a
final newline does not start an empty line. A ``\\r`` before the newline belongs to the line.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import orjson

from lmdata import _json
from lmdata.errors import DatasetNotFoundError, FormatError
from lmdata.storage import Store, resolve

_SCAN_BYTES = 1 << 26
MAX_LINE_BYTES = 256 << 20  # lines longer than this are not parsed by checks (as Dolma's reader)


class LineError(ValueError):
    """A line is not JSON; ``reason`` says why."""


def loads(line: bytes) -> Any:
    """Parse one JSON line exactly as modalities' ``json.loads`` would accept it, fast.

    orjson first; the standard library decides whatever orjson refuses (``NaN``, ``Infinity``,
    a UTF-8 BOM, lone surrogates), so acceptance is the origin's (see lmdata._json).
    """
    try:
        return _json.parse(line)
    except ValueError as e:
        raise LineError(str(e) or type(e).__name__) from None


def parse_many(raws: list[bytes], fallback: Callable[[int, bytes], Any]) -> list[Any]:
    """:func:`loads` of many lines, a Python call less per line: orjson parses each line and
    keeps it where :func:`lmdata._json.exact` says no integer beyond 64 bits became a float;
    ``fallback(position in raws, line)`` takes every other line (all of :func:`loads`, with
    its errors). The values are those of :func:`loads`."""
    out: list[Any] = []
    append = out.append
    fast = orjson.loads
    refused = orjson.JSONDecodeError
    exact = _json.exact
    for j, r in enumerate(raws):
        try:
            v = fast(r)
        except refused:
            pass
        else:
            if exact(v, r):
                append(v)
                continue
        append(fallback(j, r))
    return out


def check_block(buf: Any, offs: list[int], lens: list[int]) -> bool:
    """Whether orjson parses every line ``buf[off : off + len]`` (then :func:`check` accepts
    them all); False means some line needs :func:`check` to decide."""
    fast = orjson.loads
    try:
        for off, n in zip(offs, lens, strict=True):
            fast(buf[off : off + n])
    except orjson.JSONDecodeError:
        return False
    return True


def check(line: bytes) -> None:
    """Raise LineError unless ``line`` is JSON that modalities' ``json.loads`` accepts.

    Only acceptance matters here, so orjson's float for a huge integer is fine.
    """
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        loads(line)


def read_lines(
    store: Store, key: str, *, window: int | None = None
) -> Iterator[tuple[int, int, bytes]]:
    """(line number from 1, offset, bytes without the newline) of every line of object ``key``,
    read in windows of ``window`` bytes (64 MiB by default): memory for one window and its
    longest line, never the whole object (see :func:`read_spans`)."""
    for lineno, off, _n, line in read_spans(store, key, window=window):
        yield lineno, off, line  # type: ignore[misc]  # no bound: never None


def read_spans(
    store: Store, key: str, *, window: int | None = None, max_line_bytes: int | None = None
) -> Iterator[tuple[int, int, int, bytes | None]]:
    """(line number from 1, offset, length, bytes without the newline) of every line of object
    ``key``, read in ranged windows of ``window`` bytes (a local file too: no mapping, so no
    address space the size of the file). The bytes of a line longer than ``max_line_bytes``
    are never gathered: such a line comes with None, whatever its length (an unterminated
    tail of gigabytes costs one window of memory)."""
    window = window or _SCAN_BYTES
    size = store.size(key)
    lineno = pos = start = 0  # start: offset of the line being assembled
    pending: list[bytes] = []  # its first pieces, from earlier windows (none once too long)
    while pos < size:
        chunk = store.read_range(key, pos, min(window, size - pos))
        if not chunk:
            break  # the object shrank while it was read
        prev = 0
        find = chunk.find
        while (i := find(b"\n", prev)) >= 0:  # memchr: no array the size of the window
            n = pos + i - start
            lineno += 1
            if max_line_bytes is not None and n > max_line_bytes:
                line = None
            else:
                line = b"".join([*pending, chunk[prev:i]]) if pending else chunk[prev:i]
            yield lineno, start, n, line
            pending = []
            start = pos + i + 1
            prev = i + 1
        pos += len(chunk)
        if prev < len(chunk) and (max_line_bytes is None or pos - start <= max_line_bytes):
            pending.append(chunk[prev:] if prev else chunk)
        else:
            pending = []
    if start < pos:  # a last line without a newline
        n = pos - start
        long = max_line_bytes is not None and n > max_line_bytes
        yield lineno + 1, start, n, None if long else b"".join(pending)


def release(buf: mmap.mmap | bytes | None) -> None:
    """Close a mapping from ``Store.mmap`` (bytes need nothing)."""
    if isinstance(buf, mmap.mmap):
        buf.close()


def shown_path(store: Store, key: str) -> PurePath | str:
    """How a key appears in messages: a local Path, or the full URL on an object store."""
    return Path(key) if store.can_mmap else store.url(key)


def line_spans(buf: mmap.mmap | bytes | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(offsets, lengths) of the lines in ``buf``, in blocks, lengths without the ``\\n``."""
    if buf is None or len(buf) == 0:
        return
    size = len(buf)
    arr = np.frombuffer(buf, dtype=np.uint8)
    start = 0
    for lo in range(0, size, _SCAN_BYTES):
        hi = min(lo + _SCAN_BYTES, size)
        nl = np.flatnonzero(arr[lo:hi] == 0x0A) + lo
        if not len(nl):
            continue
        starts = np.empty(len(nl), dtype=np.int64)
        starts[0] = start
        starts[1:] = nl[:-1] + 1
        yield starts, nl - starts
        start = int(nl[-1]) + 1
    if start < size:  # a last line without a newline
        yield np.array([start], dtype=np.int64), np.array([size - start], dtype=np.int64)


def iter_lines(buf: mmap.mmap | bytes | None) -> Iterator[tuple[int, int, int]]:
    """(line number from 1, offset, length) of every line in ``buf``."""
    lineno = 0
    for offs, lens in line_spans(buf):
        for off, ln in zip(offs.tolist(), lens.tolist(), strict=True):
            lineno += 1
            yield lineno, off, ln


def default_index_path(path: str | os.PathLike[str]) -> Path:
    """``foo.jsonl`` -> ``foo.idx`` beside it, as modalities names the raw index (a key of
    an object store works too: its ``str`` is the index's key)."""
    p = Path(path)
    return p.with_suffix(".idx")


def data_object(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> tuple[Store, str]:
    """(store, key) of an existing JSONL file: missing is DatasetNotFoundError, a folder a
    FormatError (never a raw IsADirectoryError from reading it)."""
    store, key = resolve(path, storage_options)
    if not store.exists(key):
        raise DatasetNotFoundError("no such file or object", path=store.url(key))
    if store.is_dir(key):
        raise FormatError("a JSONL dataset is one file, and this is a folder", path=store.url(key))
    return store, key
