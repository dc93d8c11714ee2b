"""dedupe's units of input (spans): a document file whole, or the lines that start in one byte
range of a large plain one; see :mod:`lmdata.dolma.dedupe`.

Spans are numbered in input order (files in order, a file's ranges in order) and a key's place
is (span, line in the span, paragraph, n-gram), so sorting places gives input order whatever
the range size: the first occurrence stays first. Only plain JSONL is cut into ranges; a gzip
or zstd file is one span (it cannot be entered in the middle).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from lmdata.formats.dolma._files import (
    iter_range_lines,
    iter_raw_lines,
    line_number_at,
    splittable,
)
from lmdata.storage import Store

T = TypeVar("T")


@dataclass(frozen=True)
class Span:
    """Document file ``path`` (as the config lists it) whole, or the lines starting in bytes
    ``[start, end)`` of it, range ``part`` of ``parts``."""

    path: str
    start: int = 0
    end: int = -1
    part: int = 0
    parts: int = 1

    @property
    def ranged(self) -> bool:
        """True for a byte range: its attribute rows are a piece of the file's, joined later."""
        return self.parts > 1


def plan(files: Sequence[str], sizes: Sequence[int], range_bytes: int) -> list[tuple[Span, int]]:
    """Every span of ``files`` (of ``sizes`` bytes) in input order, with its size: a plain file
    larger than ``range_bytes`` is cut into the fewest ranges of equal size (to a byte) not
    larger than that, any other file is whole."""
    out: list[tuple[Span, int]] = []
    for f, size in zip(files, sizes, strict=True):
        if size <= range_bytes or not splittable(f):
            out.append((Span(f), size))
            continue
        n = -(-size // range_bytes)
        for k in range(n):
            a, b = k * size // n, (k + 1) * size // n
            out.append((Span(f, a, b, k, n), b - a))
    return out


def groups(items: Sequence[T], sizes: Sequence[int], n: int) -> list[list[tuple[int, T]]]:
    """``items`` (numbered in order) cut into at most ``n`` consecutive groups of about equal
    bytes: the hash and write units. An item goes to the group its middle byte falls in, so
    ranges of a share each get a group of their own."""
    if not items:
        return []
    n = max(1, min(n, len(items)))
    target = sum(sizes) / n
    out: list[list[tuple[int, T]]] = [[]]
    acc = 0
    for k, (item, size) in enumerate(zip(items, sizes, strict=True)):
        left = len(items) - k  # items not yet placed, this one included
        middle = acc + size / 2
        if out[-1] and len(out) < n and (middle >= target * len(out) or left <= n - len(out)):
            out.append([])
        out[-1].append((k, item))
        acc += size
    return out


def lines(store: Store, key: str, span: Span) -> Iterator[tuple[int, int, bytes]]:
    """``(line in the span from 1, where, bytes without the newline)`` for each line of the
    span; ``where`` is the line's number in the file for a whole file, ``-(byte offset + 1)``
    for a range (counting lines up to it costs a read: only an error needs it, see
    :func:`line_of`)."""
    if not span.ranged:
        for i, raw in iter_raw_lines(store, key):
            yield i, i, raw
        return
    for i, (off, raw) in enumerate(iter_range_lines(store, key, span.start, span.end), 1):
        yield i, -(off + 1), raw


def line_of(store: Store, key: str, where: int) -> int:
    """The line number in the file of a line :func:`lines` gave as ``where``."""
    return where if where > 0 else line_number_at(store, key, -where - 1)
