"""Writing JSONL files together with their modalities raw index."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import orjson

from lmdata._options import checked
from lmdata.errors import InvalidInputError
from lmdata.formats._span_index import dump_span_index
from lmdata.formats.modalities_jsonl.lines import default_index_path
from lmdata.storage import AtomicWriter, ManifestOutput, manifest_output, resolve, shown

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
    ``lmdata index`` (and modalities' ``create_raw_index``) would build from the file. Locally
    (and with the index on another store) the index is committed last, after any old index is
    removed: a writer killed in between leaves the data without an index, which readers
    refuse. On an object store holding both, they are committed as a pair under the data's
    claim (:meth:`lmdata.storage.FsspecOutput.also`): a new pair in place, the index last; a
    replaced pair swapped under one journal, so a kill leaves the old pair, the new one, or a
    journal from which `lmdata clean --claims` (or the next writer) finishes the new one.
    ``manifest`` (default True) writes ``foo.jsonl.lmdata-manifest`` after both (listing both
    when the index sits beside the data; an index elsewhere is not listed).
    """

    @checked("lmdata.formats.modalities_jsonl.writer.Writer")
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        index_path: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        manifest: bool = True,
    ) -> None:
        store, key = resolve(path, storage_options)
        istore, ikey = (
            resolve(index_path, storage_options)
            if index_path
            else (store, str(default_index_path(key)))
        )
        here, there = store.local_path(key), istore.local_path(ikey)
        if istore.url(ikey) == store.url(key) or (
            here is not None and there is not None and Path(there).resolve() == Path(here).resolve()
        ):
            raise InvalidInputError(
                "the index path is the data file itself; name the JSONL "
                "file with a suffix such as .jsonl",
                path=store.url(key),
            )
        data = manifest_output(
            store,
            key,
            directory=False,
            overwrite=overwrite,
            manifest=manifest,
            format="modalities-jsonl",
        )
        paired = (
            callable(getattr(data.inner, "also", None))
            and istore.id == store.id
            and getattr(istore, "storage_options", None) == getattr(store, "storage_options", None)
        )
        index: ManifestOutput | None = None
        try:
            if paired:  # one store: the pair is committed under one claim and one journal
                data.also(ikey)
            else:
                index = data.attach(istore.output(ikey, directory=False, overwrite=overwrite))
        except BaseException:
            data.abort()
            raise
        self._data, self._index = data, index
        self._istore, self._ikey = istore, ikey
        self.path: Path | str = shown(store, data.dest)
        self.index_path: Path | str = shown(istore, index.dest if index is not None else ikey)
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
        if self._data.done:
            return
        try:
            self._f.close()
            self._data.count(len(self._offsets), "")
            spans = dump_span_index(self._offsets, self._lengths)
            if self._index is None:  # swapped as a pair: the old pair, the new one, or a journal
                self._data.write_also(self._ikey, spans)
                self._data.commit()
                return
            # Two files cannot be renamed at once. The old index goes before the new data and
            # the new one comes last, so a kill at any point leaves a data file with no index
            # (refused; `lmdata index` rebuilds it), never new data under an old index.
            if self._istore.exists(self._ikey):
                self._istore.remove(self._ikey)
            self._data.commit()
            self._index.write_last("", spans)
            self._index.commit()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._f.close()
        self._data.abort()
        if self._index is not None:
            self._index.abort()
