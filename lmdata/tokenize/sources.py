"""Where documents come from: files and folders of JSONL (plain, .gz, .zst), Dolma trees,
Modalities raw JSONL, Parquet, plain text, and any lmdata records dataset.

A source is split into *units* — one batch of documents from one input file — that are
independent of each other, so workers can process them in any order and the pipeline commits
their results in input order. Raw lines travel to workers as bytes: JSON parsing happens there.
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
    """A batch of documents from one input file, as raw lines or texts."""

    file_index: int
    part: int
    first_line: int  # 1-based line (or record) number of the first item
    kind: str  # "lines" (raw JSON bytes) or "texts"
    items: list[Any]
    position: int = -1  # bytes of the input file consumed after this unit (-1: all of it)


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


def iter_units(
    inputs: list[InputFile],
    batch: int = 1000,
    *,
    text_key: str = "text",
    skip_files: frozenset[int] = frozenset(),
    fmt: str | None = None,
) -> Iterator[Unit]:
    """Units of at most ``batch`` documents, in input order."""
    for fi, inp in enumerate(inputs):
        if fi in skip_files:
            continue
        if inp.kind == "jsonl":
            yield from _jsonl_units(fi, inp.path, batch)
        elif inp.kind == "text":
            data = Path(inp.path).read_bytes().decode("utf-8", "surrogateescape")
            yield Unit(fi, 0, 1, "texts", [data])
        elif inp.kind == "parquet":
            yield from _parquet_units(fi, inp.path, batch, text_key)
        else:
            yield from _dataset_units(fi, inp.path, batch, text_key, fmt)


UNIT_BYTES = 1 << 20  # a unit also ends after this many bytes, so workers stay balanced


def _jsonl_units(fi: int, path: str, batch: int) -> Iterator[Unit]:
    fh, under = _open_text(path)
    with under, fh:
        part, line_no, first, items, size = 0, 0, 1, [], 0
        for line in fh:
            line_no += 1
            items.append(line)
            size += len(line)
            if len(items) >= batch or size >= UNIT_BYTES:
                yield Unit(fi, part, first, "lines", items, under.tell())
                part, first, items, size = part + 1, line_no + 1, [], 0
        if items or part == 0:
            yield Unit(fi, part, first, "lines", items, under.tell())


def _parquet_units(fi: int, path: str, batch: int, text_key: str) -> Iterator[Unit]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if text_key not in pf.schema_arrow.names:
        raise InvalidInputError(
            f"no column {text_key!r} (columns: {', '.join(pf.schema_arrow.names)}); "
            "pass --text-key",
            path=path,
        )
    part, first = 0, 1
    for rb in pf.iter_batches(batch_size=batch, columns=[text_key]):
        texts = rb.column(0).to_pylist()
        yield Unit(fi, part, first, "texts", texts)
        part, first = part + 1, first + len(texts)
    if part == 0:
        yield Unit(fi, 0, 1, "texts", [])


def _dataset_units(
    fi: int, path: str, batch: int, text_key: str, fmt: str | None
) -> Iterator[Unit]:
    from lmdata._api import open as open_dataset

    reader = open_dataset(path, format=fmt)
    n = len(reader)
    if n == 0:
        yield Unit(fi, 0, 1, "texts", [])
        return
    for part, lo in enumerate(range(0, n, batch)):
        recs = reader.take(list(range(lo, min(n, lo + batch))))
        texts = []
        for j, rec in enumerate(recs):
            if not isinstance(rec, dict) or text_key not in rec:
                texts.append(_Missing(lo + j + 1))
            else:
                texts.append(rec[text_key])
        yield Unit(fi, part, lo + 1, "texts", texts)


@dataclass(frozen=True)
class _Missing:
    """A record without the text field (reported by the worker like a JSONL line would be)."""

    record: int
