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
shard ends in ``.jsonl.gz``). A unit is a *piece* of a shard: consecutive whole input files
holding at least PIECE_BYTES of input (the last piece less), so a shard of many files is mixed
by several workers; each piece is written beside the shard (``.lmdata-tmp-parts/``) and the pieces
are joined in order into one file (one gzip member), the same bytes for any engine and number
of workers. An input file is never split (provenance needs each document's line number, and
attribute files are read in step from their start). An existing output is kept (resume), as
in dolma. Like dolma, a missing attribute file is not merged (a warning says so) and an
attribute file shorter than its documents leaves the later documents without its attributes;
ids that do not line up fail the shard with both files and the line. Inputs and outputs may be
local paths or URLs (``s3://``, ``memory://``, ...); each shard is one object that appears whole.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from lmdata import parallel
from lmdata.dolma.config import MixerConfig, SpanReplacement, StreamConfig
from lmdata.dolma.jsonpath import JqExpr, JsonPath, compile_selector
from lmdata.dolma.pieces import Join, join_all, part_key
from lmdata.errors import CorruptDataError, InvalidInputError, LmdataError
from lmdata.formats.dolma._files import iter_raw_lines
from lmdata.formats.dolma._output import OutputFile, Part, suffix_for
from lmdata.formats.dolma._paths import Stores, attribute_path, expand_globs, is_file
from lmdata.formats.dolma._rows import merge_attribute_row, parse_line
from lmdata.storage import Store, is_url, join, resolve, scheme

log = logging.getLogger("lmdata.dolma.mix")

# Rust's str::trim removes Unicode White_Space, a slightly different set from str.strip()'s.
RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


PIECE_BYTES = 16 << 20  # a shard's inputs are mixed in pieces of at least this many bytes


@dataclass(frozen=True)
class Shard:
    stream: StreamConfig
    inputs: tuple[str, ...]
    output: str
    cuts: tuple[int, ...] = (0,)  # index in ``inputs`` where each piece starts


@dataclass(frozen=True)
class MixTask:
    """Piece ``piece`` of ``shard`` (its inputs ``cuts[piece]`` up to the next cut)."""

    shard: Shard
    piece: int = 0

    @property
    def inputs(self) -> tuple[str, ...]:
        cuts = (*self.shard.cuts, len(self.shard.inputs))
        return self.shard.inputs[cuts[self.piece] : cuts[self.piece + 1]]


@dataclass
class ShardStats:
    read: int = 0
    written: int = 0
    filtered: int = 0
    too_short: int = 0
    skipped: bool = False
    warnings: list[str] = field(default_factory=list)
    checksum: tuple[int, int] = (0, 0)  # of a piece written for joining (gzip: CRC-32, size)


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
    if not stream.shuffle:  # one output per input, keeping the path below documents/
        return [Shard(stream, (f,), _join(out, "documents", _below_documents(f))) for f in inputs]
    groups: list[list[tuple[str, int]]] = []
    size = 0
    stores = Stores(opts)
    for f in inputs:
        store, key = stores(f)
        s = store.size(key)
        if groups and groups[-1] and size + s > stream.max_size_in_bytes:
            groups.append([])
            size = 0
        if not groups:
            groups.append([])
        groups[-1].append((f, s))
        size += s
    return [
        Shard(
            stream,
            tuple(f for f, _ in g),
            _join(out, f"{stream.name}-{i:04d}{suffix_for(comp)}"),
            _cuts([s for _, s in g]),
        )
        for i, g in enumerate(groups)
    ]


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


@functools.lru_cache(maxsize=256)
def _selector(expr: str, syntax: str) -> JsonPath | JqExpr:
    return compile_selector(expr, syntax)


def _matches(expr: str, syntax: str, doc: dict[str, Any], where: tuple[str, int]) -> bool:
    try:
        return _selector(expr, syntax).matches(doc)
    except LmdataError:
        raise
    except Exception as e:  # a jq runtime error fails the shard in dolma too
        raise CorruptDataError(
            f"filter {expr!r} failed on this document: {e}",
            path=where[0],
            position=f"line {where[1]}",
        ) from None


def keep(stream: StreamConfig, doc: dict[str, Any], where: tuple[str, int]) -> bool:
    """dolma's rule: (no include, or any include matches) and no exclude matches."""
    if stream.include and not any(_matches(e, stream.syntax, doc, where) for e in stream.include):
        return False
    return not any(_matches(e, stream.syntax, doc, where) for e in stream.exclude)


def _render(template: str, original: str, doc: dict[str, Any]) -> str:
    if template.startswith("\\$"):
        template = template[1:]
    elif template.startswith("$"):  # a jq selector on the document (dolma PR #200)
        v = _selector(template[1:] or ".", "jq").first(doc)
        return v if isinstance(v, str) else orjson.dumps(v).decode()
    return template.replace("{}", original)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def replace_spans(text: str, doc: dict[str, Any], rules: tuple[SpanReplacement, ...]) -> str:
    """Apply every rule's spans at once: sorted by start, a span starting inside an earlier
    replaced one is skipped; ``min_score <= score < max_score`` selects spans."""
    todo: list[tuple[int, int, SpanReplacement]] = []
    for rule in rules:
        spans = _selector(rule.span, rule.syntax).first(doc)
        if not isinstance(spans, list):
            continue
        for sp in spans:
            if not (
                isinstance(sp, list)
                and len(sp) >= 3
                and _num(sp[2])
                and isinstance(sp[0], int)
                and isinstance(sp[1], int)
            ):
                continue
            score = float(sp[2])
            if rule.min_score is not None and score < rule.min_score:
                continue
            if rule.max_score is not None and score >= rule.max_score:
                continue
            todo.append((sp[0], sp[1], rule))
    if not todo:
        return text
    todo.sort(key=lambda t: t[0])
    out = []
    pos = 0
    for s, e, rule in todo:
        if s < pos or s > len(text):
            continue
        e = min(max(e, s), len(text))  # dolma's deduper can end a span one past the text
        out.append(text[pos:s])
        out.append(_render(rule.replacement, text[s:e], doc))
        pos = e
    out.append(text[pos:])
    return "".join(out)


class _AttributeStreams:
    """The attribute files of one document file, read in step with it (dolma's checks)."""

    def __init__(self, store: Store, doc_key: str, names: tuple[str, ...], stats: ShardStats):
        self.doc_file = store.url(doc_key)
        self.streams = []
        self.stats = stats
        for n in names:
            ak = attribute_path(doc_key, n)
            ap = store.url(ak)
            if is_file(store, ak):
                self.streams.append([ap, iter_raw_lines(store, ak), True])
            else:
                stats.warnings.append(
                    f"{ap}: missing, so attribute set {n!r} is not merged "
                    f"for {self.doc_file} (filters see its keys as absent)"
                )

    def merge(self, doc: dict[str, Any], lineno: int) -> None:
        for st in self.streams:
            ap, it, alive = st
            if not alive:
                continue
            nxt = next(it, None)
            if nxt is None:
                st[2] = False
                self.stats.warnings.append(
                    f"{ap}: missing attributes from line {lineno} on (the file is shorter than "
                    f"{self.doc_file}); later documents get none from it"
                )
                continue
            merge_attribute_row(doc, parse_line(nxt[1], ap, lineno), self.doc_file, ap, lineno)


def mix_document(
    stream: StreamConfig, doc: dict[str, Any], where: tuple[str, int], stats: ShardStats
) -> bytes | None:
    """The output line for one document (attributes already merged), or None if dropped."""
    if not keep(stream, doc, where):
        stats.filtered += 1
        return None
    text = doc.get("text")
    if not isinstance(text, str):
        raise CorruptDataError(
            "document has no string 'text'", path=where[0], position=f"line {where[1]}"
        )
    if stream.span_replacement:
        doc["text"] = text = replace_spans(text, doc, stream.span_replacement)
    for f in stream.discard_fields:
        doc.pop(f, None)
    if len(text.strip(RUST_WHITESPACE).encode("utf-8", "surrogatepass")) < stream.min_text_length:
        stats.too_short += 1
        return None
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        meta = doc["metadata"] = {}
    meta["provenance"] = f"{where[0].rsplit('/', 1)[-1]}:{where[1]}"
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n"


def _mix_shard(task: MixTask) -> ShardStats:
    shard = task.shard
    stats = ShardStats()
    stream = shard.stream
    opts = stream.storage_options
    out_store, out = resolve(shard.output, opts)
    if out_store.exists(out):
        # mix() left out the shards that existed before the job, so an earlier attempt of
        # this task wrote it (a Ray retry after the commit): count what it holds, write nothing
        _mix_inputs(task.inputs, stream, stats, lambda line: None)
        return stats
    n = len(shard.cuts)
    piece = Part(task.piece == 0, task.piece == n - 1) if n > 1 else None
    key, overwrite = (out, False) if piece is None else (part_key(out, task.piece), True)
    comp = _output_compression(stream)
    with OutputFile(out_store, key, comp, overwrite=overwrite, part=piece) as f:
        _mix_inputs(task.inputs, stream, stats, f.write)
    stats.checksum = f.checksum()
    return stats


def _exists(shard: Shard) -> bool:
    store, key = resolve(shard.output, shard.stream.storage_options)
    return bool(store.exists(key))


def _mix_inputs(
    inputs: tuple[str, ...], stream: StreamConfig, stats: ShardStats, write: Callable[[bytes], Any]
) -> None:
    """Mix the documents of ``inputs``, giving the lines kept to ``write``."""
    stores = Stores(stream.storage_options)
    for inp in inputs:
        store, key = stores(inp)
        where = store.url(key)
        attrs = _AttributeStreams(store, key, stream.attributes, stats)
        for lineno, raw in iter_raw_lines(store, key):
            doc = parse_line(raw, where, lineno)
            attrs.merge(doc, lineno)
            stats.read += 1
            line = mix_document(stream, doc, (where, lineno), stats)
            if line is not None:
                write(line)
                stats.written += 1
            if stats.read % parallel.REPORT_EVERY == 0:
                parallel.report(parallel.REPORT_EVERY)
    parallel.report(stats.read % parallel.REPORT_EVERY)


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
        total = ShardStats()
        for st in group:
            total.read += st.read
            total.written += st.written
            total.filtered += st.filtered
            total.too_short += st.too_short
            total.warnings.extend(st.warnings)
        if len(group) > 1 and not _exists(shard):
            comp = _output_compression(shard.stream)
            sums = tuple(st.checksum for st in group)
            opts = shard.stream.storage_options
            joins.append(Join(shard.output, comp, sums, opts, overwrite=False))
        out.append(total)
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
            _selector(e, s.syntax)
        for r in s.span_replacement:
            _selector(r.span, r.syntax)
    shards = [sh for s in cfg.streams for sh in plan_shards(s, base)]
    t0 = time.perf_counter()
    todo = [sh for sh in shards if not _exists(sh)]  # existing shards are kept (resume)
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
