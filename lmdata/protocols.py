"""The two reader contracts every format satisfies.

Readers match these shapes structurally; nothing inherits from them. Readers are deterministic,
safe to use from several threads, picklable (so DataLoader workers can receive them), and read
with positional I/O, so a process forked after the parent has read still gets correct data.
Every reader also has ``info()`` (a summary dict) and ``close()`` (release files and caches;
the reader reopens them if used again), and is a context manager that closes on exit.
The conformance suite (``tests/formats/test_conformance.py``) checks every format against this.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

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
class TokenSequences(Protocol):
    """Records that are 1-D integer arrays, plus what packing needs.

    ``boundaries`` has ``len(self) + 1`` entries: sequence ``i`` is the flat range
    ``boundaries[i]:boundaries[i+1]`` of the concatenated tokens, which ``span`` reads without
    materialising documents.
    """

    format: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> np.ndarray: ...

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]: ...

    def __iter__(self) -> Iterator[np.ndarray]: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def max_token_id(self) -> int: ...

    @property
    def boundaries(self) -> np.ndarray: ...

    def span(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of the concatenation of all sequences."""
        ...


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
