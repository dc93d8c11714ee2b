"""Writing the files of a Dolma tree: gzip the same way every time (zlib-ng, mtime 0), zstd or
plain, each output one object that appears whole when committed (:class:`OutputFile`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from zlib_ng import zlib_ng as zlib

from lmdata.errors import DatasetNotFoundError, FormatError
from lmdata.storage import Store


def open_write(
    raw: BinaryIO, compression: str, level: int | None = None, part: Part | None = None
) -> Any:
    """A binary stream writing ``compression`` into ``raw`` (gz: mtime 0, so output is
    reproducible); closing it closes ``raw``. With ``part``, the stream is one piece of a
    file written in pieces (see :class:`Part`)."""
    if compression == "gz":
        w = GzipWriter(raw, 6 if level is None else level, part)
        return _Closing(w, raw)
    if compression == "zst":
        import zstandard

        w = zstandard.ZstdCompressor(level=3 if level is None else level).stream_writer(
            raw, closefd=False
        )
        return _Closing(w, raw)
    if compression in ("none", ""):
        return _Closing(None, raw)
    raw.close()
    raise FormatError(f"unknown compression {compression!r}; use gz, zst or none")


@dataclass(frozen=True)
class Part:
    """One piece of an output written by several units (the byte ranges of one large input).
    gzip: the first piece holds the header, every piece a deflate stream of its own that ends
    on a byte boundary (sync flush), the last piece the final block; :func:`join_parts` adds
    the trailer, whose CRC-32 it combines from the pieces'. The result is one gzip member.
    zstd: each piece is a frame; plain: bytes as they are."""

    first: bool
    last: bool


class GzipWriter:
    """One gzip member as Python's ``gzip`` writes it with ``mtime=0`` and no file name
    (header, raw deflate, CRC-32 and size), compressed with zlib-ng, or one piece of it
    (``part``). Small writes (a document each) are gathered into blocks of ``BLOCK`` bytes:
    one compress call per block."""

    BLOCK = 1 << 18

    def __init__(self, raw: BinaryIO, level: int, part: Part | None = None) -> None:
        self.raw = raw
        self.part = part
        self._z = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, zlib.DEF_MEM_LEVEL, 0)
        self.crc = 0
        self.size = 0
        self._buf: list[bytes] = []
        self._pending = 0
        if part is None or part.first:
            raw.write(gzip_header(level))

    def write(self, data: bytes) -> int:
        self._buf.append(data)
        self._pending += len(data)
        if self._pending >= self.BLOCK:
            self._compress()
        return len(data)

    def _compress(self) -> None:
        block = b"".join(self._buf)
        self._buf.clear()
        self._pending = 0
        self.crc = zlib.crc32(block, self.crc)
        self.size += len(block)
        out = self._z.compress(block)
        if out:
            self.raw.write(out)

    def close(self) -> None:
        self._compress()
        if self.part is not None and not self.part.last:
            self.raw.write(self._z.flush(zlib.Z_SYNC_FLUSH))
            return
        self.raw.write(self._z.flush())
        if self.part is None:
            self.raw.write(gzip_trailer(self.crc, self.size))


def gzip_header(level: int) -> bytes:
    xfl = b"\x02" if level == 9 else b"\x04" if level == 1 else b"\x00"
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + xfl + b"\xff"


def gzip_trailer(crc: int, size: int) -> bytes:
    return struct.pack("<II", crc, size & 0xFFFFFFFF)


class _Closing:
    """Closes the codec stream, then the file under it."""

    def __init__(self, stream: Any, raw: Any) -> None:
        self.stream = stream if stream is not None else raw
        self.raw = raw

    def write(self, data: bytes) -> int:
        return self.stream.write(data)  # type: ignore[no-any-return]

    def close(self) -> None:
        try:
            if self.stream is not self.raw:
                self.stream.close()
        finally:
            if not self.raw.closed:
                self.raw.close()

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OutputFile:
    """One output file (an attribute file, a mixed shard) written through its store: it
    appears whole on :meth:`commit` (a rename locally, one object upload remotely) and
    :meth:`abort` leaves nothing. Replaces an existing file only with ``overwrite``."""

    def __init__(
        self,
        store: Store,
        key: str,
        compression: str,
        *,
        overwrite: bool = True,
        part: Part | None = None,
    ) -> None:
        self.key = key
        self._out = store.output(key, directory=False, overwrite=overwrite)
        try:
            self._f = open_write(self._out.open_write(""), compression, part=part)
        except BaseException:
            self._out.abort()
            raise
        self.write: Callable[[bytes], Any] = self._f.stream.write  # one call per document

    def checksum(self) -> tuple[int, int]:
        """(CRC-32, bytes) of what was written, for a gzip piece (0, 0 otherwise); after
        :meth:`commit`, when the last block is compressed."""
        if not self._out.done:
            raise RuntimeError("checksum() before commit()")
        w = self._f.stream
        return (w.crc, w.size) if isinstance(w, GzipWriter) else (0, 0)

    def commit(self) -> None:
        if self._out.done:
            return
        try:
            self._f.close()
        except BaseException:
            self._out.abort()
            raise
        self._out.commit()

    def abort(self) -> None:
        if self._out.done:
            return
        try:
            self._f.close()
        except Exception:  # discarding the output anyway
            pass
        self._out.abort()

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        if et is None:
            self.commit()
        else:
            self.abort()


def suffix_for(compression: str) -> str:
    return {"gz": ".jsonl.gz", "zst": ".jsonl.zst", "none": ".jsonl", "": ".jsonl"}[compression]


def join_parts(
    store: Store,
    key: str,
    compression: str,
    parts: Sequence[str],
    checksums: Sequence[tuple[int, int]],
    *,
    overwrite: bool = True,
) -> None:
    """Write ``key`` as the concatenation of the pieces ``parts`` (keys written with
    :class:`Part`), plus the gzip trailer, then remove the pieces. Only the compressed bytes
    pass through here."""
    with OutputFile(store, key, "none", overwrite=overwrite) as out:
        for i, p in enumerate(parts):
            try:
                size = store.size(p)
            except FileNotFoundError:
                raise DatasetNotFoundError(
                    f"{p}: piece {i} of {key} is missing (a worker wrote it to a folder this "
                    "process cannot see, or it was removed, e.g. by `lmdata clean`); rerun the "
                    "job with --resume, with outputs on a folder or URL every worker shares"
                ) from None
            for off in range(0, size, 8 << 20):
                out.write(store.read_range(p, off, min(8 << 20, size - off)))
        if compression == "gz":
            crc, total = checksums[0]
            for c, n in checksums[1:]:
                crc = zlib.crc32_combine(crc, c, n)
                total += n
            out.write(gzip_trailer(crc, total))
    for p in parts:
        store.remove(p)
