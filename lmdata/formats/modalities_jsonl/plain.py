"""Plain JSONL (``*.jsonl``, ``*.ndjson``, format ``jsonl``): the reader, writer and checks.

Opening scans the file once (every line must be JSON; an object store's in ranged windows)
and keeps the line offsets in memory; reads then go through the same reader as Modalities'
indexed JSONL (memory-mapped locally, ranged reads on object stores). Lines are
split on ``\\n`` only, so U+2028 and friends inside strings are not line breaks. The spec and
detector are :mod:`lmdata.formats.jsonl`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from lmdata._options import checked
from lmdata._progress import OnProgress, Ticker
from lmdata.errors import LmdataError
from lmdata.formats.modalities_jsonl.index import scan_object
from lmdata.formats.modalities_jsonl.lines import data_object, default_index_path, shown_path
from lmdata.formats.modalities_jsonl.reader import JsonlDocuments
from lmdata.formats.modalities_jsonl.writer import dumps_line
from lmdata.storage import AtomicWriter, disk_usage, manifest_output, resolve


class JsonlFile(JsonlDocuments):
    """A plain JSONL file as a Records reader (``r[i]`` is the parsed JSON of line ``i``)."""

    format = "jsonl"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.store, self.key = data_object(path, storage_options)
        self.path = shown_path(self.store, self.key)
        self.index_path = shown_path(self.store, str(default_index_path(self.key)))
        self.file_size = self.store.size(self.key)
        offsets, lengths, _skipped = scan_object(self.store, self.key)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self._buf: Any = None

    def __repr__(self) -> str:
        return f"JsonlFile({str(self.path)!r})"


def open(
    path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> JsonlFile:
    return JsonlFile(path, storage_options=storage_options)


class Writer(AtomicWriter):
    """Writes records as JSON lines (the file appears only when the writer closes cleanly;
    with ``manifest``, the default, ``FILE.lmdata-manifest`` beside it right after)."""

    @checked("lmdata.formats.modalities_jsonl.plain.Writer")
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        manifest: bool = True,
    ) -> None:
        store, key = resolve(path, storage_options)
        self._out = manifest_output(
            store, key, directory=False, overwrite=overwrite, manifest=manifest, format="jsonl"
        )
        self.path = store.url(self._out.dest)
        self._f = self._out.open_write("")
        self.documents = 0

    def write(self, record: Any) -> None:
        self._f.write(dumps_line(record) + b"\n")
        self.documents += 1

    def close(self) -> None:
        if self._out.done:
            return
        try:
            self._f.close()
        except BaseException:
            self.abort()
            raise
        self._out.count(self.documents, "")
        self._out.commit()

    def abort(self) -> None:
        self._f.close()
        self._out.abort()


def validate(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
) -> list[str]:
    """The first line that is not JSON, if any; ``progress`` counts the bytes scanned."""
    try:
        store, key = data_object(path, storage_options)
        tick = Ticker(progress, store.size(key) if progress is not None else 0, "validate")
        scan_object(store, key, reached=tick.to)
    except LmdataError as e:
        return [str(e)]
    tick.finish()
    return []


def info(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    scan: bool = True,
    progress: OnProgress | None = None,
) -> dict[str, Any]:
    """Documents and size of a JSONL file; ``scan=False`` does not count the documents (a
    pass over the file; ``progress`` counts its bytes)."""
    store, key = data_object(path, storage_options)
    tick = Ticker(progress, store.size(key), "info")
    out: dict[str, Any] = {"format": "jsonl", "path": str(path)}
    if scan:
        offsets, _lengths, _skipped = scan_object(store, key, reached=tick.to)
        out["documents"] = len(offsets)
    tick.finish()
    out["bytes_on_disk"] = disk_usage(store.url(key))
    return out
