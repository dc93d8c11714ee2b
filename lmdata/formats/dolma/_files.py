"""Reading the files of a Dolma tree: decoders (gzip, zstd or plain, inferred from the
extension as dolma does) and the line reader every tool uses. Files are read through a
:class:`lmdata.storage.Store` in chunks of ranged reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

# zlib-ng, which dolma's Rust I/O (flate2) uses too: at level 6 it compresses ~1.5x and
# decompresses ~1.3x faster than the zlib Python is built with (measured on Dolma documents)
from zlib_ng import zlib_ng as zlib

from lmdata.errors import CorruptDataError
from lmdata.formats.dolma._paths import codec_of
from lmdata.storage import Store

READ_CHUNK = 1 << 20
REMOTE_CHUNK = 8 << 20  # object stores: fewer, larger ranged reads (one request each)
# The longest line read (decompressed bytes, without its newline). A longer line is refused
# before it is held whole: a small .gz can hold one line of gigabytes (a decompression bomb).
# Readers take ``max_line_bytes=`` to change it.
MAX_LINE_BYTES = 256 << 20
OUT_PIECE = 8 << 20  # decoders hand out decompressed data in pieces of at most this size
_ZSTD_SLICE = 2048  # zstd input fed at a time: at most ~64 MiB of output (ratio <= 32768)


# ---------------------------------------------------------------------------------------------
# Decoders: incremental, multi-member aware, copyable where the codec allows it (gzip, plain),
# which is what lets the reader restart decoding in the middle of a compressed file.


class _Plain:
    def decompress(self, data: bytes) -> bytes:
        return data

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

    def flush(self) -> bytes:
        return b""

    def copy(self) -> _Plain:
        return self


# gzip and zstd agree: a compressed file of zero bytes is not an empty stream (that has a
# header) but a file cut short, so both are errors rather than zero documents
EMPTY_COMPRESSED = (
    "the file is empty, but even a compressed file of no documents has a header (a copy or a "
    "write cut short?); delete it if it should hold nothing"
)


class _Gzip:
    """zlib in gzip mode that continues over concatenated members (``cat a.gz b.gz``)."""

    def __init__(self, obj: Any = None, started: bool = False) -> None:
        self.obj = obj if obj is not None else zlib.decompressobj(wbits=31)
        self.started = started

    def decompress(self, data: bytes) -> bytes:
        self.started = self.started or bool(data)
        out = [self.obj.decompress(data)]
        while self.obj.eof and self.obj.unused_data:
            rest = self.obj.unused_data
            self.obj = zlib.decompressobj(wbits=31)
            out.append(self.obj.decompress(rest))
        return b"".join(out)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The output of ``data`` in pieces of at most OUT_PIECE bytes (all input consumed)."""
        self.started = self.started or bool(data)
        while data:
            out = self.obj.decompress(data, OUT_PIECE)
            if out:
                yield out
            if self.obj.unconsumed_tail:
                data = self.obj.unconsumed_tail
            elif self.obj.eof and self.obj.unused_data:
                data = self.obj.unused_data
                self.obj = zlib.decompressobj(wbits=31)
            else:
                data = b""

    def flush(self) -> bytes:
        if not self.started:
            raise ValueError(EMPTY_COMPRESSED)
        if not self.obj.eof and self.obj.unconsumed_tail == b"":
            tail = self.obj.flush()
            if not self.obj.eof:
                raise zlib.error("compressed stream ends early (truncated gzip file)")
            return tail
        return b""

    def copy(self) -> _Gzip:
        return _Gzip(self.obj.copy(), self.started)


class _Zstd:
    """zstandard that continues over concatenated frames; it cannot be copied."""

    def __init__(self) -> None:
        import zstandard

        self._dctx = zstandard.ZstdDecompressor()
        self.obj = self._dctx.decompressobj()
        self.started = False

    def decompress(self, data: bytes) -> bytes:
        out = [self.obj.decompress(data)] if data else []
        self.started = self.started or bool(data)
        while self.obj.eof and self.obj.unused_data:
            rest = self.obj.unused_data
            self.obj = self._dctx.decompressobj()
            out.append(self.obj.decompress(rest))
        return b"".join(out)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The output of ``data``, fed in small slices so that no piece is huge."""
        view = memoryview(data)
        for i in range(0, len(view), _ZSTD_SLICE):
            out = self.decompress(view[i : i + _ZSTD_SLICE])
            if out:
                yield out

    def flush(self) -> bytes:
        if not self.started:
            raise ValueError(EMPTY_COMPRESSED)
        if not self.obj.eof:
            raise ValueError("compressed stream ends early (truncated zstd file)")
        return b""

    def copy(self) -> None:
        return None


def _decode_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    return (zlib.error, EOFError, ValueError, zstandard.ZstdError)


DECODE_ERRORS = _decode_errors()


def new_decoder(codec: str) -> _Plain | _Gzip | _Zstd:
    if codec == "gz":
        return _Gzip()
    if codec == "zst":
        return _Zstd()
    return _Plain()


def line_too_long(
    path: str | os.PathLike[str], lineno: int, max_line_bytes: int
) -> CorruptDataError:
    return CorruptDataError(
        f"line is longer than max_line_bytes={max_line_bytes} bytes (a decompression bomb, or "
        "not JSONL); if the file is genuine, read it with a larger max_line_bytes",
        path=path,
        position=f"line {lineno}",
    )


class LineSplitter:
    """Cuts decoded pieces into lines. The unfinished line is kept as a list of pieces, so a
    long line costs one copy in all (not one per piece), and it is refused as soon as it
    grows past ``max_line_bytes``, before it is held whole."""

    def __init__(self, path: str | os.PathLike[str], lineno: int, max_line_bytes: int) -> None:
        self.path = path
        self.lineno = lineno  # number of the line the pending pieces start
        self.max_line_bytes = max_line_bytes
        self._parts: list[bytes] = []
        self.pending = 0  # bytes of the unfinished line

    def feed(self, out: bytes) -> list[bytes]:
        """The lines that ``out`` completes (without their newlines)."""
        if b"\n" not in out:
            self.pending += len(out)
            if self.pending > self.max_line_bytes:
                raise line_too_long(self.path, self.lineno, self.max_line_bytes)
            if out:
                self._parts.append(out)
            return []
        lines = out.split(b"\n")
        rest = lines.pop()
        if self._parts:
            if self.pending + len(lines[0]) > self.max_line_bytes:
                raise line_too_long(self.path, self.lineno, self.max_line_bytes)
            self._parts.append(lines[0])
            lines[0] = b"".join(self._parts)
        if len(out) > self.max_line_bytes:
            for k, ln in enumerate(lines):
                if len(ln) > self.max_line_bytes:
                    raise line_too_long(self.path, self.lineno + k, self.max_line_bytes)
        self.lineno += len(lines)
        self._parts = [rest] if rest else []
        self.pending = len(rest)
        if self.pending > self.max_line_bytes:
            raise line_too_long(self.path, self.lineno, self.max_line_bytes)
        return lines

    def carry(self) -> bytes:
        """The unfinished line so far."""
        if len(self._parts) > 1:
            self._parts = [b"".join(self._parts)]
        return self._parts[0] if self._parts else b""


def read_chunks(store: Store, key: str, step: int | None = None) -> Iterator[bytes]:
    """The bytes of ``key`` in ranged reads of ``step`` bytes (default 1 MiB locally, 8 MiB
    from object stores); the end is where a read comes back empty (remotely: short)."""
    return (chunk for _, chunk in chunks_between(store, key, 0, None, step))


def iter_raw_lines(
    store: Store,
    key: str,
    start_line: int = 1,
    max_line_bytes: int = MAX_LINE_BYTES,
    read: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes without the newline)`` for every line of a document or attribute
    file, decoded chunk by chunk. A final line without newline counts; truncated or garbled
    compression, or a line longer than ``max_line_bytes``, is a CorruptDataError naming the
    file and line. ``read(n)`` is told of each chunk of ``n`` stored bytes read (progress)."""
    where = store.url(key)
    dec = new_decoder(codec_of(key))
    lines = LineSplitter(where, start_line, max_line_bytes)
    chunks = read_chunks(store, key)
    try:
        while True:
            chunk = next(chunks, b"")
            if read is not None and chunk:
                read(len(chunk))
            outs = dec.pieces(chunk) if chunk else iter([dec.flush()])
            for out in outs:
                first = lines.lineno
                for k, ln in enumerate(lines.feed(out)):
                    yield first + k, ln
            if not chunk:
                rest = lines.carry()
                if rest:
                    yield lines.lineno, rest
                return
    except CorruptDataError:
        raise
    except DECODE_ERRORS as e:
        raise CorruptDataError(
            f"cannot decompress ({e}); the file is truncated or not {codec_of(key)} data: "
            "re-create or re-download it",
            path=where,
            position=f"after line {lines.lineno - 1}",
        ) from None


def splittable(key: str) -> bool:
    """True if a document file can be read in byte ranges: plain JSONL only (a gzip stream
    cannot be entered in the middle; zstd frames could, but their ends are not indexed)."""
    return codec_of(key) == "none"


def line_number_at(store: Store, key: str, offset: int) -> int:
    """The number of the line starting at byte ``offset`` of a plain file (counted only when a
    ranged unit has to name a line in an error)."""
    n = 1
    for pos, chunk in chunks_between(store, key, 0, offset):
        n += chunk.count(b"\n", 0, offset - pos)
    return n


def chunks_between(
    store: Store, key: str, start: int, end: int | None, step: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of ``key`` from ``start`` in ranged reads of ``step`` bytes (default
    1 MiB locally, 8 MiB from object stores), up to ``end`` or, with ``end`` None, to the end
    of the file: where a read comes back empty (remotely: short)."""
    if step is None:
        step = READ_CHUNK if store.local_path(key) is not None else REMOTE_CHUNK
    pos = start
    while end is None or pos < end:
        n = step if end is None else min(step, end - pos)
        chunk = store.read_range(key, pos, n)
        if not chunk:
            return
        yield pos, chunk
        pos += len(chunk)
        if len(chunk) < n and store.local_path(key) is None:
            return  # an object store's short read is its end (saves one request)


def iter_range_lines(
    store: Store, key: str, start: int, end: int, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes]]:
    """``(byte offset, bytes without the newline)`` of the lines of a plain file that start in
    ``[start, end)``: the range's first line is the one after the first newline at or past
    ``start - 1``, and its last line runs past ``end`` to its newline. Every line of a file is
    owned by exactly one of a set of ranges that tile it."""
    where = store.url(key)
    pos = max(start - 1, 0)
    parts: list[bytes] = []  # the unfinished line's bytes, joined once (when its newline comes)
    size = 0
    skip = start > 0  # the line under way at ``start - 1`` belongs to the previous range
    for off, chunk in chunks_between(store, key, pos, None):
        if not skip and pos >= end:
            return
        if b"\n" not in chunk:  # the line under way goes on
            if skip:
                pos = off + len(chunk)
                continue
            parts.append(chunk)
            size += len(chunk)
            if size > max_line_bytes:
                raise line_too_long(where, line_number_at(store, key, pos), max_line_bytes)
            continue
        buf = b"".join((*parts, chunk)) if parts else chunk
        if skip:
            nl = buf.find(b"\n")
            pos, buf, skip = pos + nl + 1, buf[nl + 1 :], False
        cut = 0
        while True:
            if pos + cut >= end:
                return
            nl = buf.find(b"\n", cut)
            if nl < 0:
                break
            if nl - cut > max_line_bytes:
                raise line_too_long(where, line_number_at(store, key, pos + cut), max_line_bytes)
            yield pos + cut, buf[cut:nl]
            cut = nl + 1
        pos, rest = pos + cut, buf[cut:]
        if len(rest) > max_line_bytes:
            raise line_too_long(where, line_number_at(store, key, pos), max_line_bytes)
        parts, size = ([rest], len(rest)) if rest else ([], 0)
    if parts and pos < end and not skip:
        yield pos, b"".join(parts)
