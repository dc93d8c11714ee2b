"""``mix``: dolma's mixer. Same documents, same order, same texts as ``dolma mix``.

Per document, in dolma's order (research notes, section 5): parse; merge each listed
attribute set's ``attributes`` (later sets overwrite earlier keys); filter (keep when include
is empty or any include matches, and no exclude matches); span replacement; drop
``discard_fields``; drop the document if its trimmed text is shorter than ``min_text_length``
*bytes*; set ``metadata.provenance = "<file name>:<line>"`` (even if metadata was discarded);
write with keys sorted, as dolma's serde_json does.

Inputs are grouped into shards in order until adding the next file would pass
``max_size_in_bytes`` of compressed input; each shard is one output file
``<path>/<name>-NNNN.jsonl.gz`` (dolma names its last shard ``.json.gz`` by accident; here every
shard ends in ``.jsonl.gz``). A unit is a *piece* of a shard: consecutive sources holding at
least PIECE_BYTES of input (the last piece less), so a shard is mixed by several workers; each
piece is written beside the shard (``.lmdata-tmp-parts/``) and the pieces are joined in order
into one file (one gzip member), the same bytes for any engine and number of workers. A source
is a whole input file, or a byte range of RANGE_BYTES of a plain JSONL file larger than that:
the job first counts each range's newlines (one fast unit per range) to number its lines for
provenance, and a range enters the attribute files it reads in step at its first row. A gzip
or zstd input is one source (a compressed stream cannot be entered in the middle without an
index of its members or frames, which dolma's files do not have). An existing output is kept
(resume), as in dolma. Like dolma, a missing attribute file is not merged (a warning says so)
and an attribute file shorter than its documents leaves the later documents without its
attributes; ids that do not line up fail the shard with both files and the line. Inputs and
outputs may be local paths or URLs (``s3://``, ``memory://``, ...); each shard is one object
that appears whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from lmdata import parallel
from lmdata.dolma.config import MixerConfig, StreamConfig
from lmdata.dolma.pieces import Join, join_all, part_key
from lmdata.dolma.rules import any_match, replace_spans, selector, shorter_than
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats.dolma._files import (
    REMOTE_CHUNK,
    chunks_between,
    iter_range_lines,
    iter_raw_lines,
    read_chunks,
    splittable,
)
from lmdata.formats.dolma._output import OutputFile, Part, suffix_for
from lmdata.formats.dolma._paths import Stores, attribute_path, expand_globs, is_file
from lmdata.formats.dolma._rows import merge_attribute_row, parse_line
from lmdata.storage import Store, is_url, join, resolve, scheme

log = logging.getLogger("lmdata.dolma.mix")

PIECE_BYTES = 16 << 20  # a shard's inputs are mixed in pieces of at least this many bytes
RANGE_BYTES = 64 << 20  # a plain JSONL input larger than this is mixed in ranges of this size


@dataclass(frozen=True)
class Source:
    """The documents of one input file: all of it, or (a plain file larger than RANGE_BYTES)
    the lines starting in bytes ``[start, end)``, the first of which is line ``first_line``
    (counted by the job before mixing: provenance names every document's line)."""

    path: str
    start: int = 0
    end: int = -1  # -1: the whole file
    first_line: int = 1

    @property
    def whole(self) -> bool:
        return self.end < 0


@dataclass(frozen=True)
class Shard:
    stream: StreamConfig
    sources: tuple[Source, ...]
    output: str
    cuts: tuple[int, ...] = (0,)  # index in ``sources`` where each piece starts

    @property
    def inputs(self) -> tuple[str, ...]:
        """The input files, in order (a file read in ranges once)."""
        return tuple(dict.fromkeys(src.path for src in self.sources))


@dataclass(frozen=True)
class MixTask:
    """Piece ``piece`` of ``shard`` (its sources ``cuts[piece]`` up to the next cut)."""

    shard: Shard
    piece: int = 0

    @property
    def sources(self) -> tuple[Source, ...]:
        cuts = (*self.shard.cuts, len(self.shard.sources))
        return self.shard.sources[cuts[self.piece] : cuts[self.piece + 1]]


@dataclass(frozen=True)
class LineCount:
    """Count the newlines in bytes ``[start, end)`` of a plain input (to number the lines of
    the ranges after it)."""

    path: str
    start: int
    end: int
    storage_options: dict[str, Any] | None = None


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

    def __add__(self, other: ShardStats) -> ShardStats:
        """The counts and warnings of both, in order (a shard's total over its pieces)."""
        return ShardStats(
            read=self.read + other.read,
            written=self.written + other.written,
            filtered=self.filtered + other.filtered,
            too_short=self.too_short + other.too_short,
            warnings=self.warnings + other.warnings,
        )


@dataclass(frozen=True)
class MixResult:
    shards: int
    skipped_shards: int
    read: int
    written: int
    filtered: int
    too_short: int
    seconds: float
    outputs: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def docs_per_second(self) -> float:
        return self.read / self.seconds if self.seconds > 0 else 0.0


def _under(base: str | os.PathLike[str] | None, path: str) -> str:
    """``path`` taken from ``base`` when it is a relative local path."""
    if base is None or is_url(path) or os.path.isabs(path):
        return path
    return str(Path(base) / path)


def _below_documents(f: str) -> str:
    """The part of a document path below its last ``documents`` folder (else its name)."""
    parts = f.split("://", 1)[-1].split("/")
    if "documents" in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index("documents")
        return "/".join(parts[i + 1 :])
    return parts[-1]


def plan_shards(stream: StreamConfig, base: str | os.PathLike[str] | None = None) -> list[Shard]:
    """dolma's sharding: start a new shard when the next input would pass the size limit."""
    opts = stream.storage_options
    inputs = expand_globs(stream.documents, base, opts)
    if not inputs:
        raise InvalidInputError(f"stream {stream.name!r}: no files match {list(stream.documents)}")
    out = _under(base, stream.output_path)
    comp = _output_compression(stream)
    stores = Stores(opts)
    if not stream.shuffle:  # one output per input, keeping the path below documents/
        shards = []
        for f in inputs:
            store, key = stores(f)
            srcs = _sources(f, store.size(key) if splittable(key) else 0, key)
            out_f = _join(out, "documents", _below_documents(f))
            shards.append(
                Shard(stream, tuple(s for s, _ in srcs), out_f, _cuts([n for _, n in srcs]))
            )
        return shards
    groups: list[list[tuple[Source, int]]] = []
    size = 0
    for f in inputs:
        store, key = stores(f)
        s = store.size(key)
        if groups and groups[-1] and size + s > stream.max_size_in_bytes:
            groups.append([])
            size = 0
        if not groups:
            groups.append([])
        groups[-1].extend(_sources(f, s, key))
        size += s
    return [
        Shard(
            stream,
            tuple(src for src, _ in g),
            _join(out, f"{stream.name}-{i:04d}{suffix_for(comp)}"),
            _cuts([n for _, n in g]),
        )
        for i, g in enumerate(groups)
    ]


def _sources(f: str, size: int, key: str) -> list[tuple[Source, int]]:
    """``f`` as one source, or a plain file larger than RANGE_BYTES as ranges of that size
    (line numbers still to count); each with its bytes."""
    if size <= RANGE_BYTES or not splittable(key):
        return [(Source(f), size)]
    n = -(-size // RANGE_BYTES)
    bounds = [min(size, k * RANGE_BYTES) for k in range(n + 1)]
    return [(Source(f, a, b), b - a) for a, b in itertools.pairwise(bounds)]


def _cuts(sizes: list[int]) -> tuple[int, ...]:
    """Where the pieces of a shard start: a piece ends once it holds PIECE_BYTES of input."""
    cuts = [0]
    held = 0
    for i, s in enumerate(sizes[:-1]):
        held += s
        if held >= PIECE_BYTES:
            cuts.append(i + 1)
            held = 0
    return tuple(cuts)


def _join(base: str, *parts: str) -> str:
    if is_url(base) and scheme(base) != "file":
        return join(base, *parts)
    return str(Path(base, *parts))


def _output_compression(stream: StreamConfig) -> str:
    c = stream.compression_output
    if c is None:
        return "gz"
    return {"gz": "gz", "gzip": "gz", "zst": "zst", "zstd": "zst", "": "none", "none": "none"}.get(
        c, "gz"
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


def _mix_shard(task: MixTask) -> ShardStats:
    shard = task.shard
    stream = shard.stream
    opts = stream.storage_options
    out_store, out = resolve(shard.output, opts)
    if out_store.exists(out):
        # mix() left out the shards that existed before the job, so an earlier attempt of
        # this task wrote it (a Ray retry after the commit): count what it holds, write nothing
        return _mix_inputs(task.sources, stream, lambda line: None)
    n = len(shard.cuts)
    piece = Part(task.piece == 0, task.piece == n - 1) if n > 1 else None
    key, overwrite = (out, False) if piece is None else (part_key(out, task.piece), True)
    comp = _output_compression(stream)
    with OutputFile(out_store, key, comp, overwrite=overwrite, part=piece) as f:
        stats = _mix_inputs(task.sources, stream, f.write)
    return dataclasses.replace(stats, checksum=f.checksum())


def _exists(shard: Shard) -> bool:
    store, key = resolve(shard.output, shard.stream.storage_options)
    return bool(store.exists(key))


def _lines(store: Store, key: str, src: Source) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the documents of ``src``."""
    if src.whole:
        return iter_raw_lines(store, key)
    lines = iter_range_lines(store, key, src.start, src.end)
    return ((src.first_line + k, raw) for k, (_, raw) in enumerate(lines))


def _count_lines(c: LineCount) -> int:
    """The newlines in bytes ``[c.start, c.end)`` of a plain file."""
    store, key = resolve(c.path, c.storage_options)
    return sum(
        chunk.count(b"\n") for _, chunk in chunks_between(store, key, c.start, c.end, REMOTE_CHUNK)
    )


def _opts(sh: Shard) -> dict[str, Any] | None:
    return sh.stream.storage_options


def _number_lines(
    shards: list[Shard], engine: str, workers: int, address: str | None
) -> list[Shard]:
    """``shards`` with the first line number of every range after a file's first: the ranges'
    newlines are counted on the executor's workers (one unit per range, a fast pass)."""
    counts: list[LineCount] = []
    for sh in shards:
        prev = 0  # start of the previous range of the file
        for src in sh.sources:
            if not src.whole and src.start > 0:  # its newlines up to the next range's first line
                counts.append(LineCount(src.path, max(prev - 1, 0), src.start - 1, _opts(sh)))
            prev = src.start
    if not counts:
        return shards
    got = iter(
        parallel.run_all(
            _count_lines,
            counts,
            engine=engine,
            workers=workers,
            address=address,
            desc="mix: count lines",
            progress=False,
        )
    )
    out = []
    for sh in shards:
        srcs = []
        before = 0  # newlines before the current range's start - 1
        for src in sh.sources:
            if not src.whole and src.start > 0:
                before += next(got)
                src = dataclasses.replace(src, first_line=before + 2)
            elif not src.whole:
                before = 0
            srcs.append(src)
        out.append(dataclasses.replace(sh, sources=tuple(srcs)))
    return out


def _mix_inputs(
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
    read = written = filtered = too_short = 0
    warnings: list[str] = []
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
            if (include and not any_match(include, doc, where, lineno)) or (
                exclude and any_match(exclude, doc, where, lineno)
            ):
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
    return ShardStats(read, written, filtered, too_short, warnings=tuple(warnings))


def _per_shard(
    tasks: list[MixTask], stats: list[ShardStats]
) -> tuple[list[ShardStats], list[Join]]:
    """One ShardStats per shard (its pieces' summed, in order), and the joins of every shard
    mixed in several pieces (unless a retry found it written: then it was joined already)."""
    out, joins = [], []
    i = 0
    while i < len(tasks):
        shard = tasks[i].shard
        group = stats[i : i + len(shard.cuts)]
        i += len(shard.cuts)
        if len(group) > 1 and not _exists(shard):
            comp = _output_compression(shard.stream)
            sums = tuple(st.checksum for st in group)
            opts = shard.stream.storage_options
            joins.append(Join(shard.output, comp, sums, opts, overwrite=False))
        out.append(sum(group, ShardStats()))
    return out, joins


def mix(
    cfg: MixerConfig,
    base: str | os.PathLike[str] | None = None,
    progress: bool = False,
    engine: str = "processes",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> MixResult:
    """Run every stream of ``cfg`` on ``cfg.processes`` workers of ``engine`` ("inprocess",
    "processes", "ray" at ``address``); relative paths are taken from ``base`` (default: cwd).
    ``storage_options`` (fsspec options for URLs) replace the config's."""
    if storage_options is not None:
        opts = dict(storage_options)
        cfg = dataclasses.replace(
            cfg,
            streams=tuple(dataclasses.replace(s, storage_options=opts) for s in cfg.streams),
        )
    for s in cfg.streams:  # compile every expression up front: config errors before any work
        for e in (*s.include, *s.exclude):
            selector(e, s.syntax)
        for r in s.span_replacement:
            selector(r.span, r.syntax)
    shards = [sh for s in cfg.streams for sh in plan_shards(s, base)]
    t0 = time.perf_counter()
    todo = [sh for sh in shards if not _exists(sh)]  # existing shards are kept (resume)
    todo = _number_lines(todo, engine, cfg.processes, address)
    tasks = [MixTask(sh, k) for sh in todo for k in range(len(sh.cuts))]
    done = parallel.run_all(
        _mix_shard,
        tasks,
        engine=engine,
        workers=cfg.processes,
        address=address,
        desc="mix",
        progress=progress,
    )
    stats, joins = _per_shard(tasks, done)
    join_all(joins, engine, cfg.processes, address)
    stats += [ShardStats(skipped=True) for _ in range(len(shards) - len(todo))]
    warnings = tuple(w for st in stats for w in st.warnings)
    for w in warnings:
        log.warning(w)
    return MixResult(
        shards=len(shards),
        skipped_shards=sum(st.skipped for st in stats),
        read=sum(st.read for st in stats),
        written=sum(st.written for st in stats),
        filtered=sum(st.filtered for st in stats),
        too_short=sum(st.too_short for st in stats),
        seconds=time.perf_counter() - t0,
        outputs=tuple(sh.output for sh in shards),
        warnings=warnings,
    )
