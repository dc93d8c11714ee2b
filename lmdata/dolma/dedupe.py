"""``dedupe``: flag exact duplicate documents (by a key) or paragraphs, in dolma's deduper form.

dolma inserts keys into one shared Bloom filter from many threads, so which copy survives
depends on timing. Here the first occurrence in input order (files sorted, then line, then
paragraph) is kept, whatever the number of processes, and re-running gives the same result.

The input is cut into spans (:mod:`lmdata.dolma._spans`): a document file whole, or, for a
plain JSONL file larger than the job's range size, the lines starting in each of its byte
ranges of equal size. The range size is tag's and mix's (:func:`lmdata.dolma._ranges.range_size`:
the job's plain bytes over 16, within 4 to 64 MiB), from the inputs alone, never the number of
workers, so one 50 GB file is ~800 units, a small job still makes about 16, and a retry redoes
one range. A gzip or zstd file is one span (it cannot be entered in the middle). Spans are
numbered in input order, and a key's place is (span, line in the span, paragraph, n-gram),
which sorts in input order. Three phases run on the executor:

1. per group of consecutive spans (in parallel: :data:`GROUPS` groups, or one per 64 MiB of
   input when more): hash each key (xxh3-128) and spill ``(hash, span, line, paragraph, n-gram)``
   entries, sorted by hash bucket, into one object per spill (a table of each bucket's
   entries goes back to the driver);
2. per bucket (in parallel): read its range of every spill object, sort and mark every entry
   but the first of each hash into one object per bucket, sorted by span;
3. per group of spans (in parallel, :mod:`lmdata.dolma._dedupe_write`): read the group's range
   of every bucket's marks and write the attribute files; a range writes a piece of its
   file's (``.lmdata-tmp-parts/``), and the pieces are joined in order
   (:mod:`lmdata.dolma.pieces`, as tag's), so the bytes are the same for any range size,
   engine and worker count.

On an object store that is one PUT per spill and per bucket and one ranged GET per (spill,
bucket) and (group, bucket): O(groups x buckets + files) requests, not files x buckets; a
unit sends its GETs several at once (``cat_ranges``, concurrent on async stores as s3fs).

Memory is bounded, not by the number of documents: the bucket count grows with the input's
expected keys (a per-mode estimate of keys per compressed byte) and a bucket the spill tables
count above :data:`BUCKET_ENTRIES` (4M) entries is marked in several passes, so a mark unit
holds at most ~64 B per entry (the 32 B records, the sort order and the two hash columns
sorted), ~256 MiB; a hash unit buffers :data:`SPILL_EVERY` (2M) entries as columns, 64 MiB
(~300 MiB while it sorts and writes them); a write unit holds :data:`WRITE_MARKS` marks.

Output rows are ``{"attributes": {...}, "id": ...}`` (keys sorted, as dolma's serde_json writes
them): documents mode gives ``{name: [[0, len(key in bytes), 1]]}`` for a duplicate, nothing
for a first copy and ``[]`` for a skipped document; paragraphs mode gives ``{name: [[start,
end, 1], ...]}`` with the duplicate paragraphs (character offsets, the separator included) or
``[]``, and ``{}`` for an empty text.

With ``paragraphs.by_ngram`` each paragraph's n-grams are the keys instead (see
:mod:`lmdata.dolma.ngrams`), spilled with their place in the paragraph, so the first occurrence
of an n-gram in input order is the one not counted as duplicate; a flagged paragraph's span
carries its duplicate fraction as dolma writes it. dolma's Bloom filter sizes are accepted and
not used (a log line says so): the result is dolma's without false positives. Its
``bloom_filter.file`` is an exact key file here (:mod:`lmdata.dolma._keyfile`): its keys come
before the input's in each mark unit (with ``read_only`` only they mark), and the buckets'
distinct keys make the new file. With ``num_partitions`` a hash unit spills only the keys of
its partition (:class:`lmdata.dolma._buckets.Rows`); ``file_partition`` also takes only the
files of its partition (:meth:`DedupeConfig.document_files`); a partition with no files still
writes its key file, empty (or leaves the existing one, which holds all it would), as dolma
1.2.1 writes its filter (checked by running it).

Documents and attribute files may live in any store (local paths, ``s3://``, ...). The bucket
spill files go to ``work_dir`` (a local folder or a URL), else to a local temporary folder when
the attribute files are local, else beside them on their store
(``<dataset>/.lmdata-tmp-dedupe-*``, removed at the end; ``lmdata clean`` finds what a killed
job left): workers on several machines then share the buckets with no shared disk.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdata import parallel
from lmdata._progress import OnProgress, accepted
from lmdata.dolma import _keyfile, _manifests, _ranges, _spans, ngrams
from lmdata.dolma._buckets import (
    MarkResult,
    MarkTask,
    Piece,
    Rows,
    Spill,
)
from lmdata.dolma._buckets import phase_mark as _phase_mark
from lmdata.dolma._dedupe_resume import (
    Done,
    JoinTask,
    Plan,
    Resumable,
    forget_joined,
    run_join_marked,
)
from lmdata.dolma._dedupe_write import WriteResult, WriteTask
from lmdata.dolma._dedupe_write import phase_write as _phase_write
from lmdata.dolma._ranges import SPREAD_UNITS, range_size
from lmdata.dolma._spans import Span, split_paragraphs
from lmdata.dolma._spans import read as _read
from lmdata.dolma._spans import skip as _skip
from lmdata.dolma.config import DedupeConfig
from lmdata.dolma.pieces import Fresh, Join, parts_folder
from lmdata.errors import InvalidInputError
from lmdata.formats.dolma._files import splittable
from lmdata.formats.dolma._paths import Stores, codec_of
from lmdata.parallel import Executor
from lmdata.storage import Store

log = logging.getLogger("lmdata.dolma.dedupe")
PRIOR_PARTS = "prior-parts"  # the mark parts of each bucket of a job with a key file
SPILL_EVERY = 1 << 21  # entries a hash unit buffers (32 B each) before writing one spill object
WRITE_MARKS = 1 << 24  # marks a write unit holds at most (256 MiB), unless one file has more
BUCKET_ENTRIES = 1 << 22  # entries a mark unit sorts at most (~60 B each at its peak)
GROUPS = SPREAD_UNITS  # hash (and write) groups of a job at least, when it has as many spans
MAX_BUCKETS = 1 << 16  # hash buckets at most (each spill's table has one int64 per bucket)
# keys per byte of compressed input (measured on dolma-style text): sizes the hash buckets; a
# bucket that still holds more than BUCKET_ENTRIES is marked in several passes
DENSITY = {"documents": 0.01, "paragraphs": 0.05, "by_ngram": 1.0}


@dataclass(frozen=True)
class DedupeResult:
    files: int
    documents: int
    keys: int
    duplicates: int
    seconds: float

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class HashTask:
    """Phase 1: hash the keys of consecutive spans (``(number, span)``, in order) into
    ``nbuckets`` buckets; ``t`` names this group's spill objects."""

    t: int
    spans: tuple[tuple[int, Span], ...]
    cfg: DedupeConfig
    work: Spill
    nbuckets: int
    mark: bool = False  # a resumable job: leave a marker holding the result (Spill.mark)


@dataclass(frozen=True)
class HashResult:
    documents: int
    keys: int
    # per spill object (``h/<t>-<i>`` for the i-th): where each bucket's entries start
    spills: tuple[np.ndarray, ...] = ()
    t: int = 0


def _phase_hash(task: HashTask) -> HashResult:
    """Hash every key of a group of spans into spill objects sorted by bucket."""
    cfg, work, nbuckets = task.cfg, task.work, task.nbuckets
    rows = Rows(cfg.key_partitions, cfg.partition_index)
    spills: list[np.ndarray] = []
    keys = 0
    docs = 0

    def spill() -> None:
        if not rows:
            return
        arr = rows.entries()
        bucket = (arr["hi"] % np.uint64(nbuckets)).astype(np.int64)
        order = np.argsort(bucket, kind="stable")
        starts = np.zeros(nbuckets + 1, dtype=np.int64)
        np.cumsum(np.bincount(bucket, minlength=nbuckets), out=starts[1:])
        name = f"{task.t}-{len(spills)}"
        work.save("h", name, arr[order])
        spills.append(starts)
        rows.clear()  # in place: _hash_span adds to these columns

    stores = Stores(cfg.storage_options)  # one filesystem client for the unit's files
    for k, span in task.spans:
        d, n = _hash_span(k, span, stores(span.path), cfg, rows, spill)
        docs, keys = docs + d, keys + n
    keys += len(rows)
    spill()
    if task.mark:
        meta = {"documents": docs, "keys": keys, "spills": len(spills)}
        work.mark(f"h-{task.t}", meta, np.concatenate(spills) if spills else None)
    return HashResult(docs, keys, tuple(spills), task.t)


def _hash_span(
    k: int, span: Span, where: tuple[Store, str], cfg: DedupeConfig, rows: Rows, spill: Any
) -> tuple[int, int]:
    """Add the entries of span number ``k`` to ``rows``, spilling them when many:
    (documents, keys spilled)."""
    store, key_ = where
    ng = cfg.ngrams
    keys = 0
    docs = 0
    add = rows.add
    for i, _doc, value in _read(store, key_, span, cfg):
        docs += 1
        if cfg.mode == "documents":
            if not _skip(value, cfg, chars=False):
                add(value, k, i, 0, 0)
        else:
            # an empty text is left out whole, as dolma does (its "" is never a key)
            paragraphs = split_paragraphs(value, cfg.paragraph_separator) if value else []
            for p_i, (_s, _e, p) in enumerate(paragraphs):
                if _skip(p, cfg, chars=True):
                    continue
                if not ng.length:
                    add(p, k, i, p_i, 0)
                    continue
                ks, fallback = ngrams.keys(p, ng)
                for j, key in enumerate(ks):
                    # dolma checks a short paragraph's whole text in every key partition
                    add(key, k, i, p_i, j, fallback and j == len(ks) - 1)
        if len(rows) >= SPILL_EVERY:
            keys += len(rows)
            spill()
        if docs % parallel.REPORT_EVERY == 0:
            parallel.report(parallel.REPORT_EVERY)
    parallel.report(docs % parallel.REPORT_EVERY)
    return docs, keys


def dedupe(
    cfg: DedupeConfig,
    progress: OnProgress | None = None,
    engine: str = "processes",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
    range_bytes: int | None = None,
    resume: bool = False,
    executor: Executor | None = None,
) -> DedupeResult:
    """Write ``attributes/<cfg.name>/`` for every document file of ``cfg``, on
    ``cfg.processes`` workers of ``engine``, or on ``executor`` (an
    ``lmdata.parallel.Executor`` of the caller's, with its own workers); the output is
    the same for any engine and count. ``progress`` receives ``lmdata.Progress`` events
    of the phase "dedupe: hash" ("minhash: sign"), in documents read.
    The work folder (``cfg.work_dir``, a path or URL) must be visible to every worker (shared
    on a cluster, or on the object store).
    ``storage_options`` (fsspec options for URLs) replace the config's; a plain file larger
    than ``range_bytes`` is read in ranges of at most that size (default: tag's and mix's,
    ``lmdata.dolma._ranges.range_size`` of the job's plain bytes).
    Every run keeps its work in a folder named by the job and marks each unit done, so a run
    stopped part way (a kill, Ctrl-C, a lost worker) and started again with ``resume`` runs
    only the unfinished units, planned as the stopped run planned them (its ranges and
    groups, whatever ``range_bytes`` says now; a changed input or option is an
    InvalidInputError; see ``lmdata.dolma._dedupe_resume``); without ``resume``, a run
    starts afresh, discarding what a stopped run left."""
    progress = accepted(progress)
    parallel.check_choice(executor, engine, None, address)
    run_all = functools.partial(
        parallel.run_all,
        engine=engine,
        workers=cfg.processes,
        address=address,
        executor=executor,
    )
    if storage_options is not None:
        cfg = dataclasses.replace(cfg, storage_options=dict(storage_options))
    bloom = cfg.bloom_filter
    if bloom.given or bloom.file:
        log.warning(_keyfile.note(cfg))
    if range_bytes is not None and range_bytes < 1:
        raise InvalidInputError(f"range_bytes must be at least 1, not {range_bytes}")
    if cfg.mode == "minhash":  # near-duplicates: its own phases, the same plan and markers
        from lmdata.dolma import minhash

        result = minhash.run(cfg, progress, run_all, range_bytes, resume)
        _write_manifests(cfg, cfg.document_files())
        return result
    files = cfg.document_files()
    t0 = time.perf_counter()
    stores = Stores(cfg.storage_options)
    sizes = [st.size(k) for st, k in map(stores, files)]
    total = sum(sizes)
    plain = sum(z for f, z in zip(files, sizes, strict=True) if splittable(f))
    prior = _keyfile.prior(cfg)
    nb = _nbuckets(cfg, total, prior.keys if prior is not None else 0)
    # from the inputs alone: a resumed run, on any number of workers, plans the same units
    step = range_size(plain) if range_bytes is None else range_bytes
    plan = Plan(step, max(GROUPS, -(-total // _ranges.RANGE_BYTES)), nb)
    if not files:  # a file partition with no files
        if bloom.writes and prior is None:  # dolma 1.2.1 writes its (empty) filter here too
            _keyfile.write(bloom.file, cfg.storage_options, _keyfile.kind(cfg), [], None)
        return DedupeResult(0, 0, 0, 0, time.perf_counter() - t0)
    # every run is resumable, as tokenize's: its work in the job's folder, each unit marked
    state = Resumable(cfg, files, sizes, stores)
    old = state.previous()
    if resume and old is not None:
        plan = state.check(old)  # the interrupted run's units, whatever the worker count now
    elif old is not None:
        state.discard(old)  # a stopped run's work: this run starts afresh
        old = None
    planned = _spans.plan(files, sizes, plan.range_bytes)
    spans = [s for s, _ in planned]
    groups = _spans.groups(spans, [z for _, z in planned], plan.groups)
    ranged = [cfg.attributes_of(s.path) for s in spans if s.ranged and s.part == 0]
    done = Done()
    work, job = state.work, state.job(plan)
    if old is None:
        state.begin(plan, [parts_folder(o, job) for o in ranged])
    else:
        done = Done.read(work)
        if done.keys_written:  # stopped after the key file: nothing is left but the folder
            work.remove()
            _write_manifests(cfg, files)
            return _finished(files, done, t0)
        done.drop_missing(spans, cfg.attributes_of, job, cfg.storage_options)
    # the pieces folders and the work folder kept recent while the job runs: `lmdata clean`
    # (default age 1 h) judges them by their newest entry, and a phase can outlast that
    fresh = Fresh(
        [(work.root, cfg.storage_options)]
        + [(parts_folder(o, job), cfg.storage_options) for o in ranged]
    )
    work.make()  # kept on an error or Ctrl-C: the work of a resumable job, for the next run
    counted, marked, written = _phases(
        cfg,
        spans,
        groups,
        plan,
        work,
        job,
        done,
        functools.partial(run_all, tick=fresh),
        progress,
        prior,
    )
    before = WriteResult(0, tuple(done.pieces.items()))  # the pieces earlier runs wrote
    joins = _joins(cfg, spans, [*written, before], job, done.joined)
    tasks = [JoinTask(j, work, k) for k, j in joins]
    if tasks:
        run_all(run_join_marked, tasks, what="join")
    joined = [cfg.attributes_of(spans[k].path) for k in done.joined if k < len(spans)]
    forget_joined(joined, job, cfg.storage_options)
    if bloom.writes:
        _keyfile.write(
            bloom.file,
            cfg.storage_options,
            _keyfile.kind(cfg),
            [m.name for m in _mark_tasks(counted, plan.nbuckets, work, prior=prior, cfg=cfg)],
            lambda name: np.frombuffer(work.get("k/" + name[2:]) or b"", dtype=_keyfile.KEY),
        )
        work.mark("keys")
    _write_manifests(cfg, files)
    work.remove()
    return DedupeResult(
        files=len(files),
        documents=sum(c.documents for c in counted),
        keys=sum(c.keys for c in counted),
        duplicates=sum(m.duplicates for m in marked),
        seconds=time.perf_counter() - t0,
    )


def _phases(
    cfg: DedupeConfig,
    spans: list[Span],
    groups: list[list[tuple[int, Span]]],
    plan: Plan,
    work: Spill,
    job: str,
    done: Done,
    run: Any,
    progress: OnProgress | None,
    prior: _keyfile.KeyFile | None = None,
) -> tuple[list[HashResult], list[MarkResult], list[WriteResult]]:
    """Run the three phases, each unit not ``done`` (the others' results from their markers),
    each unit leaving its marker."""

    def run_some(
        fn: Any, units: list[Any], what: str, progress: OnProgress | None = None
    ) -> list[Any]:
        return run(fn, units, what=what, progress=progress) if units else []

    nb = plan.nbuckets
    hashed = {t: HashResult(*h, t) for t in range(len(groups)) if (h := done.hash(t, nb))}
    ran = run_some(
        _phase_hash,
        [
            HashTask(t, tuple(g), cfg, work, nb, mark=True)
            for t, g in enumerate(groups)
            if t not in hashed
        ],
        what="dedupe: hash",
        progress=progress,
    )
    counted = sorted([*hashed.values(), *ran], key=lambda c: c.t)
    tasks = _mark_tasks(counted, nb, work, mark=True, prior=prior, cfg=cfg)
    new = iter(
        run_some(_phase_mark, [m for m in tasks if m.name not in done.marked], "dedupe: mark")
    )
    marked = [done.marked[m.name] if m.name in done.marked else next(new) for m in tasks]
    units = []
    for g in _by_marks(groups, marked, len(spans)):
        todo = [(k, s) for k, s in g if not done.span(k, s)]
        if todo:
            units.append(WriteTask(tuple(todo), cfg, work, _marks_of(todo, marked), job, mark=True))
    written = run_some(_phase_write, units, "dedupe: write")
    return counted, marked, written


def _joins(
    cfg: DedupeConfig,
    spans: list[Span],
    written: list[WriteResult],
    job: str,
    joined: set[int] | frozenset[int] = frozenset(),
) -> list[tuple[int, Join]]:
    """The joins of every file written in ranges (by its last span), but those ``joined``
    already: its pieces, in order, into its attribute file."""
    sums = dict(p for w in written for p in w.pieces)
    out = []
    for k, span in enumerate(spans):
        if span.ranged and span.part == span.parts - 1 and k not in joined:
            o = cfg.attributes_of(span.path)
            first = k - span.part
            pieces = tuple(sums[j] for j in range(first, k + 1))
            out.append((k, Join(o, codec_of(o), pieces, cfg.storage_options, job=job)))
    return out


def _nbuckets(cfg: DedupeConfig, total: int, prior: int = 0) -> int:
    """Hash buckets for ``total`` bytes of compressed input (and ``prior`` keys of a key
    file): a power of two, each bucket expected to hold about :data:`BUCKET_ENTRIES` entries
    in ``cfg``'s mode."""
    mode = "by_ngram" if cfg.mode != "documents" and cfg.ngrams.length else cfg.mode
    expected = (total * DENSITY[mode] + prior) / BUCKET_ENTRIES
    return int(min(MAX_BUCKETS, 2 ** int(np.ceil(np.log2(max(1.0, expected))))))


def _mark_tasks(
    counted: list[HashResult],
    nbuckets: int,
    work: Spill,
    mark: bool = False,
    prior: _keyfile.KeyFile | None = None,
    cfg: DedupeConfig | None = None,
) -> list[MarkTask]:
    """One mark unit per bucket, or per part of a bucket holding more than
    :data:`BUCKET_ENTRIES` entries (counted from the spills' tables and the key file's), so
    none sorts more; ``mark``: each leaves a marker when done (a resumable job)."""
    ids = np.array([(c.t, i) for c in counted for i in range(len(c.spills))], dtype=np.int64)
    bloom = cfg.bloom_filter if cfg is not None else None
    keys = bool(bloom and bloom.writes)
    if not len(ids) and prior is None and not keys:
        return []
    if len(ids):
        starts = np.stack([at for c in counted for at in c.spills])  # (spill, bucket + 1)
    else:
        ids, starts = np.zeros((0, 2), np.int64), np.zeros((0, nbuckets + 1), np.int64)
    sizes = np.diff(starts, axis=1)
    extra = prior.per_bucket(nbuckets) if prior is not None else np.zeros(nbuckets, np.int64)
    read_only = bool(bloom and bloom.read_only)
    held = sizes.sum(axis=0) + extra
    split = np.maximum(1, -(-held // BUCKET_ENTRIES))
    if prior is not None:
        # with a key file, the parts are fixed by the job's first run: a resumed run may find
        # the file already rewritten (a stop after the key file), its marks are the first's
        saved = work.get(PRIOR_PARTS)
        if saved is not None and len(saved) == 8 * nbuckets:
            split = np.frombuffer(saved, dtype="<i8")
        else:
            work.put(PRIOR_PARTS, split.astype("<i8").tobytes())
    out = []
    for b in range(nbuckets):
        has = np.flatnonzero(sizes[:, b])
        pieces = np.column_stack((ids[has], starts[has, b], starts[has, b + 1]))
        parts = int(split[b])
        where = prior.bucket(b, nbuckets) if prior is not None else None
        out += [
            MarkTask(b, work, pieces, nbuckets, p, parts, mark, where, read_only, keys)
            for p in range(parts)
        ]
    return out


def _write_manifests(cfg: DedupeConfig, files: list[str]) -> None:
    """Each attribute folder's manifest, once every attribute file of the job is there."""
    pairs = [(f, cfg.attributes_of(f)) for f in files]
    _manifests.record_attributes(pairs, cfg.storage_options)


def _finished(files: list[str], done: Done, t0: float) -> DedupeResult:
    """The result of a job a resumed run found finished, from its markers."""
    docs = sum(int(m.get("documents", 0)) for m, _ in done.hashed.values())
    keys = sum(int(m.get("keys", 0)) for m, _ in done.hashed.values())
    dups = sum(m.duplicates for m in done.marked.values())
    return DedupeResult(len(files), docs, keys, dups, time.perf_counter() - t0)


def _marks_of(group: list[tuple[int, Span]], marked: list[MarkResult]) -> tuple[Piece, ...]:
    """The ranges of the buckets' mark objects that hold the marks of ``group``'s spans (one
    per bucket at most: a bucket's marks are sorted by span, and a group's spans are
    consecutive)."""
    lo, hi = group[0][0], group[-1][0]
    out = []
    for m in marked:
        i, j = np.searchsorted(m.files, [lo, hi + 1])
        if i < j:
            out.append((m.name, int(m.starts[i]), int(m.starts[j])))
    return tuple(out)


def _by_marks(
    groups: list[list[tuple[int, Span]]], marked: list[MarkResult], nspans: int
) -> list[list[tuple[int, Span]]]:
    """``groups`` cut further into consecutive spans holding at most :data:`WRITE_MARKS`
    marks together (a write unit loads its spans' marks at once)."""
    counts = np.zeros(nspans, dtype=np.int64)
    for m in marked:
        if len(m.files):
            np.add.at(counts, m.files, np.diff(m.starts))
    out = []
    for g in groups:
        cur: list[tuple[int, Span]] = []
        held = 0
        for k, s in g:
            if cur and held + counts[k] > WRITE_MARKS:
                out.append(cur)
                cur, held = [], 0
            cur.append((k, s))
            held += int(counts[k])
        out.append(cur)
    return out
