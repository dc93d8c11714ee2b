"""A tokenize job's worker side: read a unit, parse its documents, encode them and stage the
tokens in the job's work folder, one part per batch (:func:`_process`, which the executor runs;
:mod:`lmdata.tokenize.pipeline` is the driver's side).

The reference encoder (native code, without the GIL) encodes one batch on a thread while this
thread stages the batch before and reads and parses the next; the fast encoder, whose calls
hold the GIL, encodes on this thread (a worker process is the unit of parallelism), and a
deterministic sample of the unit's documents is encoded again by the reference and compared
(:mod:`lmdata.tokenize.encoders`).
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from lmdata import parallel
from lmdata.errors import InvalidInputError
from lmdata.parallel.staging import Staging
from lmdata.tokenize.commit import StagedUnit, is_validation, pack_part, part_name
from lmdata.tokenize.encoders import Choice, check_one, load_encoder, pick
from lmdata.tokenize.sources import Batch, Unit, Unreadable, _Missing, first_line, read_batches

# ---- the worker's state -------------------------------------------------------------------------

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
    skipping. The reference tokenizer (native code, without the GIL) encodes on a thread while
    this one stages the batch before and reads and parses the next (the fast encoder encodes
    here: see :func:`_encoder_pool`). In this process (one worker, the
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
    with _encoder_pool(depth) as pool:
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


def _encoder_pool(depth: int) -> Any:
    """Where batches encode: a pool of ``depth`` threads, or this thread for the fast encoder,
    whose per-document calls hold the GIL (gigatoken's GIL-free batch calls cost 1.4-2.5x the
    CPU): a thread of its own would only take turns with this one."""
    if getattr(_TOKENIZER, "encode_flat", None) is not None:
        return _Inline()
    return ThreadPoolExecutor(depth, thread_name_prefix="lmdata-encode")


class _Inline:
    """An executor that runs each call at once, on the calling thread."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as e:
            done.set_exception(e)
        return done


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


def _stage(work: Staging, name: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write one staged part whole (a retried task may write the same part again)."""
    work.write_part(name, pack_part(arrays, meta))
