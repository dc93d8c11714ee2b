"""``convert``: any reader into any writer, losslessly or with an error naming the field.

Records go to record formats as they are (the target's writer infers what it needs, such as
MDS columns, from the records themselves); token sequences go to token formats as stored (a
format's fixed splits are kept when the target has them too). Source blocks are read by worker
processes in parallel, staged by them beside the output (token blocks as arrays, record blocks
through ``lmdata.parallel.records``), and committed in order, atomically.

Resume follows tokenize: a block is marked done once the writer took it, and its staged part
stays until the output is committed, so an interrupted job (Ctrl-C, a kill, an error that is
not the data's) leaves no output and keeps the staging area; ``resume=True`` checks the job's
manifest (source, its size and version, splits, target, options, block size), replays the
blocks done into a new writer and reads only the rest. The bytes are an uninterrupted run's.
"""

from __future__ import annotations

import io
import json
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdata import _provenance, formats
from lmdata._api import open as open_dataset
from lmdata._api import provenance as recorded
from lmdata._api import writer as open_writer
from lmdata._options import checked
from lmdata._progress import OnProgress, Ticker
from lmdata._version import __version__
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.parallel import Executor, check_choice, executor_for
from lmdata.parallel import records as record_codec
from lmdata.parallel.staging import (
    Staging,
    prepare,
    resumable,
    staging_for,
    tree_version,
    unit_key,
)
from lmdata.protocols import is_token_reader
from lmdata.storage import check_dest, is_url, options_scope
from lmdata.storage.claims import claim_job
from lmdata.storage.paths import remove_staged


@dataclass
class ConvertSummary:
    records: int = 0
    seconds: float = 0.0
    output: str = ""
    resumed: int = 0  # records replayed from an interrupted job's staged blocks

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds else 0.0
        again = f", {self.resumed:,} of them from the interrupted job" if self.resumed else ""
        return (
            f"converted {self.records:,} records in {self.seconds:.1f} s ({rate:,.0f}/s{again}) "
            f"-> {self.output}"
        )


# ---- parallel block reading ------------------------------------------------------------------

_READER: Any = None


def _init(reader: Any) -> None:
    global _READER
    _READER = reader


@dataclass(frozen=True)
class Block:
    """Records ``lo`` up to (not including) ``hi`` of the source reader; with ``staging``, the
    worker stages the block there as part ``name`` instead of returning it, so neither tokens
    nor records cross the executor."""

    lo: int
    hi: int
    staging: Staging | None = None
    name: str = ""
    tokens: bool = False  # token sequences (staged as arrays) or records


@dataclass(frozen=True)
class StagedBlock:
    """A block a worker staged: its part's name, how many records it holds, and whether they
    are token sequences."""

    name: str
    records: int
    tokens: bool = True


def _read_block(block: Block) -> list[Any] | StagedBlock:
    recs = _READER.take(list(range(block.lo, block.hi)))
    if block.staging is None:
        return recs  # type: ignore[no-any-return]
    if not block.tokens:
        try:
            data = record_codec.pack(recs)
        except TypeError:  # a value staging cannot hold exactly: the block goes as it is
            return recs  # type: ignore[no-any-return]
        block.staging.write_part(block.name, data)
        return StagedBlock(block.name, len(recs), tokens=False)
    lengths = np.fromiter((len(t) for t in recs), dtype=np.int64, count=len(recs))
    flat = np.concatenate(recs) if recs else np.zeros(0, dtype=np.uint32)
    buf = io.BytesIO()
    np.savez(buf, tokens=flat, lengths=lengths)
    block.staging.write_part(block.name, buf.getvalue())
    return StagedBlock(block.name, len(recs))


def _unstage(staging: Staging, staged: StagedBlock) -> list[Any]:
    """A staged block's records, or its sequences (views of one array). The part stays until
    the output is committed: a resumed job replays it."""
    data = staging.read_part(staged.name)
    if not staged.tokens:
        return record_codec.unpack(data, f"{staging.where}/parts/{staged.name}")
    with np.load(io.BytesIO(data)) as z:
        tokens, lengths = z["tokens"], z["lengths"]
    return np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []


BLOCK = 512  # records per unit


def _n_blocks(reader: Any) -> int:
    return max(1, -(-len(reader) // BLOCK))


def _blocks(
    reader: Any,
    pool: Executor,
    staging: Staging | None,
    split: int,
    tokens: bool,
    done: set[tuple[int, int]],
) -> Iterator[tuple[int, list[Any], bool]]:
    """The reader's records in blocks, in order: (block number, its records, whether this job
    staged it). Blocks ``done`` (split, block) by an interrupted job are replayed from
    ``staging``; the rest are read by ``pool``'s workers (staged, with ``staging``)."""
    n = len(reader)
    ext = "npz" if tokens else "rec"
    units = [
        Block(
            lo, min(n, lo + BLOCK), staging, f"{split:06d}-{lo // BLOCK:06d}-000000.{ext}", tokens
        )
        for lo in range(0, n, BLOCK)
    ] or [Block(0, 0)]
    todo = [u for k, u in enumerate(units) if (split, k) not in done]
    results: Iterator[Any] = iter(())
    if todo:
        results = pool.map_ordered(_read_block, todo, initializer=_init, initargs=(reader,))
    try:
        for k, unit in enumerate(units):
            if (split, k) in done:
                assert staging is not None
                yield k, _unstage(staging, StagedBlock(unit.name, unit.hi - unit.lo, tokens)), False
                continue
            res = next(results)
            if isinstance(res, StagedBlock):
                assert staging is not None
                yield k, _unstage(staging, res), True
            else:
                yield k, res, False
    finally:
        close = getattr(results, "close", None)
        if close is not None:  # stops the workers of a job that ends early
            close()
        _init(None)  # in-process: no reference to the reader outlives the job


@checked("lmdata.convert", hide=("to",))
def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    format: str | None = None,
    *,
    source_format: str | None = None,
    split: str | None = None,
    workers: int | None = None,
    engine: str = "processes",
    address: str | None = None,
    executor: Executor | None = None,
    overwrite: bool = False,
    writer_options: dict[str, Any] | None = None,
    reader_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
    storage_options: dict[str, Any] | None = None,
    resume: bool = False,
    to: str | None = None,
) -> ConvertSummary:
    """Convert the dataset at ``src`` into ``format`` at ``dst`` (``to=`` is its old name:
    deprecated).

    Records go to record formats as they are; token sequences go to token formats, or to
    record formats as ``{"tokens": ids}`` (read them back with ``token_column="tokens"``).
    The tokenizer the source records (``lmdata.info``) is recorded in the output where the
    format has room for it, so ``cat --decode`` and the model's vocabulary still find it.
    ``reader_options`` go to the source's reader (``token_column=`` gives the token view of a
    records source). ``engine`` ("inprocess", "processes", "ray" at ``address``) and
    ``workers`` choose where source blocks are read, or ``executor`` (an
    ``lmdata.parallel.Executor`` of the caller's) reads them; the output is the same for
    all. ``progress`` receives ``lmdata.Progress`` events of the phase "convert": the
    records written, of the source's total.
    ``storage_options`` go to the stores of URLs (``src`` and ``dst`` alike); an output URL is
    written through the target format's writer, which commits it metadata-last.

    Blocks read by workers are staged beside the output (``work_area``) until it is
    committed; an interrupted job keeps them, and ``resume=True`` (the same source, unchanged,
    and options) reads only the blocks not done, with the same output bytes. A job running in
    this process (``workers`` 0 or 1, or one block) stages only with ``resume=True``, so pass
    it from the first run to make such a job resumable.
    """
    if to is not None:
        warnings.warn(
            "lmdata.convert(to=) is deprecated and goes in lmdata 0.3; pass format=",
            DeprecationWarning,
            stacklevel=3,
        )
        if format is not None and format != to:
            raise InvalidInputError(f"to={to!r} and format={format!r}: give the format once")
    target = format or to
    if target is None:
        raise InvalidInputError("convert needs the target format: format= (--to)")
    check_choice(executor, engine, workers, address)
    with options_scope(storage_options):
        return _convert(
            src,
            dst,
            target,
            source_format,
            split,
            (executor, engine, workers, address),
            overwrite,
            writer_options,
            reader_options,
            progress,
            resume,
        )


def work_area(
    dst: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> Staging:
    """Where convert stages the blocks of output ``dst`` (``.NAME.lmdata-convert`` beside it):
    an interrupted job keeps it for ``resume``."""
    return staging_for(dst, storage_options, "convert")


def _manifest(
    src: Any,
    source: formats.FormatSpec,
    splits: list[str | None],
    reader_options: dict[str, Any] | None,
    target: formats.FormatSpec,
    opts: dict[str, Any],
) -> bytes:
    """What ``resume`` must find unchanged: the source (by path or URL, size and version), how
    it is read, the target and its options, the block size, and lmdata's version."""
    job = {
        "source": os.fspath(src) if is_url(src) else os.path.abspath(src),
        "source_format": source.name,
        "splits": splits,
        "reader_options": reader_options or {},
        "to": target.name,
        "writer_options": opts,
        "block": BLOCK,
        "lmdata": __version__,
    }
    manifest = {"job": job, "source": tree_version(src)}
    return json.dumps(manifest, sort_keys=True, default=repr).encode()


def _convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    to: str,
    source_format: str | None,
    split: str | None,
    where: tuple[Executor | None, str, int | None, str | None],
    overwrite: bool,
    writer_options: dict[str, Any] | None,
    reader_options: dict[str, Any] | None,
    progress: OnProgress | None,
    resume: bool,
) -> ConvertSummary:
    t0 = time.perf_counter()
    target = formats.spec(to)
    if target.kind == "tokens":  # a records target's writer checks its own options
        formats.check_writer_options(target, writer_options or {}, "lmdata.convert")
    # the output's claim names the job: a resume takes over the claim a killed run left
    with claim_job(work_area(dst).where, takeover=resume):
        try:
            dst, committed = check_dest(dst, overwrite), None
        except OutputExistsError as e:
            if not (resume and work_area(dst).exists()):
                raise
            # a run killed after its commit, before it removed its staging: see below
            dst, committed = check_dest(dst, True), e
    opts = dict(writer_options or {})
    summary = ConvertSummary(output=str(dst))
    source = formats.spec(source_format) if source_format else formats.spec(formats.detect(src))
    src_splits: list[str | None] = [split]
    if split is None and len(source.splits) > 1:
        if not set(source.splits) <= set(target.splits):
            raise InvalidInputError(
                f"{source.name} has the splits {', '.join(source.splits)} and {target.name} "
                f"has not: pass --split {source.splits[0]} (and convert the others into "
                "separate outputs)"
            )
        src_splits = list(source.splits)  # keep every split
    readers = [
        open_dataset(src, format=source.name, split=s, **(reader_options or {})) for s in src_splits
    ]
    try:
        units = sum(_n_blocks(r) for r in readers)
        job = (src, source, src_splits, reader_options, target, opts)
        if committed is not None:  # done if every block of this job is, else in the way
            staging = work_area(dst)
            if staging.manifest() != _manifest(*job) or len(staging.done()) < units:
                raise committed
            staging.clear()
            summary.records = summary.resumed = sum(len(r) for r in readers)
            summary.seconds = time.perf_counter() - t0
            return summary
        staging, done = _resume(dst, _manifest(*job)) if resume else (None, set())
        pool = executor_for(*where, units=units - len(done))
        if staging is None and not pool.in_process:
            # blocks read by workers are staged beside the output and committed from there; a
            # new job empties what a killed one left
            staging = work_area(dst)
            prepare(staging, _manifest(*job), False, "convert")
        with claim_job(work_area(dst).where, takeover=resume):
            summary.records = _copy(
                src,
                dst,
                target,
                list(zip(src_splits, readers, strict=True)),
                pool,
                overwrite,
                opts,
                progress,
                staging,
                done,
                summary,
            )
    finally:
        for r in readers:
            r.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def _resume(dst: str, manifest: bytes) -> tuple[Staging, set[tuple[int, int]]]:
    """The staging area of a resumed job and its blocks done (split, block) whose parts are
    there; a new area if there is none. Stages even in this process, so that a later resume
    has blocks to replay."""
    if not is_url(dst):  # a killed writer's half-written output (never a dataset) goes
        remove_staged(dst)
    staging = work_area(dst)
    done = prepare(staging, manifest, True, "convert")
    return staging, done & {unit_key(n) for n in staging.parts() if not n.startswith(".")}


def _copy(
    src: Any,
    dst: Any,
    target: formats.FormatSpec,
    sources: list[tuple[str | None, Any]],
    pool: Executor,
    overwrite: bool,
    opts: dict[str, Any],
    progress: OnProgress | None,
    staging: Staging | None,
    done: set[tuple[int, int]],
    summary: ConvertSummary,
) -> int:
    """Every record of ``sources`` (split, reader) into a new ``target`` dataset at ``dst``;
    returns the number of records. Blocks ``done`` are replayed from ``staging``; at an
    interruption the staging area is kept if a resume could use it, else removed."""
    marked = len(done)  # blocks done: what a resume would not read again
    tokens = all(is_token_reader(r) for _, r in sources)
    readers = [r for _, r in sources]
    if target.provenance is not None and "provenance" not in opts:
        kept = _provenance.carried(recorded(readers[0]))  # the tokenizer that made the ids
        if kept is not None:
            opts = {**opts, "provenance": kept}
    try:
        out = _open_output(src, dst, target, readers, tokens, overwrite, opts)
    except BaseException:
        if staging is not None and not marked:
            staging.clear()
        raise
    records = 0
    closing = False
    tick = Ticker(progress, sum(len(r) for _, r in sources), "convert", "records")
    try:
        for i, (s, reader) in enumerate(sources):
            for k, block, fresh in _blocks(reader, pool, staging, i, tokens, done):
                first = records
                try:
                    if target.kind == "tokens":  # one call per block: the error names it
                        _write_tokens(out, block, s if s in target.splits else "train")
                        records += len(block)
                    else:
                        for rec in block:
                            out.write({"tokens": rec} if tokens else rec)
                            records += 1
                except InvalidInputError as e:
                    last = first + len(block) - 1
                    where = f"records {first}-{last}" if target.kind == "tokens" else ""
                    where = where or f"record {records}"
                    split_name = f"{s} " if s else ""
                    raise InvalidInputError(f"{src}: {split_name}{where}: {e}") from None
                if fresh:  # the writer has it: a resumed job replays it
                    assert staging is not None
                    staging.mark_done(i, k)
                    marked += 1
                elif (i, k) in done:
                    summary.resumed += len(block)
                tick.to(records)
        closing = True
        out.close()  # the output is committed: the staged blocks are of no more use
    except BaseException as e:
        if not closing:
            out.abort()
        if staging is not None and not (marked and resumable(e)):
            staging.clear()
        raise
    if staging is not None:
        staging.clear()
    return records


def _open_output(
    src: Any,
    dst: Any,
    target: formats.FormatSpec,
    readers: list[Any],
    tokens: bool,
    overwrite: bool,
    opts: dict[str, Any],
) -> Any:
    """The target's token sink or record writer at ``dst``."""
    if target.kind != "tokens":
        return open_writer(dst, target.name, overwrite=overwrite, **opts)
    if not tokens:
        raise InvalidInputError(
            f"{target.name} stores token sequences and {src} holds records; use `lmdata "
            "tokenize` to turn documents into tokens, or token_column= (--token-column) "
            "for a records dataset whose column holds token ids"
        )
    assert target.tokens is not None
    return target.tokens.open(
        dst, overwrite=overwrite, vocab_size=_vocab_size(readers), options=opts
    )


def _vocab_size(readers: list[Any]) -> int:
    """The vocabulary the output must hold: one past the largest id of any split read (a
    later split may use ids the first does not)."""
    return max(max((int(r.max_token_id) for r in readers), default=0) + 1, 1)


def _write_tokens(sink: Any, block: list[Any], split: str) -> None:
    lengths = np.fromiter((len(t) for t in block), dtype=np.int64, count=len(block))
    flat = np.concatenate(block) if block else np.zeros(0, dtype=np.uint32)
    sink.write_many(flat, lengths, split)
