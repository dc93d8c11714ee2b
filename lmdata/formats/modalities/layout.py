"""The on-disk layout of Modalities files, parsed and checked in one place.

``.pbin``: ``[u64 LE data_len][u32 LE token_width][tokens][pickle(list[(offset, length)])]``,
offsets and lengths in bytes from the start of the token data. ``.idx`` (raw JSONL index):
``pickle(list[(line offset, line length without the newline)])``. Both pickles are written by
modalities 0.5.0 with the default protocol of Python 3.8-3.13, which is 4, of plain ints.
"""

from __future__ import annotations

import math
import os
import pickle
import struct
from dataclasses import dataclass

import numpy as np

from lmdata._pickle import describe, safe_load_prefix
from lmdata.errors import CorruptDataError, InvalidInputError

HEADER_SIZE = 12
TOKEN_WIDTHS = (1, 2, 4)
PICKLE_PROTOCOL = 4  # what modalities 0.5.0 writes; Python 3.14's default (5) differs
DTYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}
_HEADER = struct.Struct("<QI")


def width_for_vocab(vocab_size: int) -> int:
    """Bytes per token for ``vocab_size``, computed exactly as modalities 0.5.0 does.

    ``ceil(log2(vocab)/8)`` mapped to 1, 2 or 4 (3 becomes 4). The origin's quirk that a
    vocabulary of 1 gives 4 bytes is kept so widths always match the origin's.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise InvalidInputError(f"vocab_size must be an integer, got {vocab_size!r}")
    if vocab_size < 1:
        raise InvalidInputError(f"vocab_size must be at least 1, got {vocab_size}")
    n = math.ceil(math.log2(int(vocab_size)) / 8)
    if n == 1:
        return 1
    if n == 2:
        return 2
    if n <= 4:
        return 4
    raise InvalidInputError(
        f"vocab_size {vocab_size} needs more than 4 bytes per token; the format stores at most 4"
    )


def width_for_max_id(max_id: int) -> int:
    """The smallest width that holds ids up to ``max_id`` (used when no vocabulary is known)."""
    for w in TOKEN_WIDTHS:
        if max_id < 1 << (8 * w):
            return w
    raise InvalidInputError(f"token id {max_id} does not fit in 4 bytes")


@dataclass(frozen=True)
class PbinHeader:
    """The 12-byte header of a ``.pbin`` file, checked against the file size."""

    data_len: int
    token_width: int
    file_size: int

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.token_width]

    @property
    def num_tokens(self) -> int:
        return self.data_len // self.token_width

    @property
    def index_start(self) -> int:
        return HEADER_SIZE + self.data_len

    def pack(self) -> bytes:
        return _HEADER.pack(self.data_len, self.token_width)


def header_problems(raw: bytes, file_size: int) -> list[str]:
    """What is wrong with a header (empty when it is consistent with the file size)."""
    if len(raw) < HEADER_SIZE:
        return [f"file has {file_size} bytes, fewer than the 12-byte header (truncated?)"]
    data_len, width = _HEADER.unpack(raw[:HEADER_SIZE])
    out = []
    if width not in TOKEN_WIDTHS:
        out.append(
            f"header token width is {width}, must be 1, 2 or 4 (files from modalities before "
            "v0.4.0 used an older layout that cannot be read)"
        )
    elif data_len % width:
        out.append(f"header data length {data_len} is not a multiple of the token width {width}")
    if HEADER_SIZE + data_len > file_size:
        out.append(
            f"header says {data_len} bytes of token data but the file has only "
            f"{max(file_size - HEADER_SIZE, 0)} after the header (truncated?)"
        )
    return out


def parse_header(raw: bytes, file_size: int, path: str | os.PathLike[str]) -> PbinHeader:
    problems = header_problems(raw, file_size)
    if problems:
        raise CorruptDataError("; ".join(problems), path=path, position="header")
    data_len, width = _HEADER.unpack(raw[:HEADER_SIZE])
    return PbinHeader(data_len=data_len, token_width=width, file_size=file_size)


@dataclass(frozen=True)
class SpanIndex:
    """A list of (offset, length) pairs as two int64 arrays."""

    offsets: np.ndarray
    lengths: np.ndarray
    trailing: int = 0  # bytes after the pickle's end, which every reader ignores

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def ends(self) -> np.ndarray:
        return self.offsets + self.lengths


def load_span_index(
    data: bytes, *, path: str | os.PathLike[str], where: str, allow_unsafe: bool = False
) -> SpanIndex:
    """Unpickle a Modalities index (list of int pairs) safely into arrays.

    Offsets are not range-checked here (each file kind checks them against its data).
    Anything else (a dict, floats, negative lengths, numpy objects from a trusted pickle) is a
    CorruptDataError naming the entry.
    """
    if not data:
        raise CorruptDataError(
            "the index is missing (the file ends where the pickled index should start; truncated?)",
            path=path,
            position=where,
        )
    obj, used = safe_load_prefix(data, where=where, path=os.fspath(path), allow_unsafe=allow_unsafe)
    trailing = len(data) - used
    if not isinstance(obj, list):
        raise CorruptDataError(
            f"the index is a {type(obj).__name__}, not a list of (offset, length) pairs",
            path=path,
            position=where,
        )
    n = len(obj)
    if n == 0:
        return SpanIndex(np.zeros(0, np.int64), np.zeros(0, np.int64), trailing)
    try:  # fast path: a regular list of int pairs becomes one (n, 2) int64 array
        arr = np.array(obj)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is not None and arr.dtype == np.int64 and arr.shape == (n, 2):
        offsets, lengths = arr[:, 0].copy(), arr[:, 1].copy()
        if (lengths >= 0).all():
            return SpanIndex(offsets, lengths, trailing)
    # slow path: find and name the first bad entry
    offsets = np.empty(n, dtype=np.int64)
    lengths = np.empty(n, dtype=np.int64)
    for i, entry in enumerate(obj):
        try:
            off, ln = entry
            if type(off) is not int or type(ln) is not int:
                raise TypeError
            offsets[i] = off
            lengths[i] = ln
        except (TypeError, ValueError, OverflowError):
            raise CorruptDataError(
                f"index entry {i} is {describe(entry)}, not a pair of integers",
                path=path,
                position=where,
            ) from None
    bad = np.flatnonzero(lengths < 0)
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(
            f"index entry {i} is ({offsets[i]}, {lengths[i]}); a length cannot be negative",
            path=path,
            position=where,
        )
    return SpanIndex(offsets, lengths, trailing)


def dump_span_index(offsets: np.ndarray | list[int], lengths: np.ndarray | list[int]) -> bytes:
    """The pickle bytes modalities writes: a list of tuples of plain ints, protocol 4."""
    # numpy ints would pickle as numpy objects (different bytes); tolist() gives Python ints.
    offs = np.asarray(offsets, dtype=np.int64).tolist()
    lens = np.asarray(lengths, dtype=np.int64).tolist()
    return pickle.dumps(list(zip(offs, lens, strict=True)), protocol=PICKLE_PROTOCOL)
