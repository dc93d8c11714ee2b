"""Documents -> tokens, in parallel, deterministically, resumably, losing nothing.

The job runs in two phases:

1. Units (batches of documents of one input file) go to worker processes, which parse,
   tokenize and return token arrays.
2. Results arrive in input order; each is staged in a hidden work folder beside the output
   (one file per unit; an input file is marked done when all its units are) and written
   through the target format's writer, which produces the output atomically at the end.
   ``resume`` replays the staged units of finished files, then tokenizes the rest.

The output bytes therefore depend only on the inputs and options, never on the number of
workers; an interrupted job (Ctrl-C, a kill) leaves no output, keeps the work folder, and
``resume=True`` skips the input files already done.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from lmdata.errors import InvalidInputError, LmdataError
from lmdata.parallel import make_executor
from lmdata.storage import check_dest, is_url, options_scope
from lmdata.tokenize.job import Summary, TokenizeJob
from lmdata.tokenize.sinks import make_sink
from lmdata.tokenize.sources import InputFile, Unit, _Missing, iter_units, list_inputs
from lmdata.tokenize.tokenizers import Tokenizer, load_tokenizer

MAX_SKIP_MESSAGES = 20

__all__ = ["Summary", "TokenizeJob", "tokenize", "work_dir_for"]


# ---- the worker side -------------------------------------------------------------------------

_TOKENIZER: Tokenizer | None = None


def _init_worker(spec: str) -> None:
    global _TOKENIZER
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core per worker process
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _TOKENIZER = load_tokenizer(spec)


def _is_validation(key: str, fraction: float) -> bool:
    return (
        fraction > 0
        and (zlib.crc32(key.encode("utf-8", "surrogatepass")) % 1_000_000) < fraction * 1_000_000
    )


@dataclass(frozen=True)
class TokenizeTask:
    """One unit of documents and what the worker needs to know to tokenize it."""

    unit: Unit
    path: str
    text_key: str
    skip_invalid: bool
    validation_fraction: float
    validation_file: bool  # every document of the file goes to the validation split
    special_tokens: bool


@dataclass(frozen=True)
class TokenizeResult:
    """One unit's tokens, in document order, and its counts."""

    file: int
    part: int
    position: int  # bytes of the input file consumed after this unit (-1: all of it)
    tokens: np.ndarray
    lengths: np.ndarray
    validation: np.ndarray
    read: int
    skipped: tuple[str, ...]
    bytes: int

    def meta(self) -> dict[str, Any]:
        return {"read": self.read, "skipped": list(self.skipped), "bytes": self.bytes}


def _process(task: TokenizeTask) -> TokenizeResult:
    """Parse and tokenize one unit; raises InvalidInputError on bad input unless skipping."""
    unit, path, text_key = task.unit, task.path, task.text_key
    skip_invalid, fraction, val_file = (
        task.skip_invalid,
        task.validation_fraction,
        task.validation_file,
    )
    special = task.special_tokens
    assert _TOKENIZER is not None
    texts: list[str] = []
    keys: list[str] = []
    skipped: list[str] = []
    name = os.path.basename(path)
    for j, item in enumerate(unit.items):
        line = unit.first_line + j
        problem = None
        text = None
        key = f"{name}:{line}"
        if unit.kind == "lines":
            try:
                obj = orjson.loads(item)
            except orjson.JSONDecodeError as e:
                problem = f"malformed JSON ({e})"
            else:
                if not isinstance(obj, dict):
                    problem = "the line is not a JSON object"
                elif text_key not in obj:
                    problem = f"no {text_key!r} field (pass --text-key)"
                else:
                    text = obj[text_key]
                    if isinstance(obj.get("id"), (str, int)):
                        key = f"id:{obj['id']}"
        else:
            text = None if isinstance(item, _Missing) else item
            if text is None:
                problem = f"no {text_key!r} field (pass --text-key)"
        if problem is None and not isinstance(text, str):
            problem = f"field {text_key!r} is {type(text).__name__}, not a string"
        if problem is not None:
            where = f"line {line}" if unit.kind == "lines" else f"record {line}"
            if not skip_invalid:
                raise InvalidInputError(
                    f"{problem}; fix it or pass --skip-invalid to skip such documents",
                    path=path,
                    position=where,
                )
            skipped.append(f"{path}: {where}: {problem}")
            continue
        texts.append(text)  # type: ignore[arg-type]
        keys.append(key)
    ids = _TOKENIZER.encode_batch(texts, add_special_tokens=special) if texts else []
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.concatenate(ids).astype(np.uint32) if ids else np.zeros(0, np.uint32)
    val = np.array([val_file or _is_validation(k, fraction) for k in keys], dtype=bool)
    return TokenizeResult(
        file=unit.file_index,
        part=unit.part,
        position=unit.position,
        tokens=flat,
        lengths=lengths,
        validation=val,
        read=len(unit.items),
        skipped=tuple(skipped),
        bytes=sum(len(x) for x in unit.items if isinstance(x, (bytes, str))),
    )


# ---- the work folder -------------------------------------------------------------------------


def work_dir_for(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.lmdata-work"


def _url_work_dir(url: str) -> Path:
    """The local work folder of an output URL (one per URL, so --resume finds it)."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"lmdata-work-{digest}"


def _manifest(job: TokenizeJob, inputs: list[InputFile]) -> bytes:
    files = [{**asdict(i), "mtime": int(os.stat(i.path).st_mtime)} for i in inputs]
    return orjson.dumps({"job": asdict(job), "inputs": files}, option=orjson.OPT_SORT_KEYS)


def _prepare_work(work: Path, manifest: bytes, resume: bool) -> set[int]:
    """Create (or, resuming, check and clean) the work folder; return the files already done."""
    if work.exists() and resume:
        if (work / "manifest.json").read_bytes() != manifest:
            raise InvalidInputError(
                "cannot resume: the inputs or options differ from the interrupted job's; run "
                f"again without --resume (which discards {work})",
                path=work,
            )
        done = {int(f.name) for f in (work / "done").iterdir()}
        for f in (work / "parts").iterdir():  # partial files are redone from their start
            if f.name.startswith(".") or int(f.name.split("-")[0]) not in done:
                f.unlink()
        return done
    if work.exists():
        shutil.rmtree(work)
    (work / "parts").mkdir(parents=True)
    (work / "done").mkdir()
    (work / "manifest.json").write_bytes(manifest)
    return set()


def _stage(work: Path, res: TokenizeResult) -> None:
    name = f"{res.file:06d}-{res.part:06d}"
    tmp = work / "parts" / f".{name}.tmp.npz"
    with open(tmp, "wb") as fh:
        np.savez(
            fh,
            tokens=res.tokens,
            lengths=res.lengths,
            validation=res.validation,
            meta=np.frombuffer(orjson.dumps(res.meta()), dtype=np.uint8),
        )
    os.replace(tmp, work / "parts" / f"{name}.npz")


def _mark_done(work: Path, file_index: int) -> None:
    (work / "done" / f"{file_index:06d}").touch()


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
) -> Summary:
    """Tokenize the documents of ``sources`` into a ``job.to`` dataset at ``dst`` (a local
    path, or a URL written through the format's writer with ``storage_options``).

    ``engine`` is "inprocess", "processes" (``workers`` processes, default one per core) or
    "ray" (the cluster at ``address``, default a local one); the output is the same for all.
    """
    pool = make_executor(engine, workers, address)
    t0 = time.perf_counter()
    out = check_dest(dst, overwrite, storage_options)
    url = is_url(out)  # the work folder stays local: a temp folder named after the URL
    dst = out if url else Path(out)  # type: ignore[assignment]
    inputs = list_inputs(list(sources), job.source_format)
    if validation_sources:
        inputs += [
            InputFile(i.path, i.kind, i.size, True)
            for i in list_inputs(list(validation_sources), job.source_format)
        ]
    if validation_sources and "validation" not in job.spec.splits:
        raise InvalidInputError(
            f"{job.to} has no validation split; tokenize the validation documents into a "
            "separate output instead of --validation"
        )
    if resume and not url:  # a killed run's half-written output (never a dataset) goes away
        for stale in dst.parent.glob(f".lmdata-tmp-{dst.name}-*"):
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    tok = load_tokenizer(job.tokenizer)  # fail early on a bad tokenizer, in the parent
    sink_factory = make_sink(job, tok)  # checks the EOD policy before any work
    work = _url_work_dir(out) if url else work_dir_for(dst)
    done = _prepare_work(work, _manifest(job, inputs), resume)
    summary = Summary(output=str(dst))
    # results go into the output as they arrive (in input order); the staged copies only serve
    # a later --resume, which replays the files already done before tokenizing the rest
    with options_scope(storage_options):
        sink = sink_factory(dst, overwrite=overwrite)
    try:
        for f in sorted((work / "parts").glob("*.npz")):
            with np.load(f) as z:
                _consume(
                    sink,
                    z["tokens"],
                    z["lengths"],
                    z["validation"],
                    orjson.loads(z["meta"].tobytes()),
                    summary,
                )
        _run_workers(inputs, job, work, done, pool, progress, summary, sink)
    except BaseException as e:
        sink.abort()
        if not isinstance(e, KeyboardInterrupt):
            shutil.rmtree(work, ignore_errors=True)
        raise
    if summary.documents_read != summary.documents_written + summary.documents_skipped:
        sink.abort()  # an internal invariant: never drop a document silently
        raise LmdataError(
            f"internal error: read {summary.documents_read} documents but wrote "
            f"{summary.documents_written} and skipped {summary.documents_skipped}"
        )
    sink.close()
    shutil.rmtree(work, ignore_errors=True)
    summary.seconds = time.perf_counter() - t0
    return summary


def _run_workers(
    inputs: list[InputFile],
    job: TokenizeJob,
    work: Path,
    done: set[int],
    pool: Any,
    progress: Callable[[dict[str, float]], None] | None,
    summary: Summary,
    sink: Any,
) -> None:
    units = iter_units(
        inputs,
        job.batch_docs,
        text_key=job.text_key,
        skip_files=frozenset(done),
        fmt=job.source_format,
    )
    special = job.add_special_tokens
    if special is None:  # the target's convention
        special = job.target.special_tokens
    tasks = (
        TokenizeTask(
            unit=u,
            path=inputs[u.file_index].path,
            text_key=job.text_key,
            skip_invalid=job.skip_invalid,
            validation_fraction=job.validation_fraction,
            validation_file=inputs[u.file_index].validation,
            special_tokens=special,
        )
        for u in units
    )
    # "input_bytes" is how far the job has read its inputs (compressed sizes), for the ETA
    base = np.concatenate([[0], np.cumsum([i.size for i in inputs])]).tolist()
    stats = {
        "documents": 0.0,
        "tokens": 0.0,
        "bytes": 0.0,
        "total_bytes": float(base[-1]),
        "input_bytes": float(sum(inputs[i].size for i in done)),
    }
    current = None

    def handle(res: TokenizeResult) -> None:
        nonlocal current
        if current is not None and res.file != current:
            _mark_done(work, current)
        current = res.file
        _stage(work, res)
        _consume(sink, res.tokens, res.lengths, res.validation, res.meta(), summary)
        stats["documents"] += res.read
        stats["tokens"] += len(res.tokens)
        stats["bytes"] += res.bytes
        pos = res.position
        fi = res.file
        # finished files are always a prefix of the inputs (results arrive in order)
        stats["input_bytes"] = base[fi] + (inputs[fi].size if pos < 0 else pos)
        if progress is not None:
            progress(stats)

    for res in pool.map_ordered(
        _process, tasks, initializer=_init_worker, initargs=(job.tokenizer,)
    ):
        handle(res)
    if current is not None:
        _mark_done(work, current)


def _consume(
    sink: Any,
    tokens: np.ndarray,
    lengths: np.ndarray,
    val: np.ndarray,
    meta: dict[str, Any],
    summary: Summary,
) -> None:
    """Write one unit's documents and count them."""
    summary.documents_read += meta["read"]
    summary.documents_skipped += len(meta["skipped"])
    summary.bytes_read += meta["bytes"]
    room = MAX_SKIP_MESSAGES - len(summary.skipped)
    summary.skipped.extend(meta["skipped"][: max(room, 0)])
    summary.tokens += sink.write_many(tokens, lengths, val)
    summary.documents_written += len(lengths)
