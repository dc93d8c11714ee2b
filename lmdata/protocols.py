"""The reader contracts every format satisfies, the writer contract, and the capabilities a
token reader may add.

Readers match these shapes structurally; nothing inherits from them. :class:`EncodedTokens`,
:class:`SequenceIndex` and :class:`DocumentIds` name what a token reader may offer beyond
:class:`TokenSequences` (flat-tokens offers all three); the Loader checks for them with
:func:`satisfies`. Readers are deterministic,
safe to use from several threads, picklable (so DataLoader workers can receive them), and read
with positional I/O, so a process forked after the parent has read still gets correct data.
Every reader also has ``info()`` (a summary dict) and ``close()`` (release files and caches;
the reader reopens them if used again), and is a context manager that closes on exit.
The conformance suite (``tests/formats/test_conformance.py``) checks every format against this.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np


@runtime_checkable
class Records(Protocol):
    """A random-access sequence of items (a document, an example, a sample)."""

    format: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    def take(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The items at ``indices``, in that order; each storage block is read once."""
        ...

    def __iter__(self) -> Iterator[Any]: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@runtime_checkable
class TokenSpans(Protocol):
    """What packing needs of token sequences (all the Loader needs of a source).

    ``boundaries`` has ``len(self) + 1`` entries: sequence ``i`` is the flat range
    ``boundaries[i]:boundaries[i+1]`` of the concatenated tokens, which ``span`` reads without
    materialising documents.
    """

    def __len__(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def boundaries(self) -> np.ndarray: ...

    def span(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of the concatenation of all sequences."""
        ...


@runtime_checkable
class TokenSequences(TokenSpans, Protocol):
    """Records that are 1-D integer arrays, plus what packing needs (:class:`TokenSpans`)."""

    format: str

    def __getitem__(self, index: int) -> np.ndarray: ...

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]: ...

    def __iter__(self) -> Iterator[np.ndarray]: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...

    @property
    def max_token_id(self) -> int: ...


# where stored windows lie in memory: a byte buffer per window and the window's offset in it
Parts = tuple[list[memoryview], list[int]]


class EncodedTokens(TokenSequences, Protocol):
    """Token sequences stored as ``id * 2 + start bit`` (uint32; bit 0 set on each sequence's
    first token: the flat-tokens encoding), read as stored: packed and EOS rows need no
    sequence index (a row's document starts are in its tokens), and a reader that knows
    where its chunks lie hands them to the Loader's C layouts without a copy.

    ``starts`` are int64 window starts in tokens, multiplied by ``scale`` first (a packed row
    ``r`` of ``L`` tokens is the window at ``r`` with ``length = scale = L``). A window outside
    the tokens is an IndexError. The Loader's fast path: :mod:`lmdata.loader.encoded`.
    """

    def span_encoded(self, start: int, stop: int) -> np.ndarray:
        """Stored values ``start:stop`` of the concatenated tokens."""
        ...

    def encoded_windows(
        self,
        starts: Sequence[int] | np.ndarray,
        length: int,
        *,
        scale: int = 1,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Stored values of each window, shape ``(len(starts), length)``, gathered into
        ``out`` (C-contiguous uint32) when given."""
        ...

    def encoded_window_parts(
        self, starts: np.ndarray, length: int, *, scale: int = 1
    ) -> Parts | None:
        """Where each window lies in memory, or None where one does not lie in one piece
        (it straddles chunks, chunks are read by range): :meth:`encoded_windows` reads it."""
        ...

    def encoded_windows_into(
        self, layout: Any, starts: np.ndarray, width: int, scale: int, *args: Any
    ) -> bool:
        """Hand the windows where they lie to ``layout`` (a C layout of the Loader's kernel,
        which writes its outputs ``args`` in one call); False, outputs untouched, where it
        cannot (then :meth:`encoded_window_parts` or :meth:`encoded_windows`)."""
        ...


class SequenceIndex(Protocol):
    """A token reader whose sequence index reads in parts, never whole: runs of sequence
    starts and gathers of ``(start, stop)`` pairs (the Loader's bestfit layout and ``explain``
    search it; its truncated rows read two entries a document). ``boundaries_path`` names
    the index in errors."""

    @property
    def boundaries_path(self) -> str: ...

    def sequence_ranges(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``(start, stop)`` of each sequence, shape (n, 2) int64."""
        ...

    def sequence_starts(self, lo: int, hi: int) -> np.ndarray:
        """``boundaries[lo:hi]`` as int64."""
        ...


class DocumentIds(Protocol):
    """A token reader that knows its documents' ids (a token view of records with ``id``)."""

    def document_ids(self, docs: np.ndarray) -> list[Any] | None:
        """The ids of documents ``docs``, or None where the dataset records none."""
        ...


@functools.cache
def members(proto: type) -> frozenset[str]:
    """The names a protocol (and the protocols it extends) declares: its methods, properties
    and annotated attributes."""
    names: set[str] = set()
    for cls in proto.__mro__:
        if cls in (object, Protocol, Generic) or not getattr(cls, "_is_protocol", False):
            continue
        names.update(getattr(cls, "__annotations__", {}))
        for name, value in vars(cls).items():
            if callable(value) or isinstance(value, property):
                if not name.startswith("_") or name in _DUNDERS:
                    names.add(name)
    return frozenset(names)


_DUNDERS = frozenset({"__len__", "__getitem__", "__iter__"})


def missing(obj: object, proto: type) -> list[str]:
    """The members of ``proto`` that ``obj`` lacks (sorted), looked up on its type and its
    instance attributes: evaluating no property, which ``isinstance`` on a runtime protocol
    does (and ``boundaries`` may read a whole index)."""
    own = getattr(obj, "__dict__", {})
    kind = type(obj)
    return sorted(n for n in members(proto) if not (hasattr(kind, n) or n in own))


def satisfies(obj: object, proto: type) -> bool:
    """Whether ``obj`` has every member ``proto`` states (:func:`missing` finds none): the
    static check of a capability, never a hand-kept list of names."""
    return not missing(obj, proto)


W = TypeVar("W", bound="Writer")


@runtime_checkable
class Writer(Protocol):
    """What ``lmdata.writer`` returns: items in with ``write``, then ``close`` commits the
    dataset (atomically: before it, readers see the old dataset or none) or ``abort`` drops
    it. As a context manager it closes on a clean exit and aborts on an exception."""

    def write(self, item: Any, /) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def __enter__(self: W) -> W: ...

    def __exit__(self, *exc: object) -> Any: ...


def is_token_reader(reader: object) -> bool:
    return isinstance(reader, TokenSequences)


def normalize_index(index: int, n: int, where: str = "") -> int:
    """Python semantics for one index: negatives count from the end, out of range is IndexError."""
    try:
        i = operator.index(index)  # as a list does: 0.5 and "0" are not indices
    except TypeError:
        raise TypeError(f"indices must be integers, not {type(index).__name__}") from None
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"{where}index {index} out of range for {n} items")
    return i


def normalize_indices(indices: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """Vectorised ``normalize_index`` returning int64 indices."""
    idx = np.asarray(indices)
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, not {idx.dtype}")
    idx = idx.astype(np.int64, copy=True).reshape(-1)
    idx[idx < 0] += n
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        first = int(np.asarray(indices).reshape(-1)[np.argmax(bad)])
        raise IndexError(f"index {first} out of range for {n} items")
    return idx
