"""dedupe's units of input (spans): a document file whole, or the lines that start in one byte
range of a large plain one, and what is read of them (each document's key or paragraphs); see
:mod:`lmdata.dolma.dedupe`. A plain file is cut into byte ranges as tag and mix cut theirs
(:func:`lmdata.dolma._ranges.cut`).

Spans are numbered in input order (files in order, a file's ranges in order) and a key's place
is (span, line in the span, paragraph, n-gram), so sorting places gives input order whatever
the range size: the first occurrence stays first. Only plain JSONL is cut into ranges; a gzip
or zstd file is one span (it cannot be entered in the middle).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lmdata.dolma._ranges import cut
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.jsonpath import compile_path
from lmdata.errors import CorruptDataError
from lmdata.formats.dolma._files import (
    iter_range_lines,
    iter_raw_lines,
    line_number_at,
    splittable,
)
from lmdata.formats.dolma.reader import parse_line
from lmdata.storage import Store

try:
    import regex as _re
except ImportError:  # pragma: no cover
    import re as _re  # type: ignore[no-redef]

T = TypeVar("T")
_WORDS = _re.compile(r"\w+")


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
    larger than ``range_bytes`` is cut into ranges (:func:`cut`), any other file is whole."""
    out: list[tuple[Span, int]] = []
    for f, size in zip(files, sizes, strict=True):
        if size <= range_bytes or not splittable(f):
            out.append((Span(f), size))
            continue
        ranges = cut(size, range_bytes)
        for k, (a, b) in enumerate(ranges):
            out.append((Span(f, a, b, k, len(ranges)), b - a))
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


def split_paragraphs(text: str, sep: str, dolma_offsets: bool = True) -> list[tuple[int, int, str]]:
    """``(start, end, paragraph)`` in code points, ``end`` counting the separator after it.

    dolma (src/deduper.rs) adds the separator only while the character offset is below the
    text's length in *bytes* minus one. On ASCII text that drops the newline of a paragraph
    followed by a final empty one (``"a\n"`` gives ``[0, 1]``); on non-ASCII text the last span
    ends one past the text. ``dolma_offsets=True`` reproduces that, so attribute files are
    byte-identical to dolma's; ``False`` gives the exact spans (readers clamp either way).
    """
    out = []
    pos = 0
    pieces = text.split(sep)
    limit = len(text.encode("utf-8", "surrogatepass")) - 1
    for i, p in enumerate(pieces):
        start = pos
        pos += len(p)
        if (pos < limit) if dolma_offsets else (i + 1 < len(pieces)):
            pos += len(sep)
        out.append((start, pos, p))
    return out


def skip(key: str, cfg: DedupeConfig, chars: bool) -> bool:
    """True for a key ``cfg`` leaves out (empty, too short, too few words)."""
    if cfg.skip_empty and not key.strip():
        return True
    if cfg.min_length and (len(key) if chars else len(key.encode())) < cfg.min_length:
        return True
    return bool(cfg.min_words) and len(_WORDS.findall(key)) < cfg.min_words


@functools.lru_cache(maxsize=16)
def _compiled(key: str) -> Any:
    return compile_path(key)


def _doc_key(doc: dict[str, Any], cfg: DedupeConfig, path: str, lineno: int) -> str:
    found = _compiled(cfg.key).find(doc)
    if not found or not isinstance(found[0], str):
        what = "nothing" if not found else type(found[0]).__name__
        raise CorruptDataError(
            f"dedupe key {cfg.key} selects {what}; it must select a string in every document "
            "(dolma requires the same)",
            path=path,
            position=f"line {lineno}",
        )
    return found[0]


def _document(raw: bytes, cfg: DedupeConfig, path: str, lineno: int) -> tuple[dict[str, Any], str]:
    """The document of one line and what is deduped of it: its key (documents mode) or its
    text (paragraphs)."""
    doc = parse_line(raw, path, lineno)
    if cfg.mode == "documents":
        return doc, _doc_key(doc, cfg, path, lineno)
    text = doc.get("text")
    if not isinstance(text, str):
        raise CorruptDataError(
            "document has no string 'text'", path=path, position=f"line {lineno}"
        )
    return doc, text


def read(
    store: Store, key: str, span: Span, cfg: DedupeConfig
) -> Iterator[tuple[int, dict[str, Any], str]]:
    """``(line in the span, document, key or text)`` for every line of ``span``; an error
    names the line's number in the file (counted for a range only then)."""
    path = store.url(key)
    for i, where, raw in lines(store, key, span):
        try:
            doc, value = _document(raw, cfg, path, where)
        except CorruptDataError:
            if where > 0:
                raise
            _document(raw, cfg, path, line_of(store, key, where))
            raise
        yield i, doc, value
