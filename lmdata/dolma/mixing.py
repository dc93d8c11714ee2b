"""What ``mix`` does to each document, in dolma's order (see :mod:`lmdata.dolma.mixer`): the
attribute files read in step with their document file, filters, span replacement, discarded
fields, the length rule and the provenance, for the sources of one unit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from lmdata import parallel
from lmdata.dolma._unmatched import MAX_NAMES, rule_attributes
from lmdata.dolma.config import StreamConfig
from lmdata.dolma.rules import any_match, replace_spans, selector, shorter_than
from lmdata.errors import CorruptDataError
from lmdata.formats.dolma._files import iter_range_lines, iter_raw_lines, read_chunks
from lmdata.formats.dolma._paths import Stores, attribute_path, is_file
from lmdata.formats.dolma._rows import merge_attribute_row, parse_line
from lmdata.storage import Store


@dataclass(frozen=True)
class Source:
    """The documents of one input file: all of it, or (a plain file cut into ranges) the
    lines starting in bytes ``[start, end)``, the first of which is line ``first_line``
    (counted by the job before mixing: provenance names every document's line)."""

    path: str
    start: int = 0
    end: int = -1  # -1: the whole file
    first_line: int = 1

    @property
    def whole(self) -> bool:
        return self.end < 0


@dataclass(frozen=True)
class ShardStats:
    """What one unit (a shard or a piece of one) did; pieces add up with ``+``."""

    read: int = 0
    written: int = 0
    filtered: int = 0
    too_short: int = 0
    skipped: bool = False
    warnings: tuple[str, ...] = ()
    checksum: tuple[int, int] = (0, 0)  # of a piece written for joining (gzip: CRC-32, size)
    # of the documents read: those no include filter matched (filtered counts them too), and
    # the attribute names seen while a name the stream's rules read was still unseen (sorted)
    not_included: int = 0
    attributes: tuple[str, ...] = ()

    def __add__(self, other: ShardStats) -> ShardStats:
        """The counts, warnings and attribute names of both (a total over pieces or shards)."""
        return ShardStats(
            read=self.read + other.read,
            written=self.written + other.written,
            filtered=self.filtered + other.filtered,
            too_short=self.too_short + other.too_short,
            warnings=self.warnings + other.warnings,
            not_included=self.not_included + other.not_included,
            attributes=tuple(sorted({*self.attributes, *other.attributes})),
        )


class _AttributeStreams:
    """The attribute files of one document file, read in step with it (dolma's checks)."""

    def __init__(
        self,
        store: Store,
        doc_key: str,
        names: tuple[str, ...],
        warnings: list[str],
        first_line: int = 1,
    ):
        """The streams positioned at line ``first_line`` (a range of a document file: its
        earlier lines are read and skipped). Each warning is given by one range only."""
        self.doc_file = store.url(doc_key)
        self.streams = []
        self.warnings = warnings
        for n in names:
            ak = attribute_path(doc_key, n)
            ap = store.url(ak)
            if not is_file(store, ak):
                if first_line == 1:
                    warnings.append(
                        f"{ap}: missing, so attribute set {n!r} is not merged "
                        f"for {self.doc_file} (filters see its keys as absent)"
                    )
                continue
            it = _rows_from(store, ak, first_line)
            # an attribute file that ends before this range was reported by the range it ends in
            self.streams.append([ap, it if it is not None else iter(()), it is not None])

    def merge(self, doc: dict[str, Any], lineno: int) -> None:
        for st in self.streams:
            ap, it, alive = st
            if not alive:
                continue
            nxt = next(it, None)
            if nxt is None:
                st[2] = False
                self.warnings.append(
                    f"{ap}: missing attributes from line {lineno} on (the file is shorter than "
                    f"{self.doc_file}); later documents get none from it"
                )
                continue
            row = _loads(nxt[1])
            attrs = row.get("attributes") if type(row) is dict else None
            rid, did = (row.get("id"), doc.get("id")) if attrs is not None else (None, None)
            # the common case inline: a row of the same id with an attributes object
            if type(attrs) is dict and rid == did and type(rid) is type(did):
                target = doc.get("attributes")
                if type(target) is dict:
                    target.update(attrs)
                else:
                    doc["attributes"] = attrs  # the row is not used again
            else:  # anything else the careful way, which names what is wrong
                merge_attribute_row(doc, parse_line(nxt[1], ap, lineno), self.doc_file, ap, lineno)


def _rows_from(store: Store, key: str, line: int) -> Iterator[tuple[int, bytes]] | None:
    """The rows of an attribute file from row ``line`` on (None if it has fewer rows before
    it). Only a plain document file is read in ranges, and its attribute files mirror its name,
    so a file entered past its start is plain: at the row's byte offset, found by counting
    newlines (no rows parsed)."""
    if line == 1:
        return iter_raw_lines(store, key)
    need = line - 1  # newlines before the row
    pos = 0
    for chunk in read_chunks(store, key):
        n = chunk.count(b"\n")
        if n < need:
            need -= n
            pos += len(chunk)
            continue
        at = -1
        for _ in range(need):
            at = chunk.index(b"\n", at + 1)
        return iter_range_lines(store, key, pos + at + 1, 1 << 62)
    return None


def _loads(raw: bytes) -> Any:
    """The JSON value of a line, or None if it is not JSON (the caller then asks parse_line,
    which names the file and line)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _lines(store: Store, key: str, src: Source) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the documents of ``src``."""
    if src.whole:
        return iter_raw_lines(store, key)
    lines = iter_range_lines(store, key, src.start, src.end)
    return ((src.first_line + k, raw) for k, (_, raw) in enumerate(lines))


def mix_documents(
    sources: tuple[Source, ...], stream: StreamConfig, write: Callable[[bytes], Any]
) -> ShardStats:
    """Mix the documents of ``sources``, giving the lines kept to ``write``. Per document, in
    dolma's order: parse, merge attributes, filter, replace spans, discard fields, drop a too
    short text, set the provenance, write with sorted keys (one pass, no per-document calls
    beyond what a document needs)."""
    stores = Stores(stream.storage_options)
    include = tuple((e, selector(e, stream.syntax)) for e in stream.include)
    exclude = tuple((e, selector(e, stream.syntax)) for e in stream.exclude)
    spans, discard, min_bytes = (
        stream.span_replacement,
        stream.discard_fields,
        stream.min_text_length,
    )
    dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
    every = parallel.REPORT_EVERY
    read = written = filtered = too_short = not_included = 0
    warnings: list[str] = []
    # the names the rules read and no document has shown yet; while there is one, the names
    # seen are gathered (for the job's did-you-mean), at most MAX_NAMES of them besides the
    # rules' own names that showed up (always kept: the driver judges the rules by them)
    unseen = set(rule_attributes(stream))
    found: set[str] = set()
    seen: set[str] = set()
    for src in sources:
        store, key = stores(src.path)
        where = store.url(key)
        name = where.rsplit("/", 1)[-1]
        attrs = _AttributeStreams(store, key, stream.attributes, warnings, src.first_line)
        merge = attrs.merge if attrs.streams else None
        for lineno, raw in _lines(store, key, src):
            doc = _loads(raw)
            if type(doc) is not dict:
                doc = parse_line(raw, where, lineno)  # raises, naming the line
            if merge is not None:
                merge(doc, lineno)
            read += 1
            if read % every == 0:
                parallel.report(every)
            if unseen:
                names = doc.get("attributes")
                if type(names) is dict:
                    hit = unseen.intersection(names)
                    if hit:
                        unseen -= hit
                        found |= hit
                    if len(seen) < MAX_NAMES:
                        seen.update(names)
            if include and not any_match(include, doc, where, lineno):
                filtered += 1
                not_included += 1
                continue
            if exclude and any_match(exclude, doc, where, lineno):
                filtered += 1
                continue
            text = doc.get("text")
            if not isinstance(text, str):
                raise CorruptDataError(
                    "document has no string 'text'", path=where, position=f"line {lineno}"
                )
            if spans:
                doc["text"] = text = replace_spans(text, doc, spans)
            for f in discard:
                doc.pop(f, None)
            if min_bytes > 0 and shorter_than(text, min_bytes):
                too_short += 1
                continue
            meta = doc.get("metadata")
            if not isinstance(meta, dict):
                meta = doc["metadata"] = {}
            meta["provenance"] = f"{name}:{lineno}"
            write(dumps(doc, option=sort))
            written += 1
    parallel.report(read % every)
    return ShardStats(
        read,
        written,
        filtered,
        too_short,
        warnings=tuple(warnings),
        not_included=not_included,
        attributes=tuple(sorted(found.union(sorted(seen - found)[:MAX_NAMES]))),
    )
