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

import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
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
    work_dir_for,
)
from lmdata.storage import check_dest, is_url, join, options_scope, scheme
from lmdata.storage.claims import claim_job
from lmdata.storage.paths import remove_staged
from lmdata.tokenize.commit import Committer, StagedUnit, is_validation, pack_part, part_name
from lmdata.tokenize.encoders import (
    FIRST_CHARS,
    FIRST_DOCS,
    Choice,
    check_one,
    choose,
    load_encoder,
    note,
    pick,
)
from lmdata.tokenize.job import Summary, TokenizeJob
from lmdata.tokenize.sinks import EodSink, make_sink, resolve_eod
from lmdata.tokenize.sources import (
    TAIL_RANGES,
    TAIL_SMALLEST,
    Batch,
    InputFile,
    Unit,
    Unreadable,
    _Missing,
    first_line,
    input_versions,
    list_inputs,
    plan_units,
    range_bytes_for,
    read_batches,
)
from lmdata.tokenize.tokenizers import load_tokenizer

__all__ = ["Summary", "TokenizeJob", "tokenize", "work_dir_for"]


# ---- the worker side -------------------------------------------------------------------------

_TOKENIZER: Any = None
_LOADED: tuple[Any, ...] = ()  # what _TOKENIZER was loaded from: spec, encoder, the file's stat


def _init_worker(spec: str, encoder: str = "hf") -> None:
    """Load the job's tokenizer as ``encoder`` ("fast", else the reference), unless this
    worker loaded the same file for a job before (a kept pool serves job after job; a large
    tokenizer takes a tenth of a second to load). A fast tokenizer the driver loaded is kept
    by the workers forked from it (it holds no thread pool); a reference one is loaded again
    in each process."""
    global _TOKENIZER, _LOADED
    if parallel.in_worker():  # one core per worker process; never the caller's environment
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    key = _key(spec, encoder)
    if _TOKENIZER is None or key != _LOADED or (encoder != "fast" and not parallel.in_worker()):
        _TOKENIZER = load_encoder(spec, encoder)
        _LOADED = key


def _key(spec: str, encoder: str) -> tuple[Any, ...]:
    """What a loaded tokenizer was loaded from: the file (by its stat) and the encoder; a
    reference tokenizer also by process."""
    try:
        st = os.stat(spec)
        key: tuple[Any, ...] = (spec, encoder, st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:  # "bytes", a name
        key = (spec, encoder)
    return key if encoder == "fast" else (os.getpid(), *key)


def _adopt(spec: str, choice: Choice) -> None:
    """Make the fast tokenizer the driver loaded (and checked) the one ``_init_worker`` finds
    loaded, here and in workers forked from here."""
    global _TOKENIZER, _LOADED
    _TOKENIZER, _LOADED = choice.tokenizer, _key(spec, "fast")


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
    check: bool = False  # compare a sample of the fast encoder's ids with the reference's


def _process(task: TokenizeTask) -> StagedUnit:
    """Read, parse, tokenize and stage one unit; raises InvalidInputError on bad input unless
    skipping. The tokenizer (native code, without the GIL) encodes on a thread while this one
    stages the batch before and reads and parses the next. In this process (one worker, the
    tokenizer's own thread pool on every core) two batches encode at once, so that pool never
    idles at the end of a batch; a worker process keeps to one, and so does this process when
    the tokenizer is told to use one thread (two encoding batches would then take two cores).
    With ``task.check``, a sample of each batch's documents is encoded again by the reference
    (:func:`lmdata.tokenize.encoders.pick`); a disagreement stops the unit, staging nothing
    more, and is handed back for the driver to act on."""
    unit = task.unit
    seq = done = 0
    batches = read_batches(
        unit, task.batch_docs, task.text_key, task.source_format, task.storage_options
    )
    depth = 1 if parallel.in_worker() or _one_tokenizer_thread() else 2
    encoding: deque[tuple[Future[tuple[np.ndarray, np.ndarray]], _Parsed]] = deque()
    check = _Check(task) if task.check else None
    with ThreadPoolExecutor(depth, thread_name_prefix="lmdata-encode") as pool:
        for batch in batches:
            parsed = _parse_batch(task, batch, done)
            done += len(batch.items)
            encoding.append((pool.submit(_encode, parsed.texts, task.special_tokens), parsed))
            if len(encoding) > depth:
                bad = _stage_batch(task, seq, *encoding.popleft(), check)
                if bad:
                    return StagedUnit(unit.file_index, unit.part, seq, bad)
                seq += 1
        while encoding:
            bad = _stage_batch(task, seq, *encoding.popleft(), check)
            if bad:
                return StagedUnit(unit.file_index, unit.part, seq, bad)
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


class _Check:
    """A unit's share of re-encoding by the reference (see encoders.pick)."""

    def __init__(self, task: TokenizeTask) -> None:
        self.task = task
        self.allowance = -1.0  # the unit's first batch checks one document
        self.docs_before = 0  # documents (items) of the unit before the current batch

    def __call__(self, seq: int, parsed: _Parsed, flat: np.ndarray, lengths: np.ndarray) -> str:
        """'' when the batch's sampled document agrees, else where and how it does not."""
        unit = self.task.unit
        before, self.docs_before = self.docs_before, self.docs_before + parsed.meta["read"]
        salt = (unit.file_index << 40) ^ (unit.part << 20) ^ seq
        j, self.allowance = pick(parsed.texts, self.allowance, salt)
        if j < 0:
            return ""
        ends = np.cumsum(lengths)
        ids = flat[ends[j] - lengths[j] : ends[j]]
        bad = check_one(_TOKENIZER, parsed.texts[j], ids, self.task.special_tokens)
        if bad is None:
            return ""
        item = j
        for k, _ in parsed.meta["skipped"]:  # in order: the items before it that were skipped
            item += k <= item
        where = "line" if parsed.meta["kind"] == "line" else "record"
        n = first_line(unit, self.task.storage_options) + before + item
        return bad.describe(f"{unit.path}, {where} {n}")


def _encode(texts: list[str], special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """(tokens of all ``texts`` as one uint32 array, each text's number of tokens)."""
    assert _TOKENIZER is not None
    encode_flat = getattr(_TOKENIZER, "encode_flat", None)
    if encode_flat is not None:  # the fast encoder: ids straight into one array
        return encode_flat(texts, special_tokens)
    ids = _TOKENIZER.encode_batch(texts, add_special_tokens=special_tokens) if texts else []
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.concatenate(ids) if ids else np.zeros(0, np.uint32)
    return flat, lengths


def _narrow(flat: np.ndarray) -> np.ndarray:
    """The ids as uint16 when every one fits (a vocabulary of up to 65,536: GPT-2's, Llama
    2's), else uint32: half the bytes to stage, read back and copy; the part records its
    dtype, and every sink takes either."""
    if flat.dtype.itemsize <= 2 or not flat.size:
        return flat
    if int(flat.max()) < 1 << 16:
        return flat.astype(np.uint16)
    return flat.astype(np.uint32, copy=False)


def _stage_batch(
    task: TokenizeTask,
    seq: int,
    encoded: Future[tuple[np.ndarray, np.ndarray]],
    parsed: _Parsed,
    check: _Check | None = None,
) -> str:
    """Stage one batch's part ('' ), or say where the check found a disagreement (nothing
    staged)."""
    flat, lengths = encoded.result()
    if check is not None:
        bad = check(seq, parsed, flat, lengths)
        if bad:
            return bad
    arrays = {
        "tokens": _narrow(flat),
        "lengths": lengths,
        "validation": np.array(parsed.validation, dtype=bool),
        "pending": np.array(parsed.pending, dtype=np.int64).reshape(-1, 2),
    }
    _stage(task.work, part_name(task.unit.file_index, task.unit.part, seq), arrays, parsed.meta)
    parallel.report(parsed.meta["read"])
    return ""


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
            text = None if isinstance(item, (_Missing, Unreadable)) else item
            if isinstance(item, Unreadable):
                problem = item.problem
            elif text is None:
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
        val.append(task.validation_file or (key is not None and is_validation(key, fraction)))
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
    work.write_part(name, pack_part(arrays, meta))


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
    encoder: str = "auto",
) -> Summary:
    """Tokenize the documents of ``sources`` into a ``job.to`` dataset at ``dst`` (a local
    path, or a URL written through the format's writer with ``storage_options``).

    ``engine`` is "inprocess", "processes" (``workers`` processes, default one per core) or
    "ray" (the cluster at ``address``, default a local one); plain JSONL files are cut into
    units of ``range_bytes`` (default: from the inputs' size, :func:`range_bytes_for`). The
    output is the same for every engine, worker count and range size. Sources may be URLs
    (files, folders, globs), read with ``source_options`` by the workers themselves;
    ``origins`` names the URLs of sources that are local copies. ``encoder`` ("auto", "fast",
    "hf") chooses what encodes (:mod:`lmdata.tokenize.encoders`): the ids, and so the tokens
    written, are the same for each.
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
    make_sink(job, tok)  # checks the EOD policy before any work
    if range_bytes is None:
        range_bytes = range_bytes_for(inputs)
    manifest = _manifest(job, inputs, range_bytes, source_options, origins)
    units = plan_units(inputs, range_bytes, job.source_format, source_options)
    if committed is not None:
        done = prepare(work, manifest, resume)
        if any((u.file_index, u.part) not in done for u in units) or work.manifest() != manifest:
            raise committed  # not this job's output: it is in the way
        return _committed(job, tok, inputs, work, str(dst), t0)
    first = _first_texts(job, inputs, work, units, source_options, encoder)
    choice = choose(job.tokenizer, encoder, job.special_tokens, first, tok)
    note(choice)
    if choice.tokenizer is not None:  # checked already: this process and its forks keep it
        _adopt(job.tokenizer, choice)
    run = _Run(job, tok, inputs, work, units, dst, overwrite, storage_options, source_options)
    try:
        summary = run(choice, manifest, resume, engine, workers, address, progress)
    except _Disagreement as e:  # auto: nothing of the fast run is kept; all again with hf
        if encoder == "fast":
            raise LmdataError(f"{e}; pass --encoder hf (or auto)") from None
        choice = Choice("hf", encoder, f"fast encoder not used: {e}")
        note(choice)
        summary = run(choice, manifest, False, engine, workers, address, progress)
    summary.seconds = time.perf_counter() - t0
    return summary


class _Disagreement(LmdataError):
    """A work unit's check found the fast encoder disagreeing with the reference (auto job)."""


@dataclass
class _Run:
    """One pass of a job over its units with one encoder (an auto job whose check fails during
    the job makes a second pass with the reference, from scratch)."""

    job: TokenizeJob
    tok: Any  # the reference tokenizer (the sink's: EOD, provenance)
    inputs: list[InputFile]
    work: Staging
    units: list[Unit]
    dst: Any
    overwrite: bool
    storage_options: dict[str, Any] | None
    source_options: dict[str, Any] | None

    def __call__(
        self,
        choice: Choice,
        manifest: bytes,
        resume: bool,
        engine: str,
        workers: int | None,
        address: str | None,
        progress: Callable[[dict[str, float]], None] | None,
    ) -> Summary:
        job, inputs, work, units = self.job, self.inputs, self.work, self.units
        sink_factory = make_sink(job, self.tok, choice.label)
        done = prepare(work, manifest, resume)
        todo = [u for u in units if (u.file_index, u.part) not in done]
        pool = make_executor(engine, workers, address, units=len(todo))
        local = [i.path for i in inputs if _in_this_process(i.path)]
        if local and not isinstance(pool, parallel.InProcess):
            raise InvalidInputError(
                "memory:// inputs live in this process and workers cannot read them; pass "
                "workers=0 (engine='inprocess'), or call lmdata.tokenize, which copies them",
                path=local[0],
            )
        summary = Summary(output=str(self.dst), encoder=choice.label)
        commit = Committer(job, inputs, work, summary, progress)
        # parts go into the output in input order as their units finish; the staged copies also
        # serve a later --resume, which replays the units already done before running the rest
        with options_scope(self.storage_options), claim_job(work.where, takeover=resume):
            commit.sink = sink_factory(self.dst, overwrite=self.overwrite)
        check = choice.encoder == "fast"
        try:
            for name in work.parts():
                commit.part(name, fresh=False)
            if len(todo) < len(units):  # the units done are a prefix: input read up to its end
                commit.read_up_to(units[len(units) - len(todo) - 1])
            tasks = (_task(job, inputs, work, u, self.source_options, check) for u in todo)
            results = pool.map_ordered(
                _process, tasks, initializer=_init_worker, initargs=(job.tokenizer, choice.encoder)
            )
            for unit, res in zip(todo, results, strict=True):
                if res.mismatch:
                    raise _Disagreement(res.mismatch)
                commit.unit(unit, res)
        except BaseException as e:
            commit.sink.abort()
            # kept for --resume after Ctrl-C, a dead worker, a full disk; never after the fast
            # encoder was found wrong (the units it did are redone by the reference)
            if not resumable(e) or isinstance(e, _Disagreement):
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
        return summary


def _committed(
    job: TokenizeJob, tok: Any, inputs: list[InputFile], work: Staging, out: str, t0: float
) -> Summary:
    """The summary of a job whose interrupted run had committed the output (every unit done,
    the output there) and was stopped before it removed its work: counted from the staged
    parts, which then go."""
    summary = Summary(output=out)
    commit = Committer(job, inputs, work, summary, None)
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


def _first_texts(
    job: TokenizeJob,
    inputs: list[InputFile],
    work: Staging,
    units: list[Unit],
    source_options: dict[str, Any] | None,
    encoder: str,
) -> list[str]:
    """The job's first documents (up to FIRST_DOCS, FIRST_CHARS characters), which the fast
    encoder must encode as the reference does before the job starts; none when the job will
    not try the fast encoder."""
    if encoder == "hf" or job.tokenizer == "bytes" or not units:
        return []
    task = replace(_task(job, inputs, work, units[0], source_options), skip_invalid=True)
    out: list[str] = []
    chars = 0
    batches = read_batches(task.unit, FIRST_DOCS, job.text_key, job.source_format, source_options)
    for batch in batches:
        for t in _parse_batch(task, batch, 0).texts:
            out.append(t[: FIRST_CHARS - chars])
            chars += len(out[-1])
            if len(out) >= FIRST_DOCS or chars >= FIRST_CHARS:
                return out
    return out


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
    check: bool = False,
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
        check=check,
    )
