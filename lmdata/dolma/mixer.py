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
shard ends in ``.jsonl.gz``). A unit is a *piece* of a shard: consecutive whole files holding at
least PIECE_BYTES of input (the last piece less), or one range of a file, so a shard is mixed
by several workers; each piece is written beside the shard (:mod:`lmdata.dolma.pieces`: a
folder named after the shard's job) and the pieces are joined in order into one file (one gzip
member), the same bytes for any engine and number of workers; a job run again redoes only the
pieces not complete. A source is a whole input file, or a byte range of a plain JSONL file
larger than 64 MiB (ranges of :func:`lmdata.dolma._ranges.range_size` of the stream's plain
bytes, so a stream of one such file still makes enough units for its workers, the same for any
number of workers; a file up to 64 MiB is one source, its output the bytes it always was): the
job first counts each range's newlines (one fast unit per range) to number its lines for
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
import functools
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmdata import parallel
from lmdata._progress import OnProgress, accepted
from lmdata.dolma import _manifests, _ranges
from lmdata.dolma._ranges import cut, range_size
from lmdata.dolma._unmatched import unmatched
from lmdata.dolma.config import MixerConfig, StreamConfig
from lmdata.dolma.mixing import ShardStats, Source, mix_documents
from lmdata.dolma.pieces import (
    Fresh,
    Join,
    done_many,
    job_id,
    join_all,
    mark_done,
    part_key,
    parts_folder,
    version,
)
from lmdata.dolma.rules import selector
from lmdata.errors import InvalidInputError
from lmdata.formats.dolma._files import (
    REMOTE_CHUNK,
    chunks_between,
    splittable,
)
from lmdata.formats.dolma._output import OutputFile, Part, suffix_for
from lmdata.formats.dolma._paths import Stores, expand_globs
from lmdata.parallel import Executor
from lmdata.storage import is_url, join, resolve, scheme

log = logging.getLogger("lmdata.dolma.mix")

PIECE_BYTES = 16 << 20  # a shard's inputs are mixed in pieces of at least this many bytes


@dataclass(frozen=True)
class Shard:
    stream: StreamConfig
    sources: tuple[Source, ...]
    output: str
    cuts: tuple[int, ...] = (0,)  # index in ``sources`` where each piece starts
    job: str = ""  # in pieces: names their folder (pieces.job_id)

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
    keys = [stores(f) for f in inputs]
    # every size for shards, the plain ones' alone for one output per input
    sizes = [st.size(k) if stream.shuffle or splittable(k) else 0 for st, k in keys]
    step = range_size(sum(z for (_, k), z in zip(keys, sizes, strict=True) if splittable(k)))
    if not stream.shuffle:  # one output per input, keeping the path below documents/
        return [
            _shard(stream, _sources(f, z, k, step), _join(out, "documents", _below_documents(f)))
            for f, (_, k), z in zip(inputs, keys, sizes, strict=True)
        ]
    groups: list[list[tuple[Source, int]]] = []
    size = 0
    for f, (_, key), s in zip(inputs, keys, sizes, strict=True):
        if groups and groups[-1] and size + s > stream.max_size_in_bytes:
            groups.append([])
            size = 0
        if not groups:
            groups.append([])
        groups[-1].extend(_sources(f, s, key, step))
        size += s
    return [
        _shard(stream, g, _join(out, f"{stream.name}-{i:04d}{suffix_for(comp)}"))
        for i, g in enumerate(groups)
    ]


def _shard(stream: StreamConfig, sources: list[tuple[Source, int]], output: str) -> Shard:
    """The shard of ``sources`` (each with its bytes), in pieces as :func:`_cuts` says; one in
    several pieces is named by a digest of all its pieces depend on (storage options aside)."""
    cuts = _cuts(sources)
    srcs = tuple(s for s, _ in sources)
    if len(cuts) == 1:
        return Shard(stream, srcs, output)
    versions = [version(*resolve(s.path, stream.storage_options)) for s in srcs]
    job = job_id("mix", repr(stream), repr(srcs), [n for _, n in sources], versions, cuts, output)
    return Shard(stream, srcs, output, cuts, job)


def _sources(f: str, size: int, key: str, step: int) -> list[tuple[Source, int]]:
    """``f`` as one source, or a plain file larger than ``_ranges.RANGE_BYTES`` as ranges of at
    most ``step`` bytes (line numbers still to count); each with its bytes. A file up to that
    stays one source (its shard's bytes as they were before ranges shrank with the job)."""
    if size <= _ranges.RANGE_BYTES or not splittable(key):
        return [(Source(f), size)]
    return [(Source(f, a, b), b - a) for a, b in cut(size, step)]


def _cuts(sources: list[tuple[Source, int]]) -> tuple[int, ...]:
    """Where the pieces of a shard start: a piece ends once it holds PIECE_BYTES of input, and
    a range of a file is a piece of its own (ranges are sized so that the job has enough)."""
    cuts = [0]
    held = 0
    for i, ((src, s), (nxt, _)) in enumerate(itertools.pairwise(sources)):
        held += s
        if held >= PIECE_BYTES or not src.whole or not nxt.whole:
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


def _mix_shard(task: MixTask) -> ShardStats:
    shard = task.shard
    stream = shard.stream
    opts = stream.storage_options
    out_store, out = resolve(shard.output, opts)
    if out_store.exists(out):
        # mix() left out the shards that existed before the job, so an earlier attempt of
        # this task wrote it (a Ray retry after the commit): count what it holds, write nothing
        return mix_documents(task.sources, stream, lambda line: None)
    n = len(shard.cuts)
    piece = Part(task.piece == 0, task.piece == n - 1) if n > 1 else None
    key, overwrite = (out, False) if piece is None else (part_key(out, task.piece, shard.job), True)
    comp = _output_compression(stream)
    with OutputFile(out_store, key, comp, overwrite=overwrite, part=piece) as f:
        stats = mix_documents(task.sources, stream, f.write)
    stats = dataclasses.replace(stats, checksum=f.checksum())
    if piece is not None:  # the piece is complete: a resumed job takes it as it is
        mark_done(out_store, out, task.piece, shard.job, dataclasses.asdict(stats))
    return stats


def _done(shards: list[Shard]) -> list[dict[int, ShardStats]]:
    """Per shard, the pieces an earlier run of its job completed, with their results (each
    stream's output folder listed once; a piece folder read only where there is one)."""
    out = []
    for _, group in itertools.groupby(shards, key=lambda sh: sh.stream.name):
        shs = list(group)
        store, _ = resolve(shs[0].output, _opts(shs[0]))
        keys = [resolve(sh.output, _opts(sh))[1] for sh in shs]
        found = done_many(store, [(k, sh.job) for k, sh in zip(keys, shs, strict=True) if sh.job])
        records = iter(found)
        for sh in shs:
            got = {}
            for k, rec in (next(records) if sh.job else {}).items():
                try:
                    st = ShardStats(**rec)
                    st = dataclasses.replace(
                        st,
                        warnings=tuple(map(str, st.warnings)),
                        checksum=tuple(st.checksum),
                        attributes=tuple(map(str, st.attributes)),
                    )
                except TypeError:
                    continue  # not a marker this version wrote: the piece is redone
                got[k] = st
            out.append(got)
    return out


def _exists(shard: Shard) -> bool:
    store, key = resolve(shard.output, shard.stream.storage_options)
    return bool(store.exists(key))


def _count_lines(c: LineCount) -> int:
    """The newlines in bytes ``[c.start, c.end)`` of a plain file."""
    store, key = resolve(c.path, c.storage_options)
    return sum(
        chunk.count(b"\n") for _, chunk in chunks_between(store, key, c.start, c.end, REMOTE_CHUNK)
    )


def _opts(sh: Shard) -> dict[str, Any] | None:
    return sh.stream.storage_options


def _number_lines(shards: list[Shard], run_all: Callable[..., list[Any]]) -> list[Shard]:
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
    got = iter(run_all(_count_lines, counts, what="mix: count lines"))
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


def _per_shard(
    shards: list[Shard], prior: list[dict[int, ShardStats]], ran: list[ShardStats]
) -> tuple[list[ShardStats], list[Join]]:
    """One ShardStats per shard (its pieces' summed, in order: those this job ran, in the order
    of ``ran``, and those of ``prior``, an earlier run's), and the joins of every shard mixed
    in several pieces (unless a retry found it written: then it was joined already)."""
    out, joins = [], []
    got = iter(ran)
    for shard, done in zip(shards, prior, strict=True):
        n = len(shard.cuts)
        group = [done[k] if k in done else next(got) for k in range(n)]
        if n > 1 and not _exists(shard):
            comp = _output_compression(shard.stream)
            sums = tuple(st.checksum for st in group)
            opts = shard.stream.storage_options
            joins.append(Join(shard.output, comp, sums, opts, overwrite=False, job=shard.job))
        out.append(sum(group, ShardStats()))
    return out, joins


def _idle_rules(cfg: MixerConfig, shards: list[Shard], stats: list[ShardStats]) -> list[str]:
    """The warnings of :func:`lmdata.dolma._unmatched.unmatched` for every stream, from the
    totals of its shards mixed in this run (``stats``, one per shard of ``shards``)."""
    totals: dict[int, ShardStats] = {}
    for sh, st in zip(shards, stats, strict=True):
        totals[id(sh.stream)] = totals.get(id(sh.stream), ShardStats()) + st
    return [w for s in cfg.streams if id(s) in totals for w in unmatched(s, totals[id(s)])]


def mix(
    cfg: MixerConfig,
    base: str | os.PathLike[str] | None = None,
    progress: OnProgress | None = None,
    engine: str = "processes",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
    strict: bool = False,
    executor: Executor | None = None,
) -> MixResult:
    """Run every stream of ``cfg`` on ``cfg.processes`` workers of ``engine`` ("inprocess",
    "processes", "ray" at ``address``), or on ``executor`` (an
    ``lmdata.parallel.Executor`` of the caller's, with its own workers); relative paths
    are taken from ``base`` (default: cwd). ``progress`` receives ``lmdata.Progress``
    events of the phase "mix", in documents read.
    ``storage_options`` (fsspec options for URLs) replace the config's. A rule that could
    not have done anything (a filter on an attribute no document has, include filters that
    matched nothing) is a warning, or with ``strict`` an InvalidInputError once the job ran."""
    progress = accepted(progress)
    parallel.check_choice(executor, engine, None, address)
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
    prior = _done(todo)  # pieces an earlier run completed are kept too
    left = [(sh, d) for sh, d in zip(todo, prior, strict=True) if len(d) < len(sh.cuts)]
    run_all = functools.partial(
        parallel.run_all,
        engine=engine,
        workers=cfg.processes,
        address=address,
        executor=executor,
    )
    numbered = _number_lines([sh for sh, _ in left], run_all)
    tasks = [
        MixTask(sh, k)
        for sh, (_, d) in zip(numbered, left, strict=True)
        for k in range(len(sh.cuts))
        if k not in d
    ]
    fresh = Fresh((parts_folder(sh.output, sh.job), _opts(sh)) for sh in todo if sh.job)
    ran = run_all(_mix_shard, tasks, what="mix", progress=progress, tick=fresh)
    stats, joins = _per_shard(todo, prior, ran)
    join_all(joins, run_all)
    for stream in {id(sh.stream): sh.stream for sh in shards}.values():
        outs = [sh.output for sh in shards if sh.stream is stream]
        _manifests.record(
            ((_manifests.tree_of_documents(o), o) for o in outs), stream.storage_options
        )
    idle = _idle_rules(cfg, todo, stats)
    stats += [ShardStats(skipped=True) for _ in range(len(shards) - len(todo))]
    warnings = tuple(w for st in stats for w in st.warnings) + tuple(idle)
    for w in warnings:
        log.warning(w)
    if strict and idle:
        raise InvalidInputError(
            "; ".join(idle) + " (--strict makes this an error; the shards are written)"
        )
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
