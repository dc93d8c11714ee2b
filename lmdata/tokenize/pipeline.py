"""Documents -> tokens, in parallel, deterministically, resumably, losing nothing.

The job runs in two phases:

1. Units (an input file, a byte range of a plain JSONL file, a record range of a dataset) go to
   workers, which read them, parse, tokenize and stage the tokens in a hidden work folder beside
   the output (one file per batch). A worker hands back only the unit's name and its number of
   staged parts, so no document or token passes through the driver's executor.
2. The driver takes the units in input order and commits each staged part through the target
   format's writer, which produces the output atomically at the end; a unit is marked done
   when all its parts are. ``resume`` replays the staged parts of finished units, then runs
   the rest.

The output bytes therefore depend only on the inputs and options, never on the engine, the
number of workers or the size of the byte ranges; an interrupted job (Ctrl-C, a kill) leaves
no output, keeps the work folder, and ``resume=True`` skips the units already done.
"""

from __future__ import annotations

import io
import os
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from lmdata import parallel
from lmdata.errors import InvalidInputError, LmdataError, OutputExistsError
from lmdata.parallel import make_executor
from lmdata.parallel.staging import (
    Staging,
    prepare,
    resumable,
    staging_for,
    unit_key,
    work_dir_for,
)
from lmdata.storage import check_dest, is_url, join, options_scope, scheme
from lmdata.storage.claims import claim_job
from lmdata.storage.paths import remove_staged
from lmdata.tokenize.job import Summary, TokenizeJob
from lmdata.tokenize.sinks import EodSink, make_sink, resolve_eod
from lmdata.tokenize.sources import (
    TAIL_RANGES,
    TAIL_SMALLEST,
    Batch,
    InputFile,
    Unit,
    _Missing,
    first_line,
    input_versions,
    list_inputs,
    plan_units,
    range_bytes_for,
    read_batches,
)
from lmdata.tokenize.tokenizers import Tokenizer, load_tokenizer

MAX_SKIP_MESSAGES = 20

__all__ = ["Summary", "TokenizeJob", "tokenize", "work_dir_for"]


# ---- the worker side -------------------------------------------------------------------------

_TOKENIZER: Tokenizer | None = None
_LOADED: tuple[Any, ...] = ()  # what _TOKENIZER was loaded from: spec and the file's stat


def _init_worker(spec: str) -> None:
    """Load the job's tokenizer, unless this worker loaded the same file for a job before (a
    kept pool serves job after job; a large tokenizer takes a tenth of a second to load)."""
    global _TOKENIZER, _LOADED
    if parallel.in_worker():  # one core per worker process; never the caller's environment
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        st = os.stat(spec)
        key: tuple[Any, ...] = (os.getpid(), spec, st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:  # "bytes", a name
        key = (os.getpid(), spec)
    if _TOKENIZER is None or key != _LOADED or not parallel.in_worker():
        _TOKENIZER = load_tokenizer(spec)
        _LOADED = key


def _is_validation(key: str, fraction: float) -> bool:
    return (
        fraction > 0
        and (zlib.crc32(key.encode("utf-8", "surrogatepass")) % 1_000_000) < fraction * 1_000_000
    )


@dataclass(frozen=True)
class TokenizeTask:
    """One unit and what the worker needs to know to tokenize and stage it."""

    unit: Unit
    work: Staging  # where the worker stages its parts
    text_key: str
    batch_docs: int
    skip_invalid: bool
    validation_fraction: float
    validation_file: bool  # every document of the file goes to the validation split
    special_tokens: bool
    source_format: str | None
    storage_options: dict[str, Any] | None = None  # for inputs that are URLs


@dataclass(frozen=True)
class StagedUnit:
    """What a worker hands back: the unit it did and how many parts it staged (the tokens stay
    in the work folder)."""

    file: int
    part: int
    parts: int


def _part_name(file: int, part: int, seq: int) -> str:
    return f"{file:06d}-{part:06d}-{seq:06d}.npz"


def _process(task: TokenizeTask) -> StagedUnit:
    """Read, parse, tokenize and stage one unit; raises InvalidInputError on bad input unless
    skipping. The tokenizer (native code, without the GIL) encodes on a thread while this one
    stages the batch before and reads and parses the next. In this process (one worker, the
    tokenizer's own thread pool on every core) two batches encode at once, so that pool never
    idles at the end of a batch; a worker process keeps to one, and so does this process when
    the tokenizer is told to use one thread (two encoding batches would then take two cores)."""
    unit = task.unit
    seq = done = 0
    batches = read_batches(
        unit, task.batch_docs, task.text_key, task.source_format, task.storage_options
    )
    depth = 1 if parallel.in_worker() or _one_tokenizer_thread() else 2
    encoding: deque[tuple[Future[tuple[np.ndarray, np.ndarray]], _Parsed]] = deque()
    with ThreadPoolExecutor(depth, thread_name_prefix="lmdata-encode") as pool:
        for batch in batches:
            parsed = _parse_batch(task, batch, done)
            done += len(batch.items)
            encoding.append((pool.submit(_encode, parsed.texts, task.special_tokens), parsed))
            if len(encoding) > depth:
                _stage_batch(task, seq, *encoding.popleft())
                seq += 1
        while encoding:
            _stage_batch(task, seq, *encoding.popleft())
            seq += 1
    return StagedUnit(unit.file_index, unit.part, seq)


def _one_tokenizer_thread() -> bool:
    """Whether the environment keeps the tokenizer to one thread (its pool of one thread, or no
    pool: each call then encodes on the calling thread)."""
    off = os.environ.get("TOKENIZERS_PARALLELISM", "").strip().lower() in (
        "false",
        "0",
        "off",
        "no",
    )
    return off or os.environ.get("RAYON_NUM_THREADS", "").strip() == "1"


@dataclass
class _Parsed:
    """A batch's texts and what the driver needs besides their tokens."""

    texts: list[str]
    validation: list[bool]
    pending: list[tuple[int, int]]
    meta: dict[str, Any]


def _encode(texts: list[str], special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """(tokens of all ``texts`` as one uint32 array, each text's number of tokens)."""
    assert _TOKENIZER is not None
    ids = _TOKENIZER.encode_batch(texts, add_special_tokens=special_tokens) if texts else []
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.concatenate(ids).astype(np.uint32, copy=False) if ids else np.zeros(0, np.uint32)
    return flat, lengths


def _stage_batch(
    task: TokenizeTask,
    seq: int,
    encoded: Future[tuple[np.ndarray, np.ndarray]],
    parsed: _Parsed,
) -> None:
    flat, lengths = encoded.result()
    arrays = {
        "tokens": flat,
        "lengths": lengths,
        "validation": np.array(parsed.validation, dtype=bool),
        "pending": np.array(parsed.pending, dtype=np.int64).reshape(-1, 2),
    }
    _stage(task.work, _part_name(task.unit.file_index, task.unit.part, seq), arrays, parsed.meta)
    parallel.report(parsed.meta["read"])


def _parse_batch(task: TokenizeTask, batch: Batch, before: int) -> _Parsed:
    """A batch's texts and their validation split. Documents whose split depends on their line
    number (no id) are left ``pending``: the driver knows the line numbers as it commits."""
    lines = batch.kind == "lines"
    fraction = task.validation_fraction
    texts: list[str] = []
    val: list[bool] = []
    pending: list[tuple[int, int]] = []  # (document, item index in the batch)
    skipped: list[tuple[int, str]] = []
    for j, item in enumerate(batch.items):
        problem = None
        text = None
        key = None
        if lines:
            try:
                obj = orjson.loads(item)
            except orjson.JSONDecodeError as e:
                problem = f"malformed JSON ({e})"
            else:
                if not isinstance(obj, dict):
                    problem = "the line is not a JSON object"
                elif task.text_key not in obj:
                    problem = f"no {task.text_key!r} field (pass --text-key)"
                else:
                    text = obj[task.text_key]
                    if isinstance(obj.get("id"), (str, int)):
                        key = f"id:{obj['id']}"
        else:
            text = None if isinstance(item, _Missing) else item
            if text is None:
                problem = f"no {task.text_key!r} field (pass --text-key)"
            elif batch.ids is not None and isinstance(batch.ids[j], (str, int)):
                key = f"id:{batch.ids[j]}"
        if problem is None and not isinstance(text, str):
            problem = f"field {task.text_key!r} is {type(text).__name__}, not a string"
        if problem is not None:
            if not task.skip_invalid:
                where = "line" if lines else "record"
                raise InvalidInputError(
                    f"{problem}; fix it or pass --skip-invalid to skip such documents",
                    path=task.unit.path,
                    position=f"{where} {first_line(task.unit, task.storage_options) + before + j}",
                )
            skipped.append((j, problem))
            continue
        if key is None and fraction > 0 and not task.validation_file:
            pending.append((len(texts), j))
        val.append(task.validation_file or (key is not None and _is_validation(key, fraction)))
        texts.append(text)  # type: ignore[arg-type]
    meta = {
        "read": len(batch.items),
        "skipped": skipped,
        "bytes": sum(len(x) for x in batch.items if isinstance(x, (bytes, str))),
        "position": batch.position,
        "kind": "line" if lines else "record",
    }
    return _Parsed(texts, val, pending, meta)


# ---- the staging area -----------------------------------------------------------------------


def _manifest(
    job: TokenizeJob,
    inputs: list[InputFile],
    range_bytes: int,
    source_options: dict[str, Any] | None,
    origins: dict[str, str] | None,
) -> bytes:
    """What ``--resume`` must find unchanged: the job, the units' boundaries, and each input by
    name, size and version (a local file's mtime, a URL's ETag). An input read from a local
    copy (``origins``: copy -> URL) is named and versioned by its URL, so a resume that copies
    it again to a new place still matches."""
    named = [_origin(i, origins or {}) for i in inputs]
    versions = input_versions(named, source_options)
    files = [{**asdict(i), "version": v} for i, v in zip(named, versions, strict=True)]
    # the units' boundaries, which --resume must reuse (the tail: how the last ranges are cut)
    plan = {"range_bytes": range_bytes, "tail": [TAIL_RANGES, TAIL_SMALLEST]}
    return orjson.dumps(
        {"job": asdict(job), "inputs": files, "plan": plan}, option=orjson.OPT_SORT_KEYS
    )


def _origin(i: InputFile, origins: dict[str, str]) -> InputFile:
    """``i`` under the URL it was copied from, if it is a local copy."""
    for copy, url in origins.items():
        if i.path == copy:
            return InputFile(url, i.kind, i.size, i.validation)
        if i.path.startswith(copy + os.sep):
            rel = os.path.relpath(i.path, copy).replace(os.sep, "/")
            return InputFile(join(url, rel), i.kind, i.size, i.validation)
    return i


def _stage(work: Staging, name: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write one staged part whole (a retried task may write the same part again)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays, meta=np.frombuffer(orjson.dumps(meta), dtype=np.uint8))
    work.write_part(name, buf.getvalue())


# ---- the job ---------------------------------------------------------------------------------


def tokenize(
    sources: list[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    job: TokenizeJob,
    *,
    validation_sources: list[str | os.PathLike[str]] | None = None,
    workers: int | None = None,
    engine: str = "processes",
    address: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: Callable[[dict[str, float]], None] | None = None,
    storage_options: dict[str, Any] | None = None,
    range_bytes: int | None = None,
    source_options: dict[str, Any] | None = None,
    origins: dict[str, str] | None = None,
) -> Summary:
    """Tokenize the documents of ``sources`` into a ``job.to`` dataset at ``dst`` (a local
    path, or a URL written through the format's writer with ``storage_options``).

    ``engine`` is "inprocess", "processes" (``workers`` processes, default one per core) or
    "ray" (the cluster at ``address``, default a local one); plain JSONL files are cut into
    units of ``range_bytes`` (default: from the inputs' size, :func:`range_bytes_for`). The
    output is the same for every engine, worker count and range size. Sources may be URLs
    (files, folders, globs), read with ``source_options`` by the workers themselves;
    ``origins`` names the URLs of sources that are local copies.
    """
    if range_bytes is not None and range_bytes < 1:
        raise InvalidInputError(f"range_bytes must be positive, got {range_bytes}")
    t0 = time.perf_counter()
    remote = scheme(dst) not in (None, "file")
    work = staging_for(dst, storage_options if remote else None)
    # the output's claim names this job: a resume takes over the claim a killed run left
    with claim_job(work.where, takeover=resume):
        try:
            out, committed = check_dest(dst, overwrite, storage_options), None
        except OutputExistsError as e:
            if not (resume and work.exists()):
                raise
            # a run killed after its commit, before it removed its work: see below
            out, committed = check_dest(dst, True, storage_options), e
    url = is_url(out)
    dst = out if url else Path(out)  # type: ignore[assignment]
    inputs = list_inputs(list(sources), job.source_format, source_options)
    if validation_sources:
        inputs += [
            InputFile(i.path, i.kind, i.size, True)
            for i in list_inputs(list(validation_sources), job.source_format, source_options)
        ]
    if validation_sources and "validation" not in job.spec.splits:
        raise InvalidInputError(
            f"{job.to} has no validation split; tokenize the validation documents into a "
            "separate output instead of --validation"
        )
    if resume and not url:  # a killed run's half-written output (never a dataset) goes away
        remove_staged(dst)
    tok = load_tokenizer(job.tokenizer)  # fail early on a bad tokenizer, in the parent
    sink_factory = make_sink(job, tok)  # checks the EOD policy before any work
    if range_bytes is None:
        range_bytes = range_bytes_for(inputs)
    manifest = _manifest(job, inputs, range_bytes, source_options, origins)
    done = prepare(work, manifest, resume)
    units = plan_units(inputs, range_bytes, job.source_format, source_options)
    todo = [u for u in units if (u.file_index, u.part) not in done]
    if committed is not None:
        if todo or work.manifest() != manifest:
            raise committed  # not this job's output: it is in the way
        return _committed(job, tok, inputs, work, str(dst), t0)
    pool = make_executor(engine, workers, address, units=len(todo))
    local = [i.path for i in inputs if _in_this_process(i.path)]
    if local and not isinstance(pool, parallel.InProcess):
        raise InvalidInputError(
            "memory:// inputs live in this process and workers cannot read them; pass "
            "workers=0 (engine='inprocess'), or call lmdata.tokenize, which copies them",
            path=local[0],
        )
    summary = Summary(output=str(dst))
    commit = _Committer(job, inputs, work, summary, progress)
    # parts go into the output in input order as their units finish; the staged copies also
    # serve a later --resume, which replays the units already done before running the rest
    with options_scope(storage_options), claim_job(work.where, takeover=resume):
        commit.sink = sink_factory(dst, overwrite=overwrite)
    try:
        for name in work.parts():
            commit.part(name, fresh=False)
        if len(todo) < len(units):  # the units done are a prefix: input read up to its end
            commit.read_up_to(units[len(units) - len(todo) - 1])
        tasks = (_task(job, inputs, work, u, source_options) for u in todo)
        results = pool.map_ordered(
            _process, tasks, initializer=_init_worker, initargs=(job.tokenizer,)
        )
        for unit, res in zip(todo, results, strict=True):
            commit.unit(unit, res)
    except BaseException as e:
        commit.sink.abort()
        if not resumable(e):  # kept for --resume after Ctrl-C, a dead worker, a full disk
            work.clear()
        raise
    if summary.documents_read != summary.documents_written + summary.documents_skipped:
        commit.sink.abort()  # an internal invariant: never drop a document silently
        raise LmdataError(
            f"internal error: read {summary.documents_read} documents but wrote "
            f"{summary.documents_written} and skipped {summary.documents_skipped}"
        )
    commit.sink.close()
    work.clear()
    summary.seconds = time.perf_counter() - t0
    return summary


def _committed(
    job: TokenizeJob, tok: Tokenizer, inputs: list[InputFile], work: Staging, out: str, t0: float
) -> Summary:
    """The summary of a job whose interrupted run had committed the output (every unit done,
    the output there) and was stopped before it removed its work: counted from the staged
    parts, which then go."""
    summary = Summary(output=out)
    commit = _Committer(job, inputs, work, summary, None)
    commit.sink = EodSink(_Discard(), resolve_eod(job, tok))
    for name in work.parts():
        commit.part(name, fresh=False)
    work.clear()
    summary.seconds = time.perf_counter() - t0
    return summary


class _Discard:
    """A token sink that keeps nothing (the tokens are in the output already)."""

    def write_many(self, flat: Any, lengths: Any, split: str = "train") -> None:
        pass


def _in_this_process(path: str) -> bool:
    """An input on a store that only this process sees (memory://)."""
    from lmdata.storage import scheme

    return scheme(path) == "memory"


def _task(
    job: TokenizeJob,
    inputs: list[InputFile],
    work: Staging,
    unit: Unit,
    source_options: dict[str, Any] | None = None,
) -> TokenizeTask:
    return TokenizeTask(
        unit=unit,
        work=work,
        text_key=job.text_key,
        batch_docs=job.batch_docs,
        skip_invalid=job.skip_invalid,
        validation_fraction=job.validation_fraction,
        validation_file=inputs[unit.file_index].validation,
        special_tokens=job.special_tokens,
        source_format=job.source_format,
        storage_options=source_options,
    )


class _Committer:
    """The driver's side: writes staged parts into the output in input order, numbers their
    lines (each file's parts arrive in order), decides the pending validation documents, counts
    and reports progress."""

    def __init__(
        self,
        job: TokenizeJob,
        inputs: list[InputFile],
        work: Staging,
        summary: Summary,
        progress: Callable[[dict[str, float]], None] | None,
    ) -> None:
        self.job, self.inputs, self.work, self.summary = job, inputs, work, summary
        self.progress = progress
        self.sink: Any = None
        self.lines: dict[int, int] = {}  # lines (records) of each file committed so far
        # "input_bytes" is how far the job has read its inputs (compressed sizes), for the ETA
        self.base = np.concatenate([[0], np.cumsum([i.size for i in inputs])]).tolist()
        self.stats = {
            "documents": 0.0,
            "tokens": 0.0,
            "bytes": 0.0,
            "total_bytes": float(self.base[-1]),
            "input_bytes": 0.0,
        }

    def unit(self, unit: Unit, res: StagedUnit) -> None:
        """Commit a finished unit's parts, then mark it done."""
        assert (res.file, res.part) == (unit.file_index, unit.part)
        for seq in range(res.parts):
            self.part(_part_name(res.file, res.part, seq), fresh=True)
        self.work.mark_done(res.file, res.part)
        self.read_up_to(unit)

    def read_up_to(self, unit: Unit) -> None:
        """Progress: the inputs are read up to the end of ``unit``."""
        end = unit.end if unit.splittable else self.inputs[unit.file_index].size
        self.stats["input_bytes"] = float(self.base[unit.file_index] + end)

    def part(self, name: str, fresh: bool) -> None:
        file = unit_key(name)[0]
        with np.load(io.BytesIO(self.work.read_part(name))) as z:
            tokens, lengths, val = z["tokens"], z["lengths"], z["validation"]
            pending = z["pending"]
            meta = orjson.loads(z["meta"].tobytes())
        line0 = self.lines.get(file, 0) + 1
        self.lines[file] = line0 - 1 + meta["read"]
        name = os.path.basename(self.inputs[file].path)
        for doc, j in pending.tolist():
            val[doc] = _is_validation(f"{name}:{line0 + j}", self.job.validation_fraction)
        s = self.summary
        s.documents_read += meta["read"]
        s.documents_skipped += len(meta["skipped"])
        s.bytes_read += meta["bytes"]
        for j, problem in meta["skipped"][: max(MAX_SKIP_MESSAGES - len(s.skipped), 0)]:
            s.skipped.append(f"{self.inputs[file].path}: {meta['kind']} {line0 + j}: {problem}")
        s.tokens += self.sink.write_many(tokens, lengths, val)
        s.documents_written += len(lengths)
        if not fresh:
            return
        self.stats["documents"] += meta["read"]
        self.stats["tokens"] += len(tokens)
        self.stats["bytes"] += meta["bytes"]
        pos = meta["position"]
        if pos != 0:  # 0: a source that cannot tell
            self.stats["input_bytes"] = self.base[file] + (
                self.inputs[file].size if pos < 0 else pos
            )
        if self.progress is not None:
            self.progress(self.stats)
