"""``decontaminate``: flag the spans of documents that match evaluation text.

Every evaluation text (a JSONL or Parquet record's ``text_key``, or a whole plain text file)
is normalised as MinHash dedupe's (:mod:`lmdata.dolma._shingle`: lower case, punctuation and
whitespace only separate words, line breaks too) and cut into word ``ngram``-grams (13 by
default); a text with fewer words gives none (counted in the result: a short answer such as
"yes" would match everywhere). Each document gets the attribute ``name``: the character spans
``[[start, end, 1.0], ...]`` covered by its n-grams found in that set (overlapping or touching
ones merged: an evaluation passage embedded anywhere in a long document, however it is
wrapped, cased or punctuated, is one span from its first word to its last), or ``[]``.
Rows are ``{"attributes": {name: spans}, "id": ...}``.

The job runs as dedupe's do (:mod:`lmdata.dolma.dedupe`): the same spans (a plain file cut
into byte ranges, pieces joined), groups, work folder, markers and ``resume``; the
evaluation n-grams are saved once in the work folder, and their digest is part of the job, so
a resume against other evaluation data is refused. The attribute files are the same bytes for
any number of workers, engine and range size.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import xxhash

from lmdata import parallel
from lmdata._progress import OnProgress, accepted
from lmdata.dolma import _manifests, _ranges, _shingle, _spans
from lmdata.dolma._buckets import Spill
from lmdata.dolma._decontam_config import DecontamConfig
from lmdata.dolma._dedupe_resume import (
    Done,
    JoinTask,
    Plan,
    Resumable,
    forget_joined,
    run_join_marked,
)
from lmdata.dolma._dedupe_write import WriteResult
from lmdata.dolma._ranges import range_size
from lmdata.dolma._spans import Span
from lmdata.dolma.pieces import Fresh, part_key, parts_folder
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats.dolma._files import iter_raw_lines, splittable
from lmdata.formats.dolma._output import OutputFile, Part
from lmdata.formats.dolma._paths import Stores, codec_of, expand_globs
from lmdata.parallel import Executor
from lmdata.storage import resolve

EVALS = "h/evals"  # the evaluation n-gram hashes, sorted, in the work folder
BATCH = 256  # documents per call into the kernel
_JSONL = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True)
class DecontamResult:
    files: int
    documents: int
    contaminated: int  # documents with at least one span
    spans: int
    eval_texts: int
    eval_ngrams: int  # distinct
    short_texts: int  # evaluation texts with fewer than ngram words (no n-gram)
    seconds: float

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


def eval_texts(cfg: DecontamConfig) -> list[str]:
    """The evaluation texts of ``cfg.against``, in order (files sorted within each pattern)."""
    files = expand_globs(list(cfg.against), storage_options=cfg.storage_options)
    if not files:
        raise InvalidInputError(f"no evaluation files match {list(cfg.against)}")
    out: list[str] = []
    for f in files:
        out += _texts_of(f, cfg)
    return out


def _texts_of(path: str, cfg: DecontamConfig) -> list[str]:
    store, key = resolve(path, cfg.storage_options)
    base = key.lower()
    for ext in (".gz", ".zst", ".zstd"):
        base = base.removesuffix(ext)
    if base.endswith(".parquet"):
        return _parquet_texts(store.read(key), path, cfg.text_key)
    if base.endswith(_JSONL):
        out = []
        for line, raw in iter_raw_lines(store, key):
            if not raw.strip():
                continue
            try:
                rec = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise CorruptDataError(
                    f"not JSON: {e}", path=path, position=f"line {line}"
                ) from None
            text = rec.get(cfg.text_key) if isinstance(rec, dict) else None
            if not isinstance(text, str):
                raise CorruptDataError(
                    f"record has no string {cfg.text_key!r}; give the field with --text-key",
                    path=path,
                    position=f"line {line}",
                )
            out.append(text)
        return out
    raw = b"".join(r + b"\n" for _, r in iter_raw_lines(store, key))
    try:
        return [raw.decode("utf-8")]
    except UnicodeDecodeError as e:
        raise CorruptDataError(
            f"plain text evaluation file is not UTF-8 ({e.reason})",
            path=path,
            position=f"byte {e.start}",
        ) from None


def _parquet_texts(data: bytes, path: str, column: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        if column not in pf.schema_arrow.names:
            raise InvalidInputError(
                f"Parquet file has no column {column!r} (it has "
                f"{', '.join(pf.schema_arrow.names)}); give the column with --text-key",
                path=path,
            )
        col = pf.read(columns=[column]).column(column)
    except (pa.ArrowException, OSError) as e:
        raise CorruptDataError(f"cannot read Parquet: {e}", path=path) from None
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise InvalidInputError(f"Parquet column {column!r} is {col.type}, not text", path=path)
    return [t for t in col.to_pylist() if t is not None]


@dataclass(frozen=True)
class Evals:
    keys: np.ndarray  # distinct n-gram hashes, sorted
    texts: int
    short: int


def eval_set(cfg: DecontamConfig) -> Evals:
    """The distinct n-gram hashes of every evaluation text."""
    texts = eval_texts(cfg)
    counts, hashes = _shingle.grams(texts, cfg.ngram)
    return Evals(_shingle.distinct(hashes), len(texts), int((counts == 0).sum()))


@dataclass(frozen=True)
class DecontamTask:
    """Write the attribute rows of consecutive spans."""

    spans: tuple[tuple[int, Span], ...]
    cfg: DecontamConfig
    work: Spill
    nkeys: int
    job: str = ""


@dataclass(frozen=True)
class DecontamUnit:
    written: WriteResult
    contaminated: int
    spans: int


@functools.lru_cache(maxsize=2)
def _table(root: str, digest: str, nkeys: int, opts: Any) -> _shingle.Table:
    """The evaluation table, read once per worker process (per job)."""
    work = Spill(root, dict(opts) if opts else None)
    return _shingle.Table.build(work.load([(EVALS, 0, nkeys)], np.dtype("<u8")))


def _rows(
    ids: list[Any], texts: list[str], n: int, table: _shingle.Table, name: str
) -> tuple[bytes, int, int]:
    """The attribute rows of a batch of documents, and how many have spans, and spans: as
    ``orjson.dumps({"attributes": {name: spans}, "id": id}, sorted keys)`` (a row without
    spans put together from its parts: most documents have none)."""
    d, s, e = _shingle.match(texts, n, table)
    found: dict[int, list[list[Any]]] = {}
    for i, a, b in zip(d.tolist(), s.tolist(), e.tolist(), strict=True):
        found.setdefault(i, []).append([a, b, 1.0])
    empty = b'{"attributes":{' + orjson.dumps(name) + b':[]},"id":'
    rows = []
    for i, ident in enumerate(ids):
        spans = found.get(i)
        if spans is None:
            rows.append(empty + orjson.dumps(ident, option=orjson.OPT_SORT_KEYS) + b"}\n")
        else:
            row = {"attributes": {name: spans}, "id": ident}
            rows.append(orjson.dumps(row, option=orjson.OPT_SORT_KEYS) + b"\n")
    return b"".join(rows), len(found), len(d)


def phase_match(task: DecontamTask) -> DecontamUnit:
    cfg = task.cfg
    opts = tuple(sorted((cfg.storage_options or {}).items())) or None
    table = _table(task.work.root, cfg.evals, task.nkeys, opts)
    stores = Stores(cfg.storage_options)
    pieces = []
    n = hit = nspans = 0
    for k, span in task.spans:
        store, doc_key = stores(span.path)
        out = cfg.attributes_of(doc_key)
        key = part_key(out, span.part, task.job) if span.ranged else out
        piece = Part(span.part == 0, span.part == span.parts - 1) if span.ranged else None
        with OutputFile(store, key, codec_of(out), part=piece) as f:
            ids: list[Any] = []
            texts: list[str] = []
            docs = _spans.read(store, doc_key, span, cfg)  # type: ignore[arg-type]
            for last, (_i, doc, text) in _with_last(docs):
                ids.append(doc.get("id"))
                texts.append(text)
                if len(texts) == BATCH or last:
                    rows, h, ns = _rows(ids, texts, cfg.ngram, table, cfg.name)
                    f.write(rows)
                    n, hit, nspans = n + len(texts), hit + h, nspans + ns
                    parallel.report(len(texts))
                    ids, texts = [], []
        checksum = f.checksum()
        if span.ranged:
            pieces.append((k, checksum))
        task.work.mark(f"p-{k}-{checksum[0]}-{checksum[1]}" if span.ranged else f"w-{k}")
    return DecontamUnit(WriteResult(n, tuple(pieces)), hit, nspans)


def _with_last(items: Any) -> Any:
    """``(is_last, item)`` for each item of an iterator."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield False, prev
        prev = item
    yield True, prev


def decontaminate(
    cfg: DecontamConfig,
    progress: OnProgress | None = None,
    engine: str = "processes",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
    range_bytes: int | None = None,
    resume: bool = False,
    executor: Executor | None = None,
) -> DecontamResult:
    """Write ``attributes/<cfg.name>/`` for every document file of ``cfg`` on ``cfg.processes``
    workers of ``engine`` or on ``executor`` (see the module docstring); the arguments are
    ``lmdata.dolma.dedupe.dedupe``'s (``progress``: the phase "decontaminate")."""
    progress = accepted(progress)
    parallel.check_choice(executor, engine, None, address)
    from lmdata.dolma.dedupe import _joins

    if storage_options is not None:
        cfg = dataclasses.replace(cfg, storage_options=dict(storage_options))
    if range_bytes is not None and range_bytes < 1:
        raise InvalidInputError(f"range_bytes must be at least 1, not {range_bytes}")
    t0 = time.perf_counter()
    evals = eval_set(cfg)
    cfg = dataclasses.replace(cfg, evals=xxhash.xxh3_128_hexdigest(evals.keys.tobytes()))
    files = cfg.document_files()
    stores = Stores(cfg.storage_options)
    sizes = [st.size(k) for st, k in map(stores, files)]
    total = sum(sizes)
    plain = sum(z for f, z in zip(files, sizes, strict=True) if splittable(f))
    step = range_size(plain) if range_bytes is None else range_bytes
    plan = Plan(step, max(_ranges.SPREAD_UNITS, -(-total // _ranges.RANGE_BYTES)), 1)
    state = Resumable(cfg, files, sizes, stores)  # type: ignore[arg-type]
    old = state.previous()
    if resume and old is not None:
        plan = state.check(old)
    elif old is not None:
        state.discard(old)
        old = None
    planned = _spans.plan(files, sizes, plan.range_bytes)
    spans = [s for s, _ in planned]
    groups = _spans.groups(spans, [z for _, z in planned], plan.groups)
    ranged = [cfg.attributes_of(s.path) for s in spans if s.ranged and s.part == 0]
    work, job = state.work, state.job(plan)
    done = Done()
    if old is None:
        state.begin(plan, [parts_folder(o, job) for o in ranged])
        work.save("h", EVALS[2:], evals.keys)
    else:
        done = Done.read(work)
        done.drop_missing(spans, cfg.attributes_of, job, cfg.storage_options)
    fresh = Fresh(
        [(work.root, cfg.storage_options)]
        + [(parts_folder(o, job), cfg.storage_options) for o in ranged]
    )
    work.make()
    units = []
    for g in groups:
        todo = tuple((k, s) for k, s in g if not done.span(k, s))
        if todo:
            units.append(DecontamTask(todo, cfg, work, len(evals.keys), job))
    run_all = functools.partial(
        parallel.run_all,
        engine=engine,
        workers=cfg.processes,
        address=address,
        executor=executor,
        tick=fresh,
    )
    ran = run_all(phase_match, units, what="decontaminate", progress=progress) if units else []
    before = WriteResult(0, tuple(done.pieces.items()))
    joins = _joins(cfg, spans, [*(u.written for u in ran), before], job, done.joined)  # type: ignore[arg-type]
    tasks = [JoinTask(j, work, k) for k, j in joins]
    if tasks:
        run_all(run_join_marked, tasks, what="join")
    joined = [cfg.attributes_of(spans[k].path) for k in done.joined if k < len(spans)]
    forget_joined(joined, job, cfg.storage_options)
    pairs = [(f, cfg.attributes_of(f)) for f in files]
    _manifests.record_attributes(pairs, cfg.storage_options)
    work.remove()
    return DecontamResult(
        files=len(files),
        documents=sum(u.written.rows for u in ran),
        contaminated=sum(u.contaminated for u in ran),
        spans=sum(u.spans for u in ran),
        eval_texts=evals.texts,
        eval_ngrams=len(evals.keys),
        short_texts=evals.short,
        seconds=time.perf_counter() - t0,
    )


def decontaminate_paths(
    documents: list[str] | str, against: list[str] | str, **options: Any
) -> DecontamResult:
    """Convenience wrapper: ``decontaminate_paths("ds/documents/*.gz", "evals/*.jsonl",
    ngram=13, processes=2)``; ``options`` are config keys, or ``decontaminate``'s
    arguments (``engine=``, ``progress=``, ``resume=``, ...)."""
    run_keys = (
        "progress",
        "engine",
        "address",
        "executor",
        "storage_options",
        "range_bytes",
        "resume",
    )
    run = {k: options.pop(k) for k in run_keys if k in options}
    docs = [documents] if isinstance(documents, str) else list(documents)
    evals = [against] if isinstance(against, str) else list(against)
    cfg = DecontamConfig.from_dict({"documents": docs, "against": evals, **options})
    return decontaminate(cfg, **run)
