"""Writing the files of a Dolma tree: gzip the same way every time (zlib-ng, mtime 0), zstd or
plain, each output one object that appears whole when committed (:class:`OutputFile`).
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

from zlib_ng import zlib_ng as zlib

from lmdata.errors import FormatError
from lmdata.storage import Store


def open_write(raw: BinaryIO, compression: str, level: int | None = None) -> Any:
    """A binary stream writing ``compression`` into ``raw`` (gz: mtime 0, so output is
    reproducible); closing it closes ``raw``."""
    if compression == "gz":
        return _Closing(GzipWriter(raw, 6 if level is None else level), raw)
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


class GzipWriter:
    """One gzip member as Python's ``gzip`` writes it with ``mtime=0`` and no file name
    (header, raw deflate, CRC-32 and size), compressed with zlib-ng. Small writes (a document
    each) are gathered into blocks of ``BLOCK`` bytes: one compress call per block."""

    BLOCK = 1 << 18

    def __init__(self, raw: BinaryIO, level: int) -> None:
        self.raw = raw
        self._z = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, zlib.DEF_MEM_LEVEL, 0)
        self._crc = 0
        self._size = 0
        self._buf: list[bytes] = []
        self._pending = 0
        xfl = b"\x02" if level == 9 else b"\x04" if level == 1 else b"\x00"
        raw.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + xfl + b"\xff")

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
        self._crc = zlib.crc32(block, self._crc)
        self._size += len(block)
        out = self._z.compress(block)
        if out:
            self.raw.write(out)

    def close(self) -> None:
        self._compress()
        self.raw.write(self._z.flush())
        self.raw.write(struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))


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

    def __init__(self, store: Store, key: str, compression: str, *, overwrite: bool = True) -> None:
        self.key = key
        self._out = store.output(key, directory=False, overwrite=overwrite)
        try:
            self._f = open_write(self._out.open_write(""), compression)
        except BaseException:
            self._out.abort()
            raise

    def write(self, data: bytes) -> None:
        self._f.write(data)

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
