"""Where documents come from: files and folders of JSONL (plain, .gz, .zst), Dolma trees,
Modalities raw JSONL, Parquet, plain text, and any lmdata records dataset.

A source is split into *units* — an input file, a byte range of a plain JSONL file, or a record
range of a dataset — that are independent of each other, so workers can process them in any
order and the pipeline commits their results in input order. A unit names what to read; the
worker reads it (:func:`read_batches`), so documents never travel through the driver. Inputs
may be URLs (``s3://b/corpus/``, ``s3://b/corpus/*.jsonl.gz``): the driver only lists them and
each worker reads its unit from the store itself, by ranged reads.
"""

from __future__ import annotations

import glob
import gzip
import io
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from lmdata._units import spread_size
from lmdata.errors import DatasetNotFoundError, InvalidInputError, LmdataError
from lmdata.storage import Store, basename, is_url, join, parent, resolve
from lmdata.storage.listing import glob_keys, walk_files

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
    """Up to ``batch`` documents of a unit: raw JSON lines (``"lines"``) or texts (with the
    records' ids, when a dataset's records have them)."""

    kind: str  # "lines" | "texts"
    items: list[Any]
    position: int  # bytes of the input file read after this batch (0: unknown, -1: all)
    ids: list[Any] | None = None


COMPRESSED = (".gz", ".zst", ".zstd")
RANGE_BYTES = 8 << 20  # a plain JSONL file becomes units of at most this many bytes
MIN_RANGE_BYTES = 4 << 20  # ... and of at least this many (a smaller job runs in one process)
SPREAD_UNITS = 16  # a job's plain JSONL makes at least this many units when it can
# the last TAIL_RANGES byte ranges of a job (of its last input) are cut again, each piece half
# of what is left, down to about a TAIL_SMALLEST-th of a range: the workers then finish
# together (two workers ending on whole ranges idle half a range at the end, on average)
TAIL_RANGES = 2
TAIL_SMALLEST = 8
READ_BYTES = 4 << 20  # bytes per ranged read of an input on an object store
# the read buffer of a local input and of a decompressed stream: lines are documents of tens
# of kilobytes, which an 8 KiB buffer hands over in pieces (readline then costs twice as much)
READ_BUFFER = 1 << 20
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


def list_inputs(
    sources: list[str | os.PathLike[str]],
    fmt: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[InputFile]:
    """Every input file under ``sources`` in a stable (sorted) order.

    A Dolma tree contributes its ``documents/`` files; other folders contribute every file with
    a known suffix, recursively. A path that is an lmdata dataset of another kind (Atlas, MDS,
    ...) is read whole through ``lmdata.open``. URLs are listed on their store (a URL with
    ``*``, ``?`` or ``[`` in it is a glob), with ``storage_options``; nothing is read.
    """
    out: list[InputFile] = []
    for src in sources:
        if is_url(src):
            out.extend(_list_url(os.fspath(src), fmt, storage_options))
            continue
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


def _list_url(url: str, fmt: str | None, storage_options: dict[str, Any] | None) -> list[InputFile]:
    """The inputs at ``url``, as :func:`list_inputs` finds them in a local folder: a file, a
    folder's files (a Dolma tree's ``documents/``), a glob's matches, or a whole dataset.
    Folders and globs are walked as ``lmdata tag`` walks them (one recursive listing), so
    both commands read the same files for the same pattern."""
    store, key = resolve(url, storage_options)
    if store.id == "file":  # file:// is a local path
        return list_inputs([key], fmt)
    if glob.has_magic(key):
        matches = [k for k in glob_keys(store, key) if _kind_of(Path(k))]
        if not matches:
            raise InvalidInputError(
                "the glob matches no documents (*.jsonl[.gz|.zst], *.parquet, *.txt)", path=url
            )
        return [_found(store, k, size) for k, size in _with_sizes(store, matches)]
    if not store.exists(key):
        raise DatasetNotFoundError("no such object or prefix", path=url)
    folder = store.is_dir(key)
    if fmt is None and folder and store.is_dir(join(key, "documents")):
        key = join(key, "documents")  # a Dolma tree
        url = store.url(key)
    if fmt is None and not folder and _kind_of(Path(key)):
        return [_found(store, key, store.size(key))]
    if fmt is None and folder and not _looks_like_dataset(url, storage_options):
        top = key.rstrip("/") + "/"
        found = [
            k
            for k in walk_files(store, key)
            if _kind_of(Path(k)) and not any(p.startswith(".") for p in k[len(top) :].split("/"))
        ]
        if not found:
            raise InvalidInputError(
                "no documents found (looked for *.jsonl[.gz|.zst], *.parquet, *.txt)", path=url
            )
        return [_found(store, k, size) for k, size in _with_sizes(store, found)]
    from lmdata.storage import usage

    return [InputFile(url, "dataset", usage(url, storage_options).apparent)]


def _found(store: Store, key: str, size: int) -> InputFile:
    return InputFile(store.url(key), _kind_of(Path(key)) or "", size)


def _with_sizes(store: Store, keys: list[str]) -> list[tuple[str, int]]:
    """(key, size) of ``keys``, sorted as a local folder's files are (by path component),
    from one listing per folder (which the recursive walk has usually cached already)."""
    listed: dict[str, dict[str, int]] = {}
    out = []
    for k in sorted(set(keys), key=PurePosixPath):
        folder = parent(k)
        if folder not in listed:
            listed[folder] = store.sizes(folder)
        size = listed[folder].get(basename(k))
        out.append((k, store.size(k) if size is None else size))
    return out


def _looks_like_dataset(p: Path | str, storage_options: dict[str, Any] | None = None) -> bool:
    """A folder that some format claims (MDS, Atlas, flat-tokens, ...) and whose documents are
    not plain files this module reads itself (a Dolma tree's are)."""
    from lmdata import formats
    from lmdata.storage import options_scope

    try:
        with options_scope(storage_options):
            spec = formats.spec(formats.detect(p))
    except (LmdataError, OSError):
        return False
    return not spec.document_files


class _StoreFile(io.RawIOBase):
    """An object on a store as a seekable raw file: every read is one ranged read, past the
    process-wide range cache (a scan of gigabytes read once would evict the ranges readers of
    this process come back to, and the small tail of every file would stay in it)."""

    def __init__(self, store: Store, key: str) -> None:
        self.store, self.key = store, key
        self.size = store.size(key)
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.size)[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.size - self.pos))
        if n == 0:
            return 0
        data = self.store.read_many([(self.key, self.pos, n)])[0]  # uncached
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


def open_input(path: str, storage_options: dict[str, Any] | None = None) -> IO[bytes]:
    """A binary file of ``path``: a local file, or an object read in ranges of READ_BYTES
    (so a worker reading a byte range of a large object fetches about that range only)."""
    if not is_url(path):
        return open(path, "rb", buffering=READ_BUFFER)
    store, key = resolve(path, storage_options)
    if store.id == "file":
        return open(key, "rb", buffering=READ_BUFFER)
    return io.BufferedReader(_StoreFile(store, key), buffer_size=READ_BYTES)


def _open_text(
    path: str, storage_options: dict[str, Any] | None = None
) -> tuple[io.BufferedIOBase, io.BufferedIOBase]:
    """(decompressed byte stream, the file underneath: its position tells the progress)."""
    raw: Any = open_input(path, storage_options)
    if path.endswith(".gz"):
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        return io.BufferedReader(gz, READ_BUFFER), raw  # type: ignore[arg-type]
    if path.endswith((".zst", ".zstd")):
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)
        # the buffer adds line iteration
        return io.BufferedReader(stream, READ_BUFFER), raw  # type: ignore[arg-type]
    return raw, raw


def range_bytes_for(inputs: list[InputFile]) -> int:
    """Bytes per unit of plain JSONL: ``RANGE_BYTES``, less for a small job, so that it still
    makes ``SPREAD_UNITS`` units and the workers finish together (two workers given units of 8,
    8, 8 and 2 MB idle a fifth of the job); never under ``MIN_RANGE_BYTES``. The rule is
    dolma's ranges' too (:func:`lmdata._units.spread_size`, which this job's bounds feed)."""
    total = sum(i.size for i in inputs if Unit(0, 0, i.path, i.kind).splittable)
    return spread_size(total, SPREAD_UNITS, MIN_RANGE_BYTES, RANGE_BYTES)


def plan_units(
    inputs: list[InputFile],
    range_bytes: int = RANGE_BYTES,
    fmt: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[Unit]:
    """The units of ``inputs``, in input order: a plain JSONL file is cut into byte ranges
    (a retry redoes only its range), a compressed file or any other input is one unit, and a
    dataset is cut into record ranges; the job's last ranges are smaller (see TAIL_RANGES).
    Reads nothing but a dataset's length. The units depend only on the inputs and
    ``range_bytes``, never on the number of workers, so a resume plans the same ones."""
    out: list[Unit] = []
    last = len(inputs) - 1
    for fi, inp in enumerate(inputs):
        if inp.kind == "dataset":
            n = _dataset_len(inp.path, fmt, storage_options)
            for part, lo in enumerate(range(0, max(n, 1), DATASET_RECORDS)):
                out.append(Unit(fi, part, inp.path, inp.kind, lo, min(n, lo + DATASET_RECORDS)))
            continue
        unit = Unit(fi, 0, inp.path, inp.kind)
        if not unit.splittable:
            out.append(unit)
            continue
        cuts = _cuts(inp.size, range_bytes, tail=fi == last)
        for part, (lo, hi) in enumerate(itertools.pairwise(cuts)):
            out.append(Unit(fi, part, inp.path, inp.kind, lo, hi))
    return out


def _cuts(size: int, range_bytes: int, tail: bool) -> list[int]:
    """Where the byte ranges of a file of ``size`` bytes begin, and its end: every
    ``range_bytes``; with ``tail`` (and more than one range), the last TAIL_RANGES ranges
    are cut again into halves of what is left, the last two pieces equal."""
    cuts = list(range(0, max(size, 1), range_bytes))
    if not tail or len(cuts) < 2:
        return [*cuts, size]
    first = max(0, len(cuts) - TAIL_RANGES)  # the first range of the tail
    at = cuts[first]
    del cuts[first:]
    smallest = max(1, range_bytes // TAIL_SMALLEST)
    while size - at > 2 * smallest:
        cuts.append(at)
        at += (size - at) // 2
    cuts.append(at)
    if size - at >= 2:
        cuts.append(at + (size - at) // 2)
    return [*cuts, size]


def read_batches(
    unit: Unit,
    batch: int,
    text_key: str = "text",
    fmt: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[Batch]:
    """The documents of ``unit`` in non-empty batches of at most ``batch`` documents (and
    about BATCH_BYTES); a URL is read from its store with ``storage_options``."""
    if unit.kind == "jsonl":
        yield from _line_batches(unit, batch, storage_options)
    elif unit.kind == "text":
        with open_input(unit.path, storage_options) as f:
            raw = f.read()
        try:
            data: Any = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # no encoder takes it: an error naming the byte
            data = Unreadable(f"not UTF-8 text (byte {e.start} is {raw[e.start]:#04x})")
        yield Batch("texts", [data], -1)
    elif unit.kind == "parquet":
        yield from _parquet_batches(unit.path, batch, text_key, storage_options)
    else:
        yield from _dataset_batches(unit, batch, text_key, fmt, storage_options)


def first_line(unit: Unit, storage_options: dict[str, Any] | None = None) -> int:
    """The 1-based line (record) number of the unit's first document. For a byte range this
    counts the newlines before it: only error messages ask, the driver counts as it commits."""
    if not unit.splittable or unit.start == 0:
        return unit.start + 1
    # the first line starting at or after ``start`` follows the first newline at start-1 or later
    n, left = 2, unit.start - 1
    with open_input(unit.path, storage_options) as f:
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n


def _line_batches(
    unit: Unit, batch: int, storage_options: dict[str, Any] | None = None
) -> Iterator[Batch]:
    if unit.splittable:  # the lines that start in [start, end)
        fh = under = open_input(unit.path, storage_options)  # type: ignore[assignment]
        if unit.start > 0:
            fh.seek(unit.start - 1)
            fh.readline()  # up to the first line start at or after ``start``
        end = unit.end
    else:
        fh, under = _open_text(unit.path, storage_options)
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


def _parquet_batches(
    path: str, batch: int, text_key: str, storage_options: dict[str, Any] | None = None
) -> Iterator[Batch]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(open_input(path, storage_options) if is_url(path) else path)
    if text_key not in pf.schema_arrow.names:
        raise InvalidInputError(
            f"no column {text_key!r} (columns: {', '.join(pf.schema_arrow.names)}); "
            "pass --text-key",
            path=path,
        )
    for rb in pf.iter_batches(batch_size=batch, columns=[text_key]):
        yield Batch("texts", rb.column(0).to_pylist(), 0)


def _open_dataset(path: str, fmt: str | None, storage_options: dict[str, Any] | None) -> Any:
    from lmdata._api import open as open_dataset

    so = storage_options if is_url(path) else None
    return open_dataset(path, format=fmt, storage_options=so)


def _dataset_len(path: str, fmt: str | None, storage_options: dict[str, Any] | None) -> int:
    reader = _open_dataset(path, fmt, storage_options)
    try:
        return len(reader)
    finally:
        reader.close()


def _dataset_batches(
    unit: Unit,
    batch: int,
    text_key: str,
    fmt: str | None,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[Batch]:
    """Records' texts and ids (an id decides the validation split as a JSONL line's does)."""
    reader = _open_dataset(unit.path, fmt, storage_options)
    try:
        for lo in range(unit.start, unit.end, batch):
            recs = reader.take(list(range(lo, min(unit.end, lo + batch))))
            texts: list[Any] = []
            ids: list[Any] = []
            for j, rec in enumerate(recs):
                if not isinstance(rec, dict) or text_key not in rec:
                    texts.append(_Missing(lo + j + 1))
                    ids.append(None)
                else:
                    texts.append(rec[text_key])
                    ids.append(rec.get("id"))
            yield Batch("texts", texts, 0, ids)
    finally:
        reader.close()


@dataclass(frozen=True)
class _Missing:
    """A record without the text field (reported by the worker like a JSONL line would be)."""

    record: int


@dataclass(frozen=True)
class Unreadable:
    """A document that cannot be text (reported by the worker like a malformed line)."""

    problem: str


# ---- what --resume compares ------------------------------------------------------------------


def input_versions(
    inputs: list[InputFile], storage_options: dict[str, Any] | None = None
) -> list[str]:
    """A version of each input, so a resumed job notices an input that changed since it was
    interrupted: a local file's modification time; a URL's ETag (or generation, or time written)
    from one listing per folder, which the listing of the inputs has usually cached already;
    for a dataset on a store, a digest of every object's name, size and tag below it."""
    import hashlib

    out: list[str] = []
    listed: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for i in inputs:
        if not is_url(i.path):
            out.append(f"mtime={int(os.stat(i.path).st_mtime)}")
            continue
        store, key = resolve(i.path, storage_options)
        local = store.local_path(key)
        if local is not None:  # a file:// URL: a local path
            out.append(f"mtime={int(os.stat(local).st_mtime)}")
            continue
        try:
            if i.kind == "dataset":
                h = hashlib.sha256()
                for name, (n, tag) in sorted(store.versions(key).items()):
                    h.update(f"{name}\0{n}\0{tag}\n".encode())
                out.append(f"tree={h.hexdigest()}")
                continue
            folder = key.rstrip("/").rsplit("/", 1)[0]
            if (store.id, folder) not in listed:
                found = store.versions(folder, recursive=False)
                listed[store.id, folder] = {k.strip("/"): v for k, v in found.items()}
            got = listed[store.id, folder].get(key.strip("/"))
            out.append((got or next(iter(store.versions(key).values()), (0, "")))[1])
        except (OSError, ValueError, NotImplementedError):
            out.append("")  # a store that cannot say: the size stands for the version
    return out
