"""Partial decode of Blosc frames (the c-blosc 1 format numcodecs writes): items ``lo:hi`` of
a chunk from only the blocks that cover them, for random rows of chunks not in the cache (a
2048-token row is 8 KiB of a 16 MiB chunk, whose full decode costs ~9 ms).

Only the layouts checked against full decodes are taken (a frame stored as is; whole blocks of
byte- or bit-shuffled items in lz4 streams, one per item byte): anything else gives None and
the caller decodes the whole chunk. Every offset and size read from the frame is
checked against the buffer before use, and lz4 runs through numcodecs' bounded block decoder
(``LZ4_decompress_safe`` into exactly the declared size), so a hostile frame fails with a
BadChunk, never reads or writes out of bounds.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

_MEMCPYED, _SHUFFLE, _BITSHUFFLE, _DELTA, _DONT_SPLIT = 0x2, 0x1, 0x4, 0x8, 0x10
_LZ4 = 1  # compressor code in bits 5-7 of the flags
_MIN_SPLIT = 128  # c-blosc splits a block into typesize streams when it has this many items
_MAX_SPLITS = 16  # ... and typesize is at most this (else one stream, split flag or not)
# no Blosc codec expands more than 2^15 times (zstd: a 128 KiB run in a 4-byte block), so a
# frame declaring more than this many times its size is corrupt
_MAX_EXPANSION = 1 << 16


class BadChunk(ValueError):
    """Bytes that cannot be a valid chunk: raised by the frame checks here and in ``_codecs``,
    and in place of whatever a codec library raises on bytes it refuses (kept as the cause).
    The reader reports it, and only it, as a CorruptDataError naming the chunk: memory
    running out or a bug of ours inside a decode goes through as it is."""


@dataclass(frozen=True)
class Frame:
    """The parsed header of a Blosc frame that can be partially decoded."""

    nbytes: int
    blocksize: int
    itemsize: int
    shuffle: int  # 1 (bytes) or 2 (bits); 0 for a frame stored as is
    memcpyed: bool
    starts: tuple[int, ...]  # byte offset of each block's streams


def check_header(buf: Any, limit: int) -> tuple[int, int, int, int, int]:
    """(version, flags, typesize, nbytes, blocksize) of the Blosc frame ``buf``, its sizes
    checked against the buffer and ``limit`` (the chunk's declared bytes) before a decoder
    trusts them (c-blosc reads ``cbytes`` as the frame's length and allocates ``nbytes``);
    BadChunk where they cannot be valid."""
    n = len(buf)
    if n < 16:
        raise BadChunk(f"blosc header cut short ({n} of 16 bytes)")
    version, _vlz, flags, typesize = bytes(buf[:4])
    nbytes, blocksize, cbytes = struct.unpack_from("<III", buf, 4)
    if nbytes > limit:
        raise BadChunk(f"blosc frame declares {nbytes} bytes, more than the chunk's {limit}")
    if cbytes != n:
        raise BadChunk(f"blosc frame declares {cbytes} compressed bytes, file has {n}")
    if flags & _MEMCPYED and n < 16 + nbytes:
        raise BadChunk(f"blosc frame stored as is declares {nbytes} bytes, holds {n - 16}")
    if nbytes > n * _MAX_EXPANSION:
        raise BadChunk(
            f"blosc frame of {n} bytes declares {nbytes} decoded: more than any codec expands"
        )
    return version, flags, typesize, nbytes, blocksize


def parse(buf: Any, itemsize: int, limit: int) -> Frame | None:
    """The frame of ``buf`` when its layout is one this module decodes, else None (a full
    decode handles or reports it). BadChunk for a frame that cannot be valid."""
    n = len(buf)
    version, flags, typesize, nbytes, blocksize = check_header(buf, limit)
    if version != 2 or typesize != itemsize or nbytes % itemsize:
        return None
    if flags & _MEMCPYED:
        return Frame(nbytes, max(1, nbytes), itemsize, 0, True, ())
    # (without shuffle c-blosc keeps a block in one stream: left to the full decode)
    shuffle = {_SHUFFLE: 1, _BITSHUFFLE: 2}.get(flags & (_SHUFFLE | _BITSHUFFLE))
    if shuffle is None or flags & (_DELTA | _DONT_SPLIT) or flags >> 5 != _LZ4:
        return None
    if itemsize > _MAX_SPLITS or blocksize <= 0 or blocksize % (8 * itemsize):
        return None
    if blocksize // itemsize < _MIN_SPLIT:
        return None
    nblocks = -(-nbytes // blocksize)
    if 16 + 4 * nblocks > n:
        raise BadChunk("blosc block table cut short")
    starts = struct.unpack_from(f"<{nblocks}I", buf, 16)
    for s in starts:
        if not 16 + 4 * nblocks <= s < n:
            raise BadChunk(f"blosc block starts at {s}, outside the frame of {n} bytes")
    return Frame(nbytes, blocksize, itemsize, shuffle, False, starts)


def nblocks(frame: Frame) -> int:
    return max(1, len(frame.starts))


def can_read(frame: Frame, lo: int, hi: int) -> bool:
    """Whether items ``lo:hi`` lie in whole blocks (the last, shorter block is left to a full
    decode: c-blosc lays it out differently)."""
    if frame.memcpyed:
        return True
    per = frame.blocksize // frame.itemsize
    return (hi - 1) // per < frame.nbytes // frame.blocksize


def _block(buf: Any, frame: Frame, j: int) -> np.ndarray:
    """Block ``j`` decompressed, still shuffled (one stream per item byte, concatenated)."""
    import numcodecs

    lz4 = numcodecs.LZ4()
    neblock = frame.blocksize // frame.itemsize
    at, n = frame.starts[j], len(buf)
    parts = []
    for _ in range(frame.itemsize):
        if at + 4 > n:
            raise BadChunk(f"blosc stream header at {at} past the frame's end")
        (csize,) = struct.unpack_from("<i", buf, at)
        at += 4
        if not 0 < csize <= neblock or at + csize > n:
            raise BadChunk(f"blosc stream of {csize} bytes at {at} does not fit the block")
        data = buf[at : at + csize]
        if csize == neblock:  # stored as is
            parts.append(bytes(data))
        else:
            try:
                out = lz4.decode(struct.pack("<I", neblock) + bytes(data))
            except RuntimeError as e:  # numcodecs' "LZ4 decompression error"
                raise BadChunk(f"blosc stream at {at}: {e}") from e
            if len(out) != neblock:
                raise BadChunk(f"blosc stream decodes to {len(out)} bytes, not {neblock}")
            parts.append(bytes(out))
        at += csize
    return np.frombuffer(b"".join(parts), np.uint8).reshape(frame.itemsize, neblock)


def _unshuffle(planes: np.ndarray, frame: Frame, a: int, b: int) -> np.ndarray:
    """Items ``a:b`` of a block (``a``, ``b`` multiples of 8) as bytes, shape (b - a, itemsize)."""
    if frame.shuffle == 1:
        return planes[:, a:b].T
    # bit shuffle: 8 * itemsize rows of n/8 bytes; row 8*k + i holds bit i of byte k of each item
    rows = planes.reshape(8 * frame.itemsize, -1)[:, a // 8 : b // 8]
    bits = np.unpackbits(rows, axis=1, bitorder="little")  # (8 * itemsize, b - a)
    bits = bits.reshape(frame.itemsize, 8, b - a).transpose(2, 0, 1)
    return np.packbits(bits, axis=2, bitorder="little").reshape(b - a, frame.itemsize)


def read_into(
    buf: Any, frame: Frame, lo: int, hi: int, out: np.ndarray, planes: dict | None = None
) -> int:
    """Write items ``lo:hi`` (as bytes) into the byte array ``out`` at ``lo * itemsize``;
    returns the blocks decompressed (``planes``: blocks decompressed before, kept there)."""
    planes = {} if planes is None else planes
    isz = frame.itemsize
    if frame.memcpyed:
        out[lo * isz : hi * isz] = np.frombuffer(buf, np.uint8, (hi - lo) * isz, 16 + lo * isz)
        return 0
    per = frame.blocksize // isz
    done = 0
    for j in range(lo // per, (hi - 1) // per + 1):
        if j not in planes:
            planes[j] = _block(buf, frame, j)
            done += 1
        a, b = max(lo, j * per) - j * per, min(hi, (j + 1) * per) - j * per
        a8, b8 = a - a % 8, min(per, -(-b // 8) * 8)
        items = _unshuffle(planes[j], frame, a8, b8)[a - a8 : b - a8]
        at = (j * per + a) * isz
        out[at : at + (b - a) * isz] = np.ascontiguousarray(items).reshape(-1)
    return done


class Partial:
    """Partial reads of one array's Blosc chunks on a local store (chunk files mapped, never
    read whole). A chunk is read in part only while that costs less than decoding it whole:
    once its partial reads have decompressed ``nblocks / FULL_AFTER`` blocks (a block read
    here costs about four times its share of a full decode), the next read decodes it whole
    and the cache keeps it (reads that stay random then hit, as they would from the start)."""

    FULL_AFTER = 4
    LARGEST_PART = 8  # at most 1/8 of the blocks in one call, else a full decode

    def __init__(self, store: Any, itemsize: int, limit: int) -> None:
        self.store = store
        self.itemsize = itemsize
        self.limit = limit
        self._frames: dict[str, tuple[Any, Frame | None]] = {}
        self._spent: dict[str, int] = {}
        self._lock = threading.Lock()  # inserts and evictions of _frames and _spent

    def clear(self) -> None:
        """Let go of the chunk maps and the blocks counted (the array was closed)."""
        with self._lock:
            self._frames.clear()
            self._spent.clear()

    def _frame(self, key: str) -> tuple[Any, Frame | None]:
        got = self._frames.get(key)
        if got is None:
            buf = memoryview(self.store.mmap(key))
            got = (buf, parse(buf, self.itemsize, self.limit))
            with self._lock:  # (iterating while another thread inserts raises RuntimeError)
                while len(self._frames) >= 64:
                    old = next(iter(self._frames))
                    self._frames.pop(old)
                    self._spent.pop(old, None)  # (its count goes with it: both stay bounded)
                self._frames[key] = got
        return got

    def read(self, key: str, ranges: list[tuple[int, int]], need: int) -> np.ndarray | None:
        """A byte array of the chunk's size holding items ``lo:hi`` of each range (the rest
        unset), or None where a full decode should run. BadChunk for a corrupt frame."""
        buf, frame = self._frame(key)
        if frame is None or frame.nbytes < need * self.itemsize:
            return None
        # (a frame stored as is is read by slices of its map: always cheaper than a copy)
        if not frame.memcpyed and not self._worth_it(key, frame, ranges):
            return None
        out = np.empty(frame.nbytes, np.uint8)
        planes: dict[int, np.ndarray] = {}
        for lo, hi in ranges:
            read_into(buf, frame, lo, hi, out, planes)
        return out

    def _worth_it(self, key: str, frame: Frame, ranges: list[tuple[int, int]]) -> bool:
        """Whether reading ``ranges`` from the blocks of chunk ``key`` costs less than its
        full decode (counted as spent if so; forgotten if not: the full decode is cached)."""
        per = frame.blocksize // self.itemsize
        blocks = {j for lo, hi in ranges for j in range(lo // per, (hi - 1) // per + 1)}
        nb = nblocks(frame)
        spent = self._spent.get(key, 0) + len(blocks)
        if (
            spent * self.FULL_AFTER > nb
            or len(blocks) * self.LARGEST_PART > nb
            or not all(can_read(frame, lo, hi) for lo, hi in ranges)
        ):
            with self._lock:
                self._spent.pop(key, None)
                self._frames.pop(key, None)
            return False
        with self._lock:
            if key in self._frames:  # (not let go meanwhile by another thread)
                self._spent[key] = spent
        return True
