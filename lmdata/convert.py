"""``convert``: any reader into any writer, losslessly or with an error naming the field.

Records go to record formats as they are (the target's writer infers what it needs, such as
MDS columns, from the records themselves); token sequences go to token formats as stored (a
format's fixed splits are kept when the target has them too). Source blocks are read by worker
processes in parallel, staged by them beside the output (token blocks as arrays, record blocks
through :mod:`lmdata.parallel.records`), and committed in order, atomically.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdata import formats
from lmdata._api import open as open_dataset
from lmdata._api import writer as open_writer
from lmdata.errors import InvalidInputError
from lmdata.parallel import Executor, InProcess, make_executor
from lmdata.parallel import records as record_codec
from lmdata.parallel.staging import Staging, staging_for
from lmdata.protocols import is_token_reader
from lmdata.storage import check_dest, options_scope


@dataclass
class ConvertSummary:
    records: int = 0
    seconds: float = 0.0
    output: str = ""

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds else 0.0
        return (
            f"converted {self.records:,} records in {self.seconds:.1f} s ({rate:,.0f}/s) "
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
    """A staged block's records, or its sequences (views of one array); its part removed once
    read."""
    data = staging.read_part(staged.name)
    if not staged.tokens:
        recs = record_codec.unpack(data, f"{staging.where}/parts/{staged.name}")
        staging.remove_part(staged.name)
        return recs
    with np.load(io.BytesIO(data)) as z:
        tokens, lengths = z["tokens"], z["lengths"]
    staging.remove_part(staged.name)
    return np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []


BLOCK = 512  # records per unit


def _n_blocks(reader: Any) -> int:
    return max(1, -(-len(reader) // BLOCK))


def _blocks(
    reader: Any, pool: Executor, staging: Staging | None, split: int, tokens: bool
) -> Iterator[list[Any]]:
    """The reader's records in blocks, read by ``pool``'s workers (staged, with ``staging``)."""
    n = len(reader)
    ext = "npz" if tokens else "rec"
    units = [
        Block(
            lo, min(n, lo + BLOCK), staging, f"{split:06d}-{lo // BLOCK:06d}-000000.{ext}", tokens
        )
        for lo in range(0, n, BLOCK)
    ] or [Block(0, 0)]
    try:
        for res in pool.map_ordered(_read_block, units, initializer=_init, initargs=(reader,)):
            yield _unstage(staging, res) if isinstance(res, StagedBlock) else res  # type: ignore[arg-type]
    finally:
        _init(None)  # in-process: no reference to the reader outlives the job


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    to: str,
    *,
    source_format: str | None = None,
    split: str | None = None,
    workers: int | None = None,
    engine: str = "processes",
    address: str | None = None,
    overwrite: bool = False,
    writer_options: dict[str, Any] | None = None,
    reader_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ConvertSummary:
    """Convert the dataset at ``src`` into format ``to`` at ``dst``.

    Records go to record formats as they are; token sequences go to token formats, or to
    record formats as ``{"tokens": ids}`` (read them back with ``token_column="tokens"``).
    ``reader_options`` go to the source's reader (``token_column=`` gives the token view of a
    records source). ``engine`` ("inprocess", "processes", "ray" at ``address``) and
    ``workers`` choose where source blocks are read; the output is the same for all.
    ``storage_options`` go to the stores of URLs (``src`` and ``dst`` alike); an output URL is
    written through the target format's writer, which commits it metadata-last.
    """
    with options_scope(storage_options):
        return _convert(
            src,
            dst,
            to,
            source_format,
            split,
            workers,
            engine,
            address,
            overwrite,
            writer_options,
            reader_options,
            progress,
        )


def _convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    to: str,
    source_format: str | None,
    split: str | None,
    workers: int | None,
    engine: str,
    address: str | None,
    overwrite: bool,
    writer_options: dict[str, Any] | None,
    reader_options: dict[str, Any] | None,
    progress: Callable[[int], None] | None,
) -> ConvertSummary:
    t0 = time.perf_counter()
    target = formats.spec(to)
    dst = check_dest(dst, overwrite)
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
    pool = make_executor(engine, workers, address, units=sum(_n_blocks(r) for r in readers))
    try:
        summary.records = _copy(
            src,
            dst,
            target,
            list(zip(src_splits, readers, strict=True)),
            pool,
            overwrite,
            opts,
            progress,
        )
    finally:
        for r in readers:
            r.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def _copy(
    src: Any,
    dst: Any,
    target: formats.FormatSpec,
    sources: list[tuple[str | None, Any]],
    pool: Executor,
    overwrite: bool,
    opts: dict[str, Any],
    progress: Callable[[int], None] | None,
) -> int:
    """Every record of ``sources`` (split, reader) into a new ``target`` dataset at ``dst``;
    returns the number of records."""
    readers = [r for _, r in sources]
    tokens = all(is_token_reader(r) for r in readers)
    if target.kind == "tokens":
        if not tokens:
            raise InvalidInputError(
                f"{target.name} stores token sequences and {src} holds records; use `lmdata "
                "tokenize` to turn documents into tokens, or token_column= (--token-column) "
                "for a records dataset whose column holds token ids"
            )
        assert target.tokens is not None
        sink = target.tokens.open(
            dst,
            overwrite=overwrite,
            vocab_size=_vocab_size(readers),
            options=opts,
        )
    else:
        sink = None
        w = open_writer(dst, target.name, overwrite=overwrite, **opts)
    out: Any = sink if sink is not None else w
    records = 0
    # blocks read by workers are staged beside the output and committed from there; a new
    # job empties what a killed one left
    staging = None if isinstance(pool, InProcess) else staging_for(dst, None, "convert")
    try:
        if staging is not None:
            staging.reset(b"convert")
        for i, (s, reader) in enumerate(sources):
            for block in _blocks(reader, pool, staging, i, tokens):
                first = records
                try:
                    if sink is not None:  # one call per block: the error names the block
                        _write_tokens(sink, block, s if s in target.splits else "train")
                        records += len(block)
                    else:
                        for rec in block:
                            w.write({"tokens": rec} if tokens else rec)
                            records += 1
                except InvalidInputError as e:
                    last = first + len(block) - 1
                    where = f"record {records}" if sink is None else f"records {first}-{last}"
                    split_name = f"{s} " if s else ""
                    raise InvalidInputError(f"{src}: {split_name}{where}: {e}") from None
                if progress:
                    progress(records)
    except BaseException:
        out.abort()
        raise
    finally:
        if staging is not None:
            staging.clear()
    out.close()
    return records


def _vocab_size(readers: list[Any]) -> int:
    """The vocabulary the output must hold: one past the largest id of any split read (a
    later split may use ids the first does not)."""
    return max(max((int(r.max_token_id) for r in readers), default=0) + 1, 1)


def _write_tokens(sink: Any, block: list[Any], split: str) -> None:
    lengths = np.fromiter((len(t) for t in block), dtype=np.int64, count=len(block))
    flat = np.concatenate(block) if block else np.zeros(0, dtype=np.uint32)
    sink.write_many(flat, lengths, split)
