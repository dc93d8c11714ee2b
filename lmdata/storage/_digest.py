"""The hashes a manifest records, computed while a file is written.

A file is hashed in blocks of ``BLOCK`` bytes with xxh3-128: each block has its own digest, so
a partial check (a ranged read, or a check that stops at the first bad block) verifies what it
read. The file's hash is its one block's digest when it has one block (empty files included),
else the xxh3-128 of its blocks' digests concatenated: one pass over the bytes gives both, and
the blocks can be checked in parallel.

:class:`BlockHasher` takes the bytes in order; :class:`HashingRaw` puts one under a file's
buffer, so the many small writes of a writer reach it as 1 MiB pieces, and follows seeks back
(a header patched at close): the blocks written over are read back from the file at close.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

import xxhash

BLOCK = 4 << 20  # bytes per block hash (read when hashing starts: tests make it smaller)
WRITE_BUFFER = 1 << 20  # the buffer a hashing file keeps above its raw file
_ZEROS = bytes(1 << 20)


@dataclass(frozen=True)
class Digest:
    """What hashing one file gave: its size, its hash and (more than one block) its blocks'."""

    size: int
    hash: str  # 32 hex digits
    blocks: tuple[str, ...] = ()  # one per BLOCK bytes; empty when the file has one block


def combine(blocks: Iterable[bytes]) -> bytes:
    """The file hash of several block digests (raw 16-byte digests, in order)."""
    return xxhash.xxh3_128_digest(b"".join(blocks))


def digest_of(size: int, blocks: list[bytes]) -> Digest:
    """The :class:`Digest` of a file of ``size`` bytes from its blocks' raw digests."""
    if not blocks:
        blocks = [xxhash.xxh3_128_digest(b"")]
    if len(blocks) == 1:
        return Digest(size, blocks[0].hex())
    return Digest(size, combine(blocks).hex(), tuple(b.hex() for b in blocks))


def hash_bytes(data: bytes | memoryview, block: int | None = None) -> Digest:
    """The digest of bytes held in memory."""
    h = BlockHasher(block)
    h.update(data)
    return h.finish()


class BlockHasher:
    """Hashes bytes given in order, block by block (see the module docstring)."""

    __slots__ = ("_fill", "_h", "block", "blocks", "size")

    def __init__(self, block: int | None = None) -> None:
        self.block = block or BLOCK
        self.blocks: list[bytes] = []  # raw digests of the finished blocks
        self.size = 0
        self._h = xxhash.xxh3_128()
        self._fill = 0  # bytes of the current block hashed so far

    def update(self, data: Any) -> None:
        mv = data if type(data) is bytes else memoryview(data).cast("B")
        n = len(mv)
        if self._fill + n < self.block:  # the common case: within the current block
            self._h.update(mv)
            self._fill += n
            self.size += n
            return
        if type(mv) is bytes:
            mv = memoryview(mv)
        pos = 0
        while pos < n:
            take = min(n - pos, self.block - self._fill)
            self._h.update(mv[pos : pos + take])
            self._fill += take
            pos += take
            if self._fill == self.block:
                self.blocks.append(self._h.digest())
                self._h.reset()
                self._fill = 0
        self.size += n

    def zeros(self, n: int) -> None:
        """``n`` zero bytes (a hole a file was extended with)."""
        while n > 0:
            take = min(n, len(_ZEROS))
            self.update(_ZEROS if take == len(_ZEROS) else memoryview(_ZEROS)[:take])
            n -= take

    def raw_blocks(self) -> list[bytes]:
        """Every block's raw digest, the partial last one included (the hasher stays usable)."""
        out = list(self.blocks)
        if self._fill or not out:
            out.append(self._h.digest())
        return out

    def finish(self) -> Digest:
        return digest_of(self.size, self.raw_blocks())


def hash_file(path: str, block: int | None = None) -> Digest:
    """The digest of a local file, read in blocks (for files not written through a hasher)."""
    h = BlockHasher(block)
    buf = bytearray(h.block)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.finish()


class HashingRaw(io.RawIOBase):
    """A raw file that hashes what is written through it into ``inner`` (a writable binary
    file), calling ``done(digest)`` when closed without error.

    Writes at the end are hashed as they come; a gap left by a seek or by ``truncate`` to a
    larger size is hashed as zeros (what the file holds there); a write over bytes already
    hashed marks their blocks, which are read back from ``path`` at close (a file cut shorter
    is hashed again whole). Without a ``path`` (an object being uploaded) the file is written
    in order only.
    """

    def __init__(
        self,
        inner: Any,
        done: Callable[[Digest], None],
        path: str | None = None,
        block: int | None = None,
    ) -> None:
        super().__init__()
        self._inner = inner
        self._done = done
        self._path = path
        self._hasher = BlockHasher(block)
        self._pos = 0  # where the next write goes
        self._ipos = 0  # where the inner file's position is
        self._dirty: set[int] = set()  # blocks written over after they were hashed
        self._rehash = False  # bytes hashed were cut off: hash the file again at close

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._path is not None

    def readable(self) -> bool:
        return False

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        if getattr(self._inner, "closed", False) and self._path is None:
            return len(mv)  # discarded by its output (an abort): what is written goes nowhere
        if self._ipos != self._pos:
            self._inner.seek(self._pos)
            self._ipos = self._pos
        end = self._hasher.size
        if self._pos > end:  # past the end: the gap holds zeros
            self._hasher.zeros(self._pos - end)
            end = self._pos
        n = self._inner.write(mv)
        n = len(mv) if n is None else n
        if self._pos == end:
            self._hasher.update(mv if n == len(mv) else mv[:n])
        else:
            over = min(n, end - self._pos)
            self._mark(self._pos, over)
            if n > over:
                self._hasher.update(mv[over:n])
        self._pos += n
        self._ipos = self._pos
        return n

    def _mark(self, start: int, n: int) -> None:
        if n > 0:
            block = self._hasher.block
            self._dirty.update(range(start // block, (start + n - 1) // block + 1))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            pos = offset
        elif whence == os.SEEK_CUR:
            pos = self._pos + offset
        elif whence == os.SEEK_END and self._path is not None:
            self._ipos = self._inner.seek(0, os.SEEK_END)
            pos = self._ipos + offset
        else:
            raise io.UnsupportedOperation(f"seek with whence={whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        if pos != self._pos and self._path is None:
            raise io.UnsupportedOperation("this file is written in order only")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        end = self._hasher.size
        if size != end and self._path is None:
            raise io.UnsupportedOperation("this file is written in order only")
        self._inner.truncate(size)
        if size > end:
            self._hasher.zeros(size - end)
        elif size < end:
            self._rehash = True
        return size

    def flush(self) -> None:
        if not self.closed and not getattr(self._inner, "closed", False):
            self._inner.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._inner.close()
        finally:
            super().close()
        self._done(self._finish())

    def _finish(self) -> Digest:
        block = self._hasher.block
        if self._rehash and self._path is not None:
            return hash_file(self._path, block)
        blocks = self._hasher.raw_blocks()
        if self._dirty and self._path is not None:
            with open(self._path, "rb", buffering=0) as f:
                for i in sorted(self._dirty):
                    if i < len(blocks):
                        blocks[i] = xxhash.xxh3_128_digest(os.pread(f.fileno(), block, i * block))
        return digest_of(self._hasher.size, blocks)


def hashing_file(
    f: Any, done: Callable[[Digest], None], path: str | None = None, block: int | None = None
) -> BinaryIO:
    """``f`` (a binary file open for writing) behind a 1 MiB buffer, hashed as it is written;
    ``done(digest)`` when it is closed. A buffered local file is taken apart first so that its
    descriptor has one owner."""
    if isinstance(f, io.BufferedWriter):
        f.flush()
        f = f.detach()
    if path is None and isinstance(f, io.FileIO) and isinstance(f.name, str):
        path = f.name
    raw = HashingRaw(f, done, path, block)
    return io.BufferedWriter(raw, WRITE_BUFFER)  # type: ignore[return-value]
