"""``convert``: any reader into any writer, losslessly or with an error naming the field.

Records go to record formats as they are (MDS columns are inferred from the first record);
token sequences go to token formats as stored (flat-tokens keeps its train/validation splits).
Source blocks are read by worker processes in parallel and written in order, atomically.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmdata._api import open as open_dataset
from lmdata._api import writer as open_writer
from lmdata.errors import InvalidInputError
from lmdata.parallel import executor
from lmdata.protocols import is_token_reader
from lmdata.storage import check_output

TOKEN_TARGETS = ("flat-tokens", "modalities")
RECORD_TARGETS = (
    "atlas",
    "dolma",
    "mds",
    "mds-csv",
    "mds-tsv",
    "mds-jsonl",
    "modalities-jsonl",
    "jsonl",
)


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


def mds_columns(rec: Any) -> dict[str, str]:
    """MDS column encodings for a record, or InvalidInputError naming the field."""
    if not isinstance(rec, dict):
        raise InvalidInputError(f"MDS stores dicts of columns; got a {type(rec).__name__}")
    cols = {}
    for k, v in rec.items():
        if isinstance(v, bool):
            cols[k] = "json"
        elif isinstance(v, str):
            cols[k] = "str"
        elif isinstance(v, (bytes, bytearray)):
            cols[k] = "bytes"
        elif isinstance(v, int):
            cols[k] = "int64"
        elif isinstance(v, float):
            cols[k] = "float64"
        elif isinstance(v, np.ndarray):
            cols[k] = f"ndarray:{v.dtype.name}"
        elif isinstance(v, (dict, list)):
            cols[k] = "json"
        else:
            raise InvalidInputError(
                f"field {k!r} holds a {type(v).__name__}, which MDS cannot store; "
                "drop or convert that field first"
            )
    return cols


# ---- parallel block reading ------------------------------------------------------------------

_READER: Any = None


def _init(reader: Any) -> None:
    global _READER
    _READER = reader


def _read_block(bounds: tuple[int, int]) -> list[Any]:
    return _READER.take(list(range(*bounds)))


def _blocks(reader: Any, workers: int, block: int = 512) -> Iterator[list[Any]]:
    n = len(reader)
    ranges = [(lo, min(n, lo + block)) for lo in range(0, n, block)]
    yield from executor(workers if workers > 1 and len(ranges) > 1 else 0).map_ordered(
        _read_block, ranges, initializer=_init, initargs=(reader,)
    )


def _token_writer(
    to: str, dst: Path, reader: Any, overwrite: bool, opts: dict[str, Any]
) -> tuple[Any, Callable[[np.ndarray, str], None]]:
    if to == "flat-tokens":
        w = open_writer(dst, "flat-tokens", overwrite=overwrite, **opts)
        return w, lambda t, split: w.write(t, split=split)
    w = open_writer(
        dst,
        "modalities",
        overwrite=overwrite,
        vocab_size=max(int(reader.max_token_id) + 1, 1),
        append_eod=False,
        **opts,
    )
    return w, lambda t, split: w.write(t)


def _record_writer(
    to: str, dst: Path, first: Any, tokens: bool, overwrite: bool, opts: dict[str, Any]
) -> tuple[Any, Callable[[Any, str], None]]:
    """A record writer shaped by the first record (MDS columns are inferred from it)."""
    if to.startswith("mds") and "columns" not in opts:
        opts["columns"] = mds_columns({"tokens": first} if tokens else first)
    w = open_writer(dst, to, overwrite=overwrite, **opts)
    if tokens:
        return w, lambda t, _split: w.write({"tokens": t})
    return w, lambda rec, _split: w.write(rec)


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    to: str,
    *,
    source_format: str | None = None,
    split: str | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    writer_options: dict[str, Any] | None = None,
    reader_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> ConvertSummary:
    """Convert the dataset at ``src`` into format ``to`` at ``dst``."""
    t0 = time.perf_counter()
    dst = check_output(dst, overwrite)
    opts = dict(writer_options or {})
    n_workers = (os.cpu_count() or 1) if workers is None else workers
    summary = ConvertSummary(output=str(dst))
    src_splits: list[str | None] = [split]
    from lmdata import formats

    src_fmt = formats.canonical(source_format) if source_format else formats.detect(Path(src))
    if split is None and src_fmt == "flat-tokens":
        if to != "flat-tokens":
            raise InvalidInputError(
                f"flat-tokens has train and validation splits and {to} has none: pass --split "
                "train or --split validation (and convert the other into a second output)"
            )
        src_splits = ["train", "validation"]  # keep both splits
    readers = [
        open_dataset(src, format=src_fmt, split=s, **(reader_options or {})) for s in src_splits
    ]
    if to in TOKEN_TARGETS:
        if not all(is_token_reader(r) for r in readers):
            raise InvalidInputError(
                f"{to} stores token sequences and {src} holds records; use `lmdata tokenize` "
                "to turn documents into tokens"
            )
        w, write = _token_writer(to, dst, readers[0], overwrite, opts)
    elif to in RECORD_TARGETS or to == "mds":
        w = None
        write = None
    else:
        raise InvalidInputError(f"unknown target format {to!r}")
    try:
        for s, reader in zip(src_splits, readers, strict=True):
            tokens = is_token_reader(reader)
            for block in _blocks(reader, n_workers):
                for rec in block:
                    if w is None:  # record targets: created from the first record
                        w, write = _record_writer(to, dst, rec, tokens, overwrite, opts)
                    try:
                        write(rec, s or "train")  # type: ignore[misc]
                    except InvalidInputError as e:
                        where = f"{s + ' ' if s else ''}record {summary.records}"
                        raise InvalidInputError(f"{src}: {where}: {e}") from None
                    summary.records += 1
                if progress:
                    progress(summary.records)
        if w is None:  # an empty source still gives a (empty) dataset
            if to.startswith("mds") and "columns" not in opts:
                raise InvalidInputError("the source is empty: pass MDS columns explicitly")
            w = open_writer(dst, to, overwrite=overwrite, **opts)
    except BaseException:
        if w is not None:
            w.abort()
        raise
    w.close()
    summary.seconds = time.perf_counter() - t0
    return summary
