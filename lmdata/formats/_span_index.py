"""The span index both Modalities file kinds share: a pickled list of ``(offset, length)``.

The ``.pbin`` index (token spans, in bytes from the start of the token data) and the raw-JSONL
``.idx`` (line spans, without the newline) are the same pickle, written by modalities 0.5.0
with protocol 4 (the default of Python 3.8-3.13) of plain ints. Kept outside both format
packages so neither imports the other.
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import re
import sys
from dataclasses import dataclass

import numpy as np

from lmdata._pickle import describe, safe_load_prefix
from lmdata.errors import CorruptDataError

PICKLE_PROTOCOL = 4  # what modalities 0.5.0 writes; Python 3.14's default (5) differs

# The opcodes a protocol 4/5 pickle of a list of int pairs is made of, as the C pickler writes it:
# PROTO, FRAME, EMPTY_LIST + MEMOIZE, then MARK, ints (BININT1/BININT2/BININT, LONG1 up to 8
# bytes), TUPLE2 + MEMOIZE, BINGET/LONG_BINGET (a pair listed twice, as a reordered raw index
# has), APPENDS (APPEND for a one-item list), FRAMEs at any opcode boundary, STOP. Every token
# starts with its own opcode byte and has a fixed length, so a match splits the bytes into
# opcodes exactly as the unpickler reads them (it does not stop at frame ends). None of these
# opcodes names a global or stores into a memo slot of its choosing (MEMOIZE takes the next one;
# a GET of a missing slot is an error), so a pickle that matches needs neither the allow-list
# nor the memo walk of lmdata._pickle. The checks below then make sure it is a list of pairs.
_LONG1 = b"|".join(rb"\x%02x.{%d}" % (n, n) for n in range(1, 9))  # 1-8 byte ints
_OPCODE = rb"\x86\x94|M..|J.{4}|K.|[(ea]|h.|j.{4}|\x95.{8}|\x8a(?:" + _LONG1 + rb")"
if sys.version_info >= (3, 11):  # a pair of small ints in one step (the usual case, 3x faster);
    # possessive, so a failed match cannot backtrack into the pair's parts (exponential)
    _INT = rb"(?:M..|J.{4}|K.)"
    _BODY = rb"(?:" + _INT + _INT + rb"\x86\x94|" + _OPCODE + rb")*+"
else:  # no possessive repeats before 3.11: one unambiguous alternative per opcode
    _BODY = rb"(?:" + _OPCODE + rb")*"
_PLAIN_INDEX = re.compile(rb"\x80[\x04\x05](?:\x95.{8})?\]\x94" + _BODY + rb"\.", re.S)


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
    plain = _load_plain(data)
    if plain is not None:
        obj, used = plain
    else:
        obj, used = safe_load_prefix(
            data, where=where, path=os.fspath(path), allow_unsafe=allow_unsafe
        )
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
    arr = None
    if plain is not None:  # only ints, pairs and this list: fromiter takes int pairs, or fails
        try:
            arr = np.fromiter(itertools.chain.from_iterable(obj), np.int64, 2 * n).reshape(n, 2)
        except (ValueError, TypeError, OverflowError):
            pass
    if arr is None:
        try:  # a regular list of int pairs becomes one (n, 2) int64 array
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


def _load_plain(data: bytes) -> tuple[object, int] | None:
    """(value, bytes used) of an index pickle made only of :data:`_PLAIN_INDEX`'s opcodes,
    unpickled at C speed; None for any other pickle (or one the unpickler refuses), which then
    takes the checked path of :func:`lmdata._pickle.safe_load_prefix` and its error messages."""
    if _PLAIN_INDEX.match(data) is None:
        return None
    f = io.BytesIO(data)
    try:
        return pickle.Unpickler(f).load(), f.tell()
    except Exception:  # APPENDS without a MARK, a FRAME past the end: the checked path says so
        return None


def dump_span_index(offsets: np.ndarray | list[int], lengths: np.ndarray | list[int]) -> bytes:
    """The pickle bytes modalities writes: a list of tuples of plain ints, protocol 4."""
    # numpy ints would pickle as numpy objects (different bytes); tolist() gives Python ints.
    offs = np.asarray(offsets, dtype=np.int64).tolist()
    lens = np.asarray(lengths, dtype=np.int64).tolist()
    return pickle.dumps(list(zip(offs, lens, strict=True)), protocol=PICKLE_PROTOCOL)
