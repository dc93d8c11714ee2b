"""Where documents come from: files and folders of JSONL (plain, .gz, .zst), Dolma trees,
Modalities raw JSONL, Parquet, plain text, and any lmdata records dataset.

A source is split into *units* — an input file, a byte range of a plain JSONL file, or a record
range of a dataset — that are independent of each other, so workers can process them in any
order and the pipeline commits their results in input order. A unit names what to read; the
worker reads it (:func:`read_batches`), so documents never travel through the driver.
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmdata.errors import DatasetNotFoundError, InvalidInputError, LmdataError

JSONL_SUFFIXES = (
    ".jsonl",
    ".json",
    ".jsonl.gz",
    ".json.gz",
    ".jsonl.zst",
    ".json.zst",
    ".jsonl.zstd",
    ".ndjson",
)
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")
PARQUET_SUFFIXES = (".parquet",)


@dataclass(frozen=True)
class InputFile:
    """One input: a file of documents, or a whole lmdata dataset read through ``lmdata.open``."""

    path: str
    kind: str  # "jsonl" | "parquet" | "text" | "dataset"
    size: int
    validation: bool = False  # every document of this file goes to the validation split


@dataclass(frozen=True)
class Unit:
    """What one worker reads: a whole input file, a byte range of a plain JSONL file (the lines
    that start in ``[start, end)``), or a record range ``[start, end)`` of a dataset. Workers
    read it themselves, so a unit is a few numbers, never documents."""

    file_index: int
    part: int
    path: str
    kind: str  # InputFile.kind
    start: int = 0
    end: int = -1  # -1: to the end

    @property
    def splittable(self) -> bool:
        return self.kind == "jsonl" and not self.path.endswith(COMPRESSED)


@dataclass(frozen=True)
class Batch:
    """Up to ``batch`` documents of a unit: raw JSON lines (``"lines"``) or texts."""

    kind: str  # "lines" | "texts"
    items: list[Any]
    position: int  # bytes of the input file read after this batch (0: unknown, -1: all)


COMPRESSED = (".gz", ".zst", ".zstd")
RANGE_BYTES = 8 << 20  # a plain JSONL file becomes units of this many bytes
DATASET_RECORDS = 1 << 16  # records of a dataset input per unit
BATCH_BYTES = 1 << 20  # a batch also ends after this many bytes, so memory stays small


def _kind_of(p: Path) -> str | None:
    name = p.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def list_inputs(sources: list[str | os.PathLike[str]], fmt: str | None = None) -> list[InputFile]:
    """Every input file under ``sources`` in a stable (sorted) order.

    A Dolma tree contributes its ``documents/`` files; other folders contribute every file with
    a known suffix, recursively. A path that is an lmdata dataset of another kind (Atlas, MDS,
    ...) is read whole through ``lmdata.open``.
    """
    out: list[InputFile] = []
    for src in sources:
        p = Path(src)
        if not p.exists():
            raise DatasetNotFoundError("no such file or directory", path=p)
        if fmt is None and p.is_dir() and (p / "documents").is_dir():
            p = p / "documents"  # a Dolma tree: documents only, attributes are not text
        if fmt is None and p.is_file() and _kind_of(p):
            out.append(InputFile(str(p), _kind_of(p) or "", p.stat().st_size))
            continue
        if fmt is None and p.is_dir() and not _looks_like_dataset(p):
            files = sorted(
                f
                for f in p.rglob("*")
                if f.is_file()
                and _kind_of(f)
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not files:
                raise InvalidInputError(
                    "no documents found (looked for *.jsonl[.gz|.zst], *.parquet, *.txt)", path=p
                )
            out.extend(InputFile(str(f), _kind_of(f) or "", f.stat().st_size) for f in files)
            continue
        from lmdata.storage import apparent_size

        out.append(InputFile(str(p), "dataset", apparent_size(p)))
    return out


def _looks_like_dataset(p: Path) -> bool:
    """A folder that some format claims (MDS, Atlas, flat-tokens, ...) and whose documents are
    not plain files this module reads itself (a Dolma tree's are)."""
    from lmdata import formats

    try:
        spec = formats.spec(formats.detect(p))
    except (LmdataError, OSError):
        return False
    return not spec.document_files


def _open_text(path: str) -> tuple[io.BufferedIOBase, io.BufferedIOBase]:
    """(decompressed byte stream, the file underneath: its position tells the progress)."""
    raw = open(path, "rb")
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]
    if path.endswith((".zst", ".zstd")):
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)
        return io.BufferedReader(stream), raw  # type: ignore[arg-type]  # adds line iteration
    return raw, raw


def plan_units(
    inputs: list[InputFile], range_bytes: int = RANGE_BYTES, fmt: str | None = None
) -> list[Unit]:
    """The units of ``inputs``, in input order: a plain JSONL file is cut into byte ranges
    (a retry redoes only its range), a compressed file or any other input is one unit, and a
    dataset is cut into record ranges. Reads nothing but a dataset's length."""
    out: list[Unit] = []
    for fi, inp in enumerate(inputs):
        if inp.kind == "dataset":
            n = _dataset_len(inp.path, fmt)
            for part, lo in enumerate(range(0, max(n, 1), DATASET_RECORDS)):
                out.append(Unit(fi, part, inp.path, inp.kind, lo, min(n, lo + DATASET_RECORDS)))
            continue
        unit = Unit(fi, 0, inp.path, inp.kind)
        if not unit.splittable:
            out.append(unit)
            continue
        for part, lo in enumerate(range(0, max(inp.size, 1), range_bytes)):
            out.append(Unit(fi, part, inp.path, inp.kind, lo, min(inp.size, lo + range_bytes)))
    return out


def read_batches(
    unit: Unit, batch: int, text_key: str = "text", fmt: str | None = None
) -> Iterator[Batch]:
    """The documents of ``unit`` in non-empty batches of at most ``batch`` documents (and
    about BATCH_BYTES)."""
    if unit.kind == "jsonl":
        yield from _line_batches(unit, batch)
    elif unit.kind == "text":
        data = Path(unit.path).read_bytes().decode("utf-8", "surrogateescape")
        yield Batch("texts", [data], -1)
    elif unit.kind == "parquet":
        yield from _parquet_batches(unit.path, batch, text_key)
    else:
        yield from _dataset_batches(unit, batch, text_key, fmt)


def first_line(unit: Unit) -> int:
    """The 1-based line (record) number of the unit's first document. For a byte range this
    counts the newlines before it: only error messages ask, the driver counts as it commits."""
    if not unit.splittable or unit.start == 0:
        return unit.start + 1
    # the first line starting at or after ``start`` follows the first newline at start-1 or later
    n, left = 2, unit.start - 1
    with open(unit.path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n


def _line_batches(unit: Unit, batch: int) -> Iterator[Batch]:
    if unit.splittable:  # the lines that start in [start, end)
        fh = under = open(unit.path, "rb")
        if unit.start > 0:
            fh.seek(unit.start - 1)
            fh.readline()  # up to the first line start at or after ``start``
        end = unit.end
    else:
        fh, under = _open_text(unit.path)
        end = -1
    with under, fh:
        items: list[bytes] = []
        size, pos = 0, (fh.tell() if end >= 0 else 0)
        while end < 0 or pos < end:
            line = fh.readline()
            if not line:
                break
            pos += len(line)
            items.append(line)
            size += len(line)
            if len(items) >= batch or size >= BATCH_BYTES:
                yield Batch("lines", items, min(pos, end) if end >= 0 else under.tell())
                items, size = [], 0
        if items:
            yield Batch("lines", items, end)


def _parquet_batches(path: str, batch: int, text_key: str) -> Iterator[Batch]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if text_key not in pf.schema_arrow.names:
        raise InvalidInputError(
            f"no column {text_key!r} (columns: {', '.join(pf.schema_arrow.names)}); "
            "pass --text-key",
            path=path,
        )
    for rb in pf.iter_batches(batch_size=batch, columns=[text_key]):
        yield Batch("texts", rb.column(0).to_pylist(), 0)


def _dataset_len(path: str, fmt: str | None) -> int:
    from lmdata._api import open as open_dataset

    reader = open_dataset(path, format=fmt)
    try:
        return len(reader)
    finally:
        reader.close()


def _dataset_batches(unit: Unit, batch: int, text_key: str, fmt: str | None) -> Iterator[Batch]:
    from lmdata._api import open as open_dataset

    reader = open_dataset(unit.path, format=fmt)
    try:
        for lo in range(unit.start, unit.end, batch):
            recs = reader.take(list(range(lo, min(unit.end, lo + batch))))
            texts = []
            for j, rec in enumerate(recs):
                if not isinstance(rec, dict) or text_key not in rec:
                    texts.append(_Missing(lo + j + 1))
                else:
                    texts.append(rec[text_key])
            yield Batch("texts", texts, 0)
    finally:
        reader.close()


@dataclass(frozen=True)
class _Missing:
    """A record without the text field (reported by the worker like a JSONL line would be)."""

    record: int
