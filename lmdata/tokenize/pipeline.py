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
no output, keeps the work folder, and ``resume=True`` skips the units already done. This
module is the driver's side; the workers' is :mod:`lmdata.tokenize.worker`.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from lmdata._progress import OnProgress, relabelled
from lmdata.errors import InvalidInputError, LmdataError, OutputExistsError
from lmdata.parallel import Executor, check_choice, executor_for
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
from lmdata.tokenize.commit import Committer
from lmdata.tokenize.encoders import FIRST_CHARS, FIRST_DOCS, Choice, choose, note
from lmdata.tokenize.fast import preload
from lmdata.tokenize.job import Summary, TokenizeJob
from lmdata.tokenize.sinks import EodSink, make_sink, resolve_eod
from lmdata.tokenize.sources import (
    TAIL_RANGES,
    TAIL_SMALLEST,
    InputFile,
    Unit,
    input_versions,
    list_inputs,
    plan_units,
    range_bytes_for,
    read_batches,
)
from lmdata.tokenize.tokenizers import load_tokenizer
from lmdata.tokenize.worker import TokenizeTask, _adopt, _init_worker, _parse_batch, _process

__all__ = ["Summary", "TokenizeJob", "tokenize", "work_dir_for"]


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
    executor: Executor | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: OnProgress | None = None,
    storage_options: dict[str, Any] | None = None,
    range_bytes: int | None = None,
    source_options: dict[str, Any] | None = None,
    origins: dict[str, str] | None = None,
    encoder: str = "auto",
) -> Summary:
    """Tokenize the documents of ``sources`` into a ``job.to`` dataset at ``dst`` (a local
    path, or a URL written through the format's writer with ``storage_options``).

    ``engine`` is "inprocess", "processes" (``workers`` processes, default one per core) or
    "ray" (the cluster at ``address``, default a local one), or ``executor`` runs the units
    (an :class:`lmdata.parallel.Executor` of the caller's); plain JSONL files are cut into
    units of ``range_bytes`` (default: from the inputs' size, :func:`range_bytes_for`). The
    output is the same for every engine, worker count and range size. Sources may be URLs
    (files, folders, globs), read with ``source_options`` by the workers themselves;
    ``origins`` names the URLs of sources that are local copies. ``encoder`` ("auto", "fast",
    "hf") chooses what encodes (:mod:`lmdata.tokenize.encoders`): the ids, and so the tokens
    written, are the same for each. ``progress`` receives events of the phase "tokenize" as
    units are committed: the input bytes read (with their total), documents and tokens.
    """
    check_choice(executor, engine, workers, address)
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
    # the fast encoder parses the file on a thread while the reference does here (both without
    # the GIL); it is waited for before anything forks
    pre = preload(job.tokenizer) if encoder in ("auto", "fast") and committed is None else None
    try:
        tok = load_tokenizer(job.tokenizer)  # fail early on a bad tokenizer, in the parent
        make_sink(job, tok)  # checks the EOD policy before any work
        if range_bytes is None:
            range_bytes = range_bytes_for(inputs)
        manifest = _manifest(job, inputs, range_bytes, source_options, origins)
        units = plan_units(inputs, range_bytes, job.source_format, source_options)
        if committed is not None:
            done = prepare(work, manifest, resume)
            if any((u.file_index, u.part) not in done for u in units) or (
                work.manifest() != manifest
            ):
                raise committed  # not this job's output: it is in the way
            return _committed(job, tok, inputs, work, str(dst), t0)
        first = _first_texts(job, inputs, work, units, source_options, encoder)
        choice = choose(job.tokenizer, encoder, job.special_tokens, first, tok, pre)
    finally:
        if pre is not None:
            pre.wait()
    note(choice)
    if choice.tokenizer is not None:  # checked already: this process and its forks keep it
        _adopt(job.tokenizer, choice)
    run = _Run(job, tok, inputs, work, units, dst, overwrite, storage_options, source_options)
    try:
        summary = run(choice, manifest, resume, (executor, engine, workers, address), progress)
    except _Disagreement as e:  # auto: nothing of the fast run is kept; all again with hf
        if encoder == "fast":
            raise LmdataError(f"{e}; pass --encoder hf (or auto)") from None
        choice = Choice("hf", encoder, f"fast encoder not used: {e}")
        note(choice)
        again = relabelled(progress, "tokenize: again with hf")  # a phase of its own from 0
        summary = run(choice, manifest, False, (executor, engine, workers, address), again)
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
        where: tuple[Executor | None, str, int | None, str | None],
        progress: OnProgress | None,
    ) -> Summary:
        job, inputs, work, units = self.job, self.inputs, self.work, self.units
        sink_factory = make_sink(job, self.tok, choice.label)
        done = prepare(work, manifest, resume)
        todo = [u for u in units if (u.file_index, u.part) not in done]
        pool = executor_for(*where, units=len(todo))
        local = [i.path for i in inputs if _in_this_process(i.path)]
        if local and not pool.in_process:
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
