"""Records reader over a Dolma tree: the documents, optionally with attribute sets merged in.

Documents are returned as the JSON objects stored (dicts). With ``attributes=["exp", ...]``,
each attribute file's ``attributes`` object is merged into ``doc["attributes"]`` in the order
given (later sets overwrite earlier keys, as dolma's mixer does); an attribute row whose id
differs from its document's is an error naming both files and the line. Trees are read through
their store: local paths and ``memory://``, ``s3://``, ``gs://`` URLs alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import (
    CorruptDataError,
    FormatError,
    InvalidInputError,
    LmdataError,
    StorageError,
)
from lmdata.formats.dolma._files import MAX_LINE_BYTES, iter_raw_lines
from lmdata.formats.dolma._lines import LineIndex
from lmdata.formats.dolma._paths import (
    attribute_path,
    documents_dir,
    is_doc_file,
    is_file,
    list_documents,
    shown,
    walk_files,
)
from lmdata.formats.dolma._rows import merge_attribute_row, parse_line
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import Store, basename, parent, resolve
from lmdata.storage.paths import COMMITTING


class DolmaDocuments:
    """Random access over every document of a tree, in the sorted order of its files.

    Counting documents decodes each file once (gzip has no index); the per-file checkpoints
    kept from that pass make later random reads decode at most ~1 MiB. Iteration streams.
    A line longer than ``max_line_bytes`` (default 256 MiB) is a CorruptDataError naming the
    file and line, raised before the line is held whole (a decompression bomb is refused).
    """

    format = "dolma"

    def __init__(
        self,
        path: str | os.PathLike[str],
        attributes: Sequence[str] | str | None = None,
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(max_line_bytes, bool) or not isinstance(max_line_bytes, int):
            raise InvalidInputError(
                f"max_line_bytes must be a positive integer, got {max_line_bytes!r}"
            )
        if max_line_bytes < 1:
            raise InvalidInputError(f"max_line_bytes must be positive, got {max_line_bytes}")
        self.max_line_bytes = max_line_bytes
        store, key = resolve(path, storage_options)
        store.snapshot(key)  # what is read later is what is there now (one listing)
        self.store: Store = store
        if is_file(store, key):
            if not is_doc_file(basename(key)):
                raise FormatError(
                    "not a Dolma document file (*.jsonl.gz, *.jsonl, *.jsonl.zst, *.json.gz)",
                    path=store.url(key),
                )
            self.root_key, self.keys, self.single_file = parent(key), [key], True
        else:
            self.root_key, self.keys = key, list_documents(store, key)
            self.single_file = False
        if isinstance(attributes, str):
            attributes = [a for a in attributes.split(",") if a]
        self.attributes = tuple(attributes or ())
        for f in self.keys:
            for name in self.attributes:
                ap = attribute_path(f, name)
                if not is_file(store, ap):
                    raise FormatError(
                        f"attribute set {name!r} has no file for {store.url(f)}; tag that file "
                        f"or leave {name!r} out of attributes=",
                        path=store.url(ap),
                    )
        self._idx: dict[str, LineIndex] = {}
        self._cum: np.ndarray | None = None

    @property
    def root(self) -> Path | str:
        """The folder read (a local Path, or a URL)."""
        return shown(self.store, self.root_key)

    @property
    def files(self) -> list[Path | str]:
        """The document files in input order (local Paths, or URLs)."""
        return [shown(self.store, k) for k in self.keys]

    def __repr__(self) -> str:
        return (
            f"DolmaDocuments({str(self.root)!r}, files={len(self.files)}, "
            f"attributes={list(self.attributes)})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    # -- counting -------------------------------------------------------------------------------

    def _index(self, key: str) -> LineIndex:
        idx = self._idx.get(key)
        if idx is None:
            idx = self._idx[key] = LineIndex(self.store, key, self.max_line_bytes)
        return idx

    @property
    def cumulative(self) -> np.ndarray:
        """``len(files) + 1`` offsets: file ``k`` holds documents ``cum[k]:cum[k+1]``."""
        if self._cum is None:
            counts = []
            for f in self.keys:
                n = self._index(f).num_lines
                for name in self.attributes:
                    ap = attribute_path(f, name)
                    m = self._index(ap).num_lines
                    if m != n:
                        raise CorruptDataError(
                            f"{m} attribute rows for {n} documents in {self.store.url(f)}; "
                            "attribute files must have one row per document: re-run the "
                            "tagger on this file",
                            path=self.store.url(ap),
                        )
                counts.append(n)
            self._cum = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        return self._cum

    def __len__(self) -> int:
        return int(self.cumulative[-1])

    def locate(self, index: int) -> tuple[Path | str, int]:
        """(document file, 1-based line) of document ``index``."""
        i = normalize_index(index, len(self))
        k = int(np.searchsorted(self.cumulative, i, side="right")) - 1
        return shown(self.store, self.keys[k]), i - int(self.cumulative[k]) + 1

    # -- reading --------------------------------------------------------------------------------

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.take([normalize_index(index, len(self))])[0]

    def take(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        idx = normalize_indices(indices, len(self))
        cum = self.cumulative
        fileno = np.searchsorted(cum, idx, side="right") - 1
        out: list[Any] = [None] * len(idx)
        for k in np.unique(fileno).tolist():
            pos = np.nonzero(fileno == k)[0]
            lines = (idx[pos] - cum[k]).tolist()
            f = self.keys[k]
            raw = self._index(f).lines(lines)
            attr_raw = [
                (
                    self.store.url(attribute_path(f, n)),
                    self._index(attribute_path(f, n)).lines(lines),
                )
                for n in self.attributes
            ]
            fu = self.store.url(f)
            for p, ln in zip(pos.tolist(), lines, strict=True):
                doc = parse_line(raw[ln], fu, ln + 1)
                for ap, rows in attr_raw:
                    merge_attribute_row(doc, parse_line(rows[ln], ap, ln + 1), fu, ap, ln + 1)
                out[p] = doc
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for _path, _line, doc in self.iter_located():
            yield doc

    def iter_located(self) -> Iterator[tuple[Path | str, int, dict[str, Any]]]:
        """Every document with its file and 1-based line, streamed file by file."""
        for f in self.keys:
            p = shown(self.store, f)
            for _f, lineno, doc in iter_file(self.store, f, self.attributes, self.max_line_bytes):
                yield p, lineno, doc

    def info(self) -> dict[str, Any]:
        """Files, documents and attribute sets of this reader (counting decodes each file)."""
        return {
            "files": len(self.files),
            "documents": len(self),
            "attributes": list(self.attributes),
        }

    def close(self) -> None:
        """Drop the line indexes; they are rebuilt if the reader is used again."""
        self._idx.clear()
        self._cum = None

    def __enter__(self) -> DolmaDocuments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_file(
    store: Store, f: str, attributes: Sequence[str] = (), max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[str, int, dict]]:
    """Documents of one file with their attribute sets merged, checking row alignment."""
    fu = store.url(f)
    streams = [
        (
            store.url(attribute_path(f, n)),
            iter_raw_lines(store, attribute_path(f, n), max_line_bytes=max_line_bytes),
        )
        for n in attributes
    ]
    for lineno, raw in iter_raw_lines(store, f, max_line_bytes=max_line_bytes):
        doc = parse_line(raw, fu, lineno)
        for ap, it in streams:
            row = next(it, None)
            if row is None:
                raise CorruptDataError(
                    f"attribute file ends at line {lineno - 1} but {fu} has more documents; "
                    "re-run the tagger on this file",
                    path=ap,
                    position=f"line {lineno}",
                )
            merge_attribute_row(doc, parse_line(row[1], ap, lineno), fu, ap, lineno)
        yield fu, lineno, doc
    for ap, it in streams:
        extra = next(it, None)
        if extra is not None:
            raise CorruptDataError(
                f"attribute file has more rows than {fu} has documents; re-run the tagger on "
                "this file",
                path=ap,
                position=f"line {extra[0]}",
            )


def detect(path: str | os.PathLike[str]) -> bool:
    """A folder with a ``documents/`` subfolder holding at least one JSONL(.gz/.zst) file."""
    try:
        store, key = resolve(path)
        if not store.is_dir(key):
            return False
        ddir = documents_dir(store, key)
        if not store.is_dir(ddir):
            return False
        # documents/ itself usually holds the files: one listing, not a recursive one (on an
        # object store, a request per 1000 objects of the whole tree)
        names = store.sizes(ddir)
        if COMMITTING in names or any(is_doc_file(n) for n in names):
            return True  # (a tree being committed is one: opening it says why it is refused)
        return any(is_doc_file(basename(k)) for k in walk_files(store, ddir))
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except (OSError, LmdataError):
        return False
