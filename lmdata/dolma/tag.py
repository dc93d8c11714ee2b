"""``tag``: run taggers over document files and write row-aligned attribute files.

With an experiment name every tagger's keys go to ``attributes/<experiment>/`` (keys
``<experiment>__<tagger>__<type>``); without one each tagger writes ``attributes/<tagger>/``
with keys ``<tagger>__<tagger>__<type>``, as dolma does. A unit is a document file, or a byte
range of a plain (uncompressed) JSONL file larger than the job's range size, so one file is
tagged by several workers; compressed files cannot be entered in the middle and are one unit
each. The range size (:func:`lmdata.dolma._ranges.range_size`) is the job's plain bytes over 16,
within 4 to 64 MiB: a job makes enough units for its workers to finish together, the same
units for any number of workers. Each range writes a piece of the attribute file
(:mod:`lmdata.dolma.pieces`: a folder beside it named after the job) and the pieces are joined
in input order into one file: the attribute file of a plain document file is plain, so it holds
the bytes one unit writes, for any engine, number of workers and range size. Each output file
appears atomically, and an existing one is kept (resume) unless ``ignore_existing``; a file
tagged in ranges is kept or redone as a whole (decided once, before the job), and a job run
again redoes only the ranges whose pieces are not complete. Documents and attributes live in
any store (local paths, ``s3://``, ``memory://``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from lmdata import parallel
from lmdata._progress import OnProgress, accepted
from lmdata.dolma import _manifests
from lmdata.dolma._ranges import cut, range_size
from lmdata.dolma.config import TagConfig
from lmdata.dolma.pieces import (
    Fresh,
    Join,
    done_pieces,
    job_id,
    join_all,
    mark_done,
    part_key,
    parts_folder,
    version,
)
from lmdata.dolma.taggers import load_modules, make_tagger, tag_document
from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats.dolma._files import (
    iter_range_lines,
    iter_raw_lines,
    line_number_at,
    splittable,
)
from lmdata.formats.dolma._output import OutputFile, Part
from lmdata.formats.dolma._paths import Stores, attribute_path, codec_of, is_file
from lmdata.formats.dolma._rows import parse_line
from lmdata.parallel import Executor
from lmdata.storage import Store, resolve


@dataclass(frozen=True)
class TagResult:
    files: int
    skipped_files: int
    documents: int  # tagged by this run (not those of pieces an earlier run completed)
    seconds: float
    outputs: tuple[str, ...]

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


def _outputs(doc_file: str, cfg: TagConfig) -> list[tuple[str, str, list[str]]]:
    """(attribute file, experiment, tagger names) written for one document file."""
    if cfg.experiment:
        return [(attribute_path(doc_file, cfg.experiment), cfg.experiment, list(cfg.taggers))]
    return [(attribute_path(doc_file, t), t, [t]) for t in cfg.taggers]


@dataclass(frozen=True)
class TagTask:
    """Tag the documents of one file, or of the lines starting in bytes ``[start, end)`` of a
    plain file (piece ``part`` of ``parts``); the worker reads them itself."""

    path: str
    cfg: TagConfig
    start: int = 0
    end: int = -1
    part: int = 0
    parts: int = 1  # above 1: the outputs are written in pieces, then joined
    job: str = ""  # names the pieces' folder (pieces.job_id)


@dataclass(frozen=True)
class TagFileResult:
    documents: int
    skipped: bool  # every output existed already
    checksums: tuple[tuple[int, int], ...] = ()  # per output, of a piece (gzip: CRC-32, size)


def _tag_file(task: TagTask) -> TagFileResult:
    cfg = task.cfg
    store, path = resolve(task.path, cfg.storage_options)
    where = store.url(path)
    outs = _outputs(path, cfg)
    # a file tagged in ranges is kept or redone as a whole: the driver decided, once
    if task.parts == 1 and not cfg.ignore_existing and all(is_file(store, o) for o, _, _ in outs):
        return TagFileResult(0, True)
    load_modules(cfg.tagger_modules)
    groups = [[(exp, n, make_tagger(n, seed=cfg.seed)) for n in names] for _, exp, names in outs]
    n = 0
    files: list[OutputFile] = []
    piece = Part(task.part == 0, task.part == task.parts - 1) if task.parts > 1 else None
    try:
        for o, _, _ in outs:
            key = o if piece is None else part_key(o, task.part, task.job)
            # written in the codec the name says, as readers (dolma's too) decode it
            files.append(OutputFile(store, key, codec_of(o), part=piece))
        for lineno, raw in _lines(store, path, task):
            try:
                doc = _document(raw, where, lineno)
            except CorruptDataError:
                if lineno > 0:
                    raise
                # a ranged unit counts lines only to name one in an error
                _document(raw, where, line_number_at(store, path, -lineno - 1))
                raise
            source = doc.get("source")
            for f, group in zip(files, groups, strict=True):
                row = {
                    "id": doc["id"],
                    "attributes": tag_document(doc, group),
                    "source": source if isinstance(source, str) else "",
                }
                f.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
            n += 1
            if n % parallel.REPORT_EVERY == 0:
                parallel.report(parallel.REPORT_EVERY)
    except BaseException:
        for f in files:
            f.abort()
        raise
    for f in files:  # all of a file's outputs appear together, after every one is written
        f.commit()
    sums = tuple(f.checksum() for f in files)
    if piece is not None:  # each piece complete: a resumed job takes it as it is
        for (o, _, _), c in zip(outs, sums, strict=True):
            mark_done(store, o, task.part, task.job, {"documents": n, "checksum": list(c)})
    parallel.report(n % parallel.REPORT_EVERY)
    return TagFileResult(n, False, sums)


def _document(raw: bytes, where: str, lineno: int) -> dict[str, Any]:
    """The document of one line, with the text and id that tagging needs."""
    doc = parse_line(raw, where, lineno)
    if not isinstance(doc.get("text"), str):
        raise CorruptDataError(
            "document has no string 'text' to tag; run `lmdata validate` on the tree",
            path=where,
            position=f"line {lineno}",
        )
    if "id" not in doc:
        raise CorruptDataError(
            "document has no 'id'; attribute rows are matched by id",
            path=where,
            position=f"line {lineno}",
        )
    return doc


def _lines(store: Store, path: str, task: TagTask) -> Any:
    """(line number, line) of the unit; a ranged unit gives ``-(offset + 1)`` instead of the
    line number, which only an error needs (counting lines would read the file up to it)."""
    if task.parts == 1:
        return iter_raw_lines(store, path)
    return ((-(off + 1), raw) for off, raw in iter_range_lines(store, path, task.start, task.end))


@dataclass
class _File:
    """How one document file is tagged: its units (one, or a unit per range not done yet), and
    for a file in ranges its pieces and what an earlier run of the job completed."""

    path: str
    tasks: list[TagTask]
    skipped: bool = False  # in ranges, and every output existed before the job
    parts: int = 1
    job: str = ""
    done: dict[int, TagFileResult] = field(default_factory=dict)


def _plan(cfg: TagConfig, files: list[str]) -> list[_File]:
    """One unit per document file, or per range of a plain file larger than the job's range
    size (:func:`lmdata.dolma._ranges.range_size` of its plain bytes); such a file is skipped
    (its outputs exist) or tagged as a whole, decided here once, and its ranges whose pieces
    an earlier run of the job completed are taken as they are."""
    out = []
    stores = Stores(cfg.storage_options)
    found = [stores(f) for f in files]
    sizes = [store.size(key) if splittable(key) else 0 for store, key in found]
    step = range_size(sum(sizes))
    for f, (store, key), size in zip(files, found, sizes, strict=True):
        if size <= step:
            out.append(_File(f, [TagTask(f, cfg)]))
            continue
        outs = [o for o, _, _ in _outputs(key, cfg)]
        if not cfg.ignore_existing and all(is_file(store, o) for o in outs):
            out.append(_File(f, [], skipped=True))
            continue
        ranges = cut(size, step)
        n = len(ranges)
        job = job_id(
            "tag",
            store.url(key),
            size,
            version(store, key),
            ranges,
            cfg.taggers,
            cfg.experiment,
            cfg.seed,
            cfg.tagger_modules,
        )
        done = {} if cfg.ignore_existing else _done(store, outs, job)
        tasks = [
            TagTask(f, cfg, a, b, k, n, job) for k, (a, b) in enumerate(ranges) if k not in done
        ]
        out.append(_File(f, tasks, parts=n, job=job, done=done))
    return out


def _done(store: Store, outputs: list[str], job: str) -> dict[int, TagFileResult]:
    """The pieces complete in every output (their results), from a killed run of ``job``."""
    found = [done_pieces(store, o, job) for o in outputs]
    out = {}
    for k in set.intersection(*(set(d) for d in found)):
        try:
            docs = int(found[0][k]["documents"])
            sums = tuple((int(d[k]["checksum"][0]), int(d[k]["checksum"][1])) for d in found)
        except (KeyError, TypeError, ValueError, IndexError):
            continue  # not a marker this version wrote: the range is redone
        out[k] = TagFileResult(docs, False, sums)
    return out


def _joins(cfg: TagConfig, plan: list[_File], results: list[TagFileResult]) -> list[Join]:
    """The joins of every file tagged in ranges: its pieces (this job's and those an earlier
    run completed) into its attribute files."""
    out = []
    got = iter(results)
    for p in plan:
        ran = {t.part: next(got) for t in p.tasks}
        if p.parts == 1 or p.skipped:
            continue
        group = [ran[k] if k in ran else p.done[k] for k in range(p.parts)]
        for j, (o, _, _) in enumerate(_outputs(p.path, cfg)):
            sums = tuple(r.checksums[j] for r in group)
            out.append(Join(o, codec_of(o), sums, cfg.storage_options, job=p.job))
    return out


def tag(
    cfg: TagConfig,
    progress: OnProgress | None = None,
    engine: str = "processes",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
    executor: Executor | None = None,
) -> TagResult:
    """Run ``cfg.taggers`` over ``cfg.documents`` on ``cfg.processes`` workers of ``engine``
    ("inprocess", "processes", "ray" at ``address``), or on ``executor`` (an
    ``lmdata.parallel.Executor`` of the caller's, with its own workers); see the module
    docstring for outputs. ``storage_options`` (fsspec options for URLs) replace the
    config's. ``progress`` receives ``lmdata.Progress`` events of the phase "tag", in
    documents tagged."""
    progress = accepted(progress)
    parallel.check_choice(executor, engine, None, address)
    if storage_options is not None:
        cfg = dataclasses.replace(cfg, storage_options=dict(storage_options))
    if not cfg.taggers:
        raise InvalidInputError("no taggers given; name at least one (see `lmdata tag --list`)")
    load_modules(cfg.tagger_modules)
    for name in cfg.taggers:
        make_tagger(name, seed=cfg.seed)  # fail early on unknown names
    files = cfg.document_files()
    t0 = time.perf_counter()
    plan = _plan(cfg, files)
    tasks = [t for p in plan for t in p.tasks]
    fresh = Fresh(
        (parts_folder(o, p.job), cfg.storage_options)
        for p in plan
        if p.job
        for o, _, _ in _outputs(p.path, cfg)
    )
    run_all = functools.partial(
        parallel.run_all,
        engine=engine,
        workers=cfg.processes,
        address=address,
        executor=executor,
    )
    results = run_all(_tag_file, tasks, what="tag", progress=progress, tick=fresh)
    join_all(_joins(cfg, plan, results), run_all)
    pairs = [(f, o) for f in files for o, _, _ in _outputs(f, cfg)]
    _manifests.record_attributes(pairs, cfg.storage_options)
    outs = tuple(o for _, o in pairs)
    skipped = sum(p.skipped for p in plan)
    skipped += sum(r.skipped for r, t in zip(results, tasks, strict=True) if t.parts == 1)
    return TagResult(
        files=len(files),
        skipped_files=skipped,
        documents=sum(r.documents for r in results),
        seconds=time.perf_counter() - t0,
        outputs=outs,
    )


def tag_paths(
    documents: Sequence[str] | str,
    taggers: Sequence[str],
    *,
    progress: OnProgress | None = None,
    engine: str = "processes",
    address: str | None = None,
    executor: Executor | None = None,
    **options: Any,
) -> TagResult:
    """Convenience wrapper: ``tag_paths("ds/documents/*.gz", ["char_length_v1"], ...)``;
    ``options`` are config keys (``experiment=``, ``processes=``, ...), the rest as ``tag``."""
    docs = [documents] if isinstance(documents, str) else list(documents)
    cfg = TagConfig.from_dict({"documents": docs, "taggers": list(taggers), **options})
    return tag(cfg, progress=progress, engine=engine, address=address, executor=executor)
