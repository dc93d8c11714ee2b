"""index.json of a streaming dataset: parsed and checked in one place into frozen dataclasses.

The writer builds the same JSON objects streaming builds (plain dicts, dumped with
``sort_keys=True``); the reader parses them into :class:`Shard` records so that every later
step can trust types and ranges. Every error names index.json and the shard number.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmdata import _json
from lmdata.errors import (
    CorruptDataError,
    FormatError,
    InvalidInputError,
    StorageError,
    UnsafeDataError,
)
from lmdata.storage import Store, basename, join, parent, resolve

INDEX = "index.json"
VERSION = 2
# index format name -> lmdata format name
FORMAT_NAMES = {
    "mds": "mds",
    "csv": "mds-csv",
    "tsv": "mds-tsv",
    "xsv": "mds-csv",
    "json": "mds-jsonl",
}
SHARD_FORMATS = {"mds": "mds", "mds-csv": "csv", "mds-tsv": "tsv", "mds-jsonl": "json"}
MAX_U32 = 2**32 - 1
MAX_FILE_BYTES = 1 << 48  # no shard file is anywhere near this; larger numbers are damage
XSV_ENCODINGS = ("str", "int", "float")
_UNITS = {
    "kb": 1 << 10,
    "mb": 1 << 20,
    "gb": 1 << 30,
    "tb": 1 << 40,
    "pb": 1 << 50,
    "eb": 1 << 60,
    "zb": 1 << 70,
    "yb": 1 << 80,
}


def parse_size_limit(value: int | float | str | None) -> int | None:
    """Bytes from an int or a string such as ``"64mb"`` (1024 units), as streaming reads it.

    ``None`` (and 0, which streaming treats the same) means no limit. Limits of 2**32 or more
    are refused: shard offsets are uint32, so bigger shards would be silently corrupt.
    """
    if value is None or value == 0 or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidInputError(f"size_limit must be bytes or a string like '64mb', got {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    elif isinstance(value, str):
        text = value.lower().strip()
        for suffix, unit in _UNITS.items():
            if text.endswith(suffix):
                try:
                    n = int(float(text[: -len(suffix)]) * unit)
                except ValueError:
                    raise InvalidInputError(
                        f"size_limit {value!r}: write a number before the unit, like '64mb'"
                    ) from None
                break
        else:
            digits = text[:-1] if text.endswith("b") else text
            if not digits.isdigit():
                raise InvalidInputError(
                    f"size_limit {value!r}: use bytes or a number with one of the suffixes "
                    f"b, {', '.join(_UNITS)}"
                )
            n = int(digits)
    else:
        raise InvalidInputError(f"size_limit must be bytes or a string like '64mb', got {value!r}")
    if n < 0:
        raise InvalidInputError(f"size_limit must not be negative, got {n}")
    if n == 0:
        return None
    if n > MAX_U32:
        raise InvalidInputError(
            f"size_limit {n} is 2**32 or more; MDS stores offsets as uint32, so use at most "
            f"{MAX_U32} bytes (streaming refuses it too)"
        )
    return n


def dump_index(shards: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
    """index.json bytes exactly as streaming's writers produce them (one line, sorted keys);
    ``extra`` keys (lmdata's provenance) are added beside them: streaming reads only these."""
    obj = {**(extra or {}), "shards": shards, "version": VERSION}
    return json.dumps(obj, sort_keys=True).encode("utf-8")


@dataclass(frozen=True)
class FileInfo:
    """One file of a shard: its name relative to the dataset directory, size and hashes."""

    basename: str
    bytes: int
    hashes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Shard:
    """One checked shard entry of index.json."""

    number: int
    format: str  # as in the index: mds, csv, tsv, xsv or json
    samples: int
    raw_data: FileInfo
    zip_data: FileInfo | None
    raw_meta: FileInfo | None
    zip_meta: FileInfo | None
    compression: str | None
    hashes: tuple[str, ...]
    size_limit: int | None
    column_names: tuple[str, ...]
    column_encodings: tuple[str, ...]
    column_sizes: tuple[int | None, ...]
    separator: str | None = None
    newline: str | None = None

    @property
    def split(self) -> bool:
        """Whether the shard is a data file plus a .meta file (csv/tsv/xsv/json)."""
        return self.format != "mds"

    @property
    def columns(self) -> dict[str, str]:
        return dict(zip(self.column_names, self.column_encodings, strict=False))


@dataclass(frozen=True)
class Index:
    """A parsed index.json: the shards in order and where they live (a store and its key)."""

    path: str  # the index.json, as shown to users
    shards: tuple[Shard, ...]
    store: Store
    key: str  # the index.json's key in the store
    provenance: dict[str, Any] | None = None  # what made the dataset (lmdata._provenance)

    @property
    def root(self) -> str:
        """The key of the directory holding index.json and the shards."""
        return parent(self.key)

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    def file(self, info: FileInfo) -> str:
        """The key of a shard file."""
        return join(self.root, info.basename)

    def url(self, info: FileInfo) -> str:
        """A shard file as shown to users."""
        return self.store.url(self.file(info))


def split_dirs(store: Store, key: str) -> list[str]:
    """Names of the sub-directories of ``key`` holding their own index.json (splits)."""
    return [n for n in store.list(key) if INDEX in store.list(join(key, n))]


def find_index(store: Store, key: str, split: str | None = None) -> str:
    """The index.json key of the dataset at ``key`` (a directory, its split, or the file)."""
    path = store.url(key)
    if not store.is_dir(key) and store.exists(key):
        if basename(key) != INDEX:
            raise FormatError("an MDS dataset is a directory holding index.json", path=path)
        return key
    base = join(key, split) if split else key
    if INDEX in store.list(base):
        return join(base, INDEX)
    subs = split_dirs(store, key)
    if split:
        raise FormatError(
            f"no index.json for split {split!r}; splits here: {', '.join(subs) or 'none'}",
            path=path,
        )
    hint = (
        (
            f"; sub-directories with their own index.json: {', '.join(subs[:8])}. Open one with "
            "split=NAME, or join partitions with `lmdata merge`"
        )
        if subs
        else ""
    )
    raise FormatError(f"no index.json here{hint}", path=path)


def index_head(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The first ``limit`` bytes of the index.json at ``path`` (or of the first split's), or None
    where there is none: what detection looks at, without reading a merged index whole."""
    try:
        store, key = resolve(path)
        if basename(key) == INDEX and store.exists(key) and not store.is_dir(key):
            idx = key
        elif INDEX in store.list(key):
            idx = join(key, INDEX)
        else:  # a root of splits (train/, val/ ...) or of partitions: look at the first one
            subs = split_dirs(store, key)
            if not subs:
                return None
            idx = join(key, subs[0], INDEX)
        return store.read_range(idx, 0, limit)
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except OSError:
        return None


MAX_INDEX_BYTES = 1 << 30  # merged indexes of huge datasets reach hundreds of MB


def load_index(store: Store, key: str) -> Index:
    """Read and check index.json (CorruptDataError naming the shard on any problem)."""
    return load_index_json(store, key)[0]


def load_index_json(store: Store, key: str) -> tuple[Index, dict[str, Any]]:
    """:func:`load_index`, and the JSON object it was parsed from (for ``merge``, which
    rewrites it): the file is read and parsed once, with one size limit."""
    path = store.url(key)
    limit = MAX_INDEX_BYTES
    obj = _json.from_bytes(
        store.read(key, limit), path=path, what="index.json", max_bytes=limit, want=None
    )
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
        raise CorruptDataError('index.json must be an object with a "shards" list', path=path)
    if obj.get("version") != VERSION:
        raise CorruptDataError(
            f"index.json version is {obj.get('version')!r}; streaming and lmdata read version 2",
            path=path,
        )
    shards = tuple(parse_shard(i, s, path) for i, s in enumerate(obj["shards"]))
    return Index(path, shards, store, key, _provenance(obj)), obj


def _provenance(obj: dict[str, Any]) -> dict[str, Any] | None:
    """lmdata's record of what made the dataset, if index.json holds one (its module, with two
    dataclasses, is imported only then: opening a dataset without one stays cheap)."""
    if not isinstance(obj.get("lmdata"), dict):  # lmdata._provenance.KEY
        return None
    from lmdata._provenance import KEY, parse

    return parse(obj.get(KEY))


def _fail(path: Path, i: int, msg: str) -> CorruptDataError:
    return CorruptDataError(msg, path=path, position=f"shard {i}")


def _show(v: Any) -> str:
    """A short repr of an index.json value for messages (huge ints and long values cut)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _file_info(v: Any, key: str, path: Path, i: int) -> FileInfo | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _fail(path, i, f"{key} must be an object or null")
    base, size, hashes = v.get("basename"), v.get("bytes"), v.get("hashes", {})
    if not isinstance(base, str) or not base:
        raise _fail(path, i, f"{key}.basename must be a non-empty string")
    parts = base.split("/")
    if posixpath.isabs(base) or os.path.isabs(base) or ".." in parts or "\\" in base:
        raise UnsafeDataError(
            f"{key}.basename {base!r} points outside the dataset directory; refusing to open it",
            path=path,
            position=f"shard {i}",
        )
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
        raise _fail(path, i, f"{key}.bytes must be an integer from 0 to 2**48, got {_show(size)}")
    if not isinstance(hashes, dict) or not all(
        isinstance(k, str) and isinstance(h, str) for k, h in hashes.items()
    ):
        raise _fail(path, i, f"{key}.hashes must map algorithm names to hex digests")
    return FileInfo(base, size, dict(hashes))


def parse_shard(i: int, s: Any, path: Path) -> Shard:
    if not isinstance(s, dict):
        raise _fail(path, i, "a shard entry must be an object")
    if s.get("version") != VERSION:
        raise _fail(path, i, f"version is {_show(s.get('version'))}, must be 2")
    fmt = s.get("format")
    if not isinstance(fmt, str) or fmt not in FORMAT_NAMES:
        raise _fail(path, i, f"format {_show(fmt)} is not one of {', '.join(FORMAT_NAMES)}")
    n = s.get("samples")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < MAX_U32:
        raise _fail(path, i, f"samples must be an integer from 0 to 2**32-2, got {_show(n)}")
    raw = _file_info(s.get("raw_data"), "raw_data", path, i)
    if raw is None:
        raise _fail(path, i, "raw_data is missing")
    zip_ = _file_info(s.get("zip_data"), "zip_data", path, i)
    raw_meta = _file_info(s.get("raw_meta"), "raw_meta", path, i)
    zip_meta = _file_info(s.get("zip_meta"), "zip_meta", path, i)
    comp = s.get("compression")
    if comp is not None and not isinstance(comp, str):
        raise _fail(path, i, f"compression must be a string or null, got {_show(comp)}")
    hashes = s.get("hashes") or []
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
        raise _fail(path, i, "hashes must be a list of algorithm names")
    limit = s.get("size_limit")
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_FILE_BYTES
    ):
        raise _fail(
            path, i, f"size_limit must be an integer from 0 to 2**48 or null, got {_show(limit)}"
        )
    sep = newline = None
    if fmt == "json":
        cols = s.get("columns")
        if not isinstance(cols, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v in XSV_ENCODINGS
            for k, v in cols.items()
        ):
            raise _fail(path, i, 'columns must map names to "str", "int" or "float"')
        names, encs, sizes = tuple(cols), tuple(cols.values()), (None,) * len(cols)
    else:
        names, encs = s.get("column_names"), s.get("column_encodings")
        if (
            not isinstance(names, list)
            or not isinstance(encs, list)
            or len(names) != len(encs)
            or not all(isinstance(x, str) for x in names + encs)
        ):
            raise _fail(
                path, i, "column_names and column_encodings must be string lists of equal length"
            )
        if fmt != "mds":
            for c, e in enumerate(encs):
                if e not in XSV_ENCODINGS:
                    raise _fail(
                        path,
                        i,
                        f"column_encodings[{c}] is {_show(e)} (column {_show(names[c])}); "
                        f"{fmt} columns are str, int or float",
                    )
        sizes = s.get("column_sizes", [None] * len(names)) if fmt == "mds" else [None] * len(names)
        if (
            not isinstance(sizes, list)
            or len(sizes) != len(names)
            or not all(
                z is None or (isinstance(z, int) and not isinstance(z, bool) and 0 < z <= MAX_U32)
                for z in sizes
            )
        ):
            raise _fail(
                path,
                i,
                "column_sizes must list a size from 1 to 2**32-1 or null per column, got "
                f"{_show(sizes)}",
            )
        names, encs, sizes = tuple(names), tuple(encs), tuple(sizes)
    if fmt != "mds":
        if raw_meta is None:
            raise _fail(path, i, f"a {fmt} shard needs raw_meta (its .meta offsets file)")
        newline = s.get("newline", "\n")
        if not isinstance(newline, str) or not newline:
            raise _fail(path, i, "newline must be a non-empty string")
        if fmt != "json":
            sep = {"csv": ",", "tsv": "\t"}.get(fmt, s.get("separator"))
            if not isinstance(sep, str) or not sep:
                raise _fail(path, i, "an xsv shard needs a non-empty separator")
    return Shard(
        i,
        fmt,
        n,
        raw,
        zip_,
        raw_meta,
        zip_meta,
        comp or None,
        tuple(hashes),
        limit,
        names,
        encs,
        sizes,
        sep,
        newline,
    )
