"""The on-disk layout of Modalities files, parsed and checked in one place.

``.pbin``: ``[u64 LE data_len][u32 LE token_width][tokens][pickle(list[(offset, length)])]``,
offsets and lengths in bytes from the start of the token data. ``.idx`` (raw JSONL index):
``pickle(list[(line offset, line length without the newline)])``. Both pickles are written by
modalities 0.5.0 with the default protocol of Python 3.8-3.13, which is 4, of plain ints
(read and written by :mod:`lmdata.formats._span_index`, which both file kinds share).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from lmdata.errors import CorruptDataError, InvalidInputError, LmdataError, StorageError

HEADER_SIZE = 12
TOKEN_WIDTHS = (1, 2, 4)
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


def sniff(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a consistent header followed by a pickle (cheap)."""
    from lmdata.storage import resolve

    try:
        store, key = resolve(path)
        if store.is_dir(key):
            return False
        size = store.size(key)
        raw = store.read_range(key, 0, HEADER_SIZE)
        if header_problems(raw, size):
            return False
        start = HEADER_SIZE + int.from_bytes(raw[:8], "little")
        head, tail = store.read_ranges(key, [(start, 1), (size - 1, 1 if size else 0)])
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except (OSError, LmdataError):
        return False
    # pickles of protocol 2+ start with PROTO (0x80) and end with STOP (".")
    return head == b"\x80" and tail == b"."
