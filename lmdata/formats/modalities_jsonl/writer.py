"""Writing JSONL files together with their modalities raw index."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import orjson

from lmdata.errors import InvalidInputError
from lmdata.formats._span_index import dump_span_index
from lmdata.formats.modalities_jsonl.lines import default_index_path
from lmdata.storage import AtomicOutput, AtomicWriter, LocalStore, Output, Store, resolve

_OPTS = orjson.OPT_SERIALIZE_NUMPY


def dumps_line(record: Any) -> bytes:
    """One JSON line (no newline) for ``record``; numpy values as JSON numbers and lists."""
    try:
        return orjson.dumps(record, option=_OPTS)
    except TypeError as e:
        try:  # integers beyond 64 bits, NaN: the standard library writes what json reads back
            return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
        except (TypeError, ValueError):
            raise InvalidInputError(f"record cannot be written as JSON: {e}") from None


class Writer(AtomicWriter):
    """Writes records as JSON lines to ``path`` and their raw index beside it (``foo.idx``).

    Both files appear only when the writer closes cleanly; the index matches what
    ``lmdata index`` (and modalities' ``create_raw_index``) would build from the file. The
    index is committed last, after any old index is removed: a writer killed in between
    leaves the data without an index, which readers refuse.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        index_path: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        store, key = resolve(path, storage_options)
        self._remote: tuple[Output, Output | None] | None = None
        if not isinstance(store, LocalStore):
            self._open_remote(store, key, index_path, overwrite, storage_options)
            return
        dest = Path(key)
        idx = Path(index_path) if index_path else default_index_path(dest)
        if idx == dest:
            raise InvalidInputError(
                "the index path is the data file itself; name the JSONL "
                "file with a suffix such as .jsonl",
                path=dest,
            )
        self._data = AtomicOutput(
            dest, directory=False, overwrite=overwrite, what="modalities-jsonl"
        )
        try:
            self._index = AtomicOutput(idx, directory=False, overwrite=overwrite)
        except BaseException:
            self._data.abort()
            raise
        self.path = self._data.dest
        self.index_path = self._index.dest
        self._f = open(self._data.tmp, "wb", buffering=1 << 20)
        self._offsets: list[int] = []
        self._lengths: list[int] = []
        self._pos = 0

    def _open_remote(
        self,
        store: Store,
        key: str,
        index_path: str | os.PathLike[str] | None,
        overwrite: bool,
        storage_options: dict[str, Any] | None,
    ) -> None:
        """On an object store the data and its index are committed as a pair under the data's
        claim (:meth:`lmdata.storage.FsspecOutput.also`): a new pair in place, the index last;
        a replaced pair swapped under one journal, so a kill leaves the old pair, the new one,
        or a journal from which `lmdata clean --claims` (or the next writer) finishes the new
        one. An index on another store is written after the data, the old one removed first
        (a kill in between leaves data without an index, which readers refuse)."""
        istore, ikey = (
            resolve(index_path, storage_options)
            if index_path
            else (store, str(default_index_path(key)))
        )
        if istore.url(ikey) == store.url(key):
            raise InvalidInputError(
                "the index path is the data file itself; name the JSONL "
                "file with a suffix such as .jsonl",
                path=store.url(key),
            )
        data = store.output(key, directory=False, overwrite=overwrite)
        paired = (
            callable(getattr(data, "also", None))
            and istore.id == store.id
            and getattr(istore, "storage_options", None) == getattr(store, "storage_options", None)
        )
        if paired:  # one store: the pair is committed under one claim and one journal
            try:
                data.also(ikey)
            except BaseException:
                data.abort()
                raise
            index = None
        else:
            index = istore.output(ikey, directory=False, overwrite=overwrite)
        self._remote = (data, index)
        self._remote_index = (istore, ikey)
        self.path = store.url(key)  # type: ignore[assignment]
        self.index_path = istore.url(ikey)  # type: ignore[assignment]
        self._f = data.open_write("")
        self._offsets: list[int] = []
        self._lengths: list[int] = []
        self._pos = 0

    @property
    def documents(self) -> int:
        return len(self._offsets)

    def write(self, record: Any) -> None:
        """Append one record (any JSON-serialisable value, usually a dict)."""
        line = dumps_line(record)
        self._f.write(line)
        self._f.write(b"\n")
        self._offsets.append(self._pos)
        self._lengths.append(len(line))
        self._pos += len(line) + 1

    def close(self) -> None:
        if self._remote is not None:
            data, index = self._remote
            if data.done:
                return
            try:
                self._f.close()
                istore, ikey = self._remote_index
                spans = dump_span_index(self._offsets, self._lengths)
                if index is None:  # swapped as a pair: the old pair, the new one, or a journal
                    data.write_also(ikey, spans)
                    data.commit()
                    return
                # on two stores, as locally: the old index goes before the new data, so a kill
                # in between leaves data with no index (refused), never new data under an old
                # index
                if istore.exists(ikey):
                    istore.remove(ikey)
                data.commit()
                index.write_last("", spans)
                index.commit()
            except BaseException:
                self.abort()
                raise
            return
        if self._data.done:
            return
        try:
            self._f.close()
            self._index.tmp.write_bytes(dump_span_index(self._offsets, self._lengths))
            # Two files cannot be renamed at once. The old index goes first and the new one
            # comes last, so a kill at any point leaves a data file with no index (refused;
            # `lmdata index` rebuilds it), never a data file with another file's index.
            with contextlib.suppress(FileNotFoundError):
                self.index_path.unlink()
            self._data.finish()
            self._index.finish()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._f.close()
        if self._remote is not None:
            for out in self._remote:
                if out is not None:
                    out.abort()
            return
        self._data.abort()
        self._index.abort()
