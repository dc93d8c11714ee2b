"""Writing Dolma trees: ``<path>/documents/part-NNNNN.jsonl.gz``, gzip like dolma.

The tree is written through its store (a local path or a URL) and appears whole when the writer
closes: locally one rename; on object stores the files are staged under a ``.lmdata-tmp-*``
sibling and copied into place on close, since a Dolma tree has no metadata object whose
arrival could mark it complete. While they are copied, ``documents/.lmdata-committing`` marks
the tree (and the writer's claim holds the commit's journal): lmdata's readers refuse a tree
with that marker, which costs them no request (they list ``documents/`` anyway), and a commit a
kill cut short is finished from the staged copies by ``lmdata clean --claims`` or the next
writer. A replaced tree is thus the old one or the new one, never a mix, never neither.

Documents are JSON objects with string ``id``, ``text`` and ``source``. What other formats hand
over is made to fit where that is unambiguous: an integer id becomes its decimal string (as
dolma's fix_ids_type.py does), a missing id becomes the document's position, a missing source
becomes ``source=`` (default: the dataset folder's name). A missing or non-string text is an
error: there is nothing sensible to store.
"""

from __future__ import annotations

import math
import os
from typing import Any

import orjson

from lmdata._options import checked
from lmdata.errors import InvalidInputError
from lmdata.formats.dolma._output import open_write, suffix_for
from lmdata.formats.dolma._paths import COMMIT_MARKER, shown
from lmdata.storage import AtomicWriter, basename, manifest_output, resolve

DEFAULT_FILE_BYTES = 1 << 30  # uncompressed bytes per file before starting the next one


def _to_json(obj: Any) -> Any:
    """numpy scalars (from other formats' readers) as plain numbers; nothing else is guessed."""
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON (dolma documents are JSON objects)")


def _non_finite(obj: Any, where: str = "value") -> str | None:
    """The place of the first NaN/infinity inside ``obj``, or None."""
    if isinstance(obj, float):
        return where if not math.isfinite(obj) else None
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return None
    for k, v in items:
        if isinstance(v, (float, dict, list)):
            found = _non_finite(v, f"{where}[{k!r}]")
            if found:
                return found
    return None


class Writer(AtomicWriter):
    """Context manager writing documents into a new Dolma tree (atomically, as a whole).
    ``manifest`` (default True) puts the tree's manifest (``lmdata-manifest``: every documents
    file's size, documents and hashes) at its root; attribute folders added later by ``tag``
    or ``dedupe`` are no change to it."""

    @checked("lmdata.formats.dolma.writer.Writer")
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        compression: str = "gz",
        source: str | None = None,
        max_file_bytes: int = DEFAULT_FILE_BYTES,
        max_file_docs: int | None = None,
        prefix: str = "part",
        storage_options: dict[str, Any] | None = None,
        manifest: bool = True,
    ) -> None:
        if compression not in ("gz", "zst", "none"):
            raise InvalidInputError(f"compression {compression!r}: use gz, zst or none")
        store, key = resolve(path, storage_options)
        self.path = shown(store, key)
        self.compression = compression
        self.source = source if source is not None else basename(key)
        self.max_file_bytes = max_file_bytes
        self.max_file_docs = max_file_docs
        self.prefix = prefix
        # staged on object stores: a reader listing the tree never sees part of it
        self._out = manifest_output(
            store,
            key,
            directory=True,
            overwrite=overwrite,
            manifest=manifest,
            format="dolma",
            staged=True,
            marker=COMMIT_MARKER,
        )
        self._file: Any = None
        self._file_name = ""
        self._file_no = 0
        self._file_bytes = 0
        self._file_docs = 0
        self.count = 0

    def _next_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._out.count(self._file_docs, self._file_name)
            self._file_no += 1
        name = f"{self.prefix}-{self._file_no:05d}{suffix_for(self.compression)}"
        self._file_name = f"documents/{name}"
        self._file = open_write(self._out.open_write(self._file_name), self.compression)
        self._file_bytes = 0
        self._file_docs = 0

    def normalize(self, doc: Any) -> dict[str, Any]:
        """The document as it will be stored (see the module docstring for what is filled in)."""
        if not isinstance(doc, dict):
            raise InvalidInputError(
                f"document {self.count}: a Dolma document is a dict with id, text and source, "
                f"not {type(doc).__name__}"
            )
        text = doc.get("text")
        if not isinstance(text, str):
            raise InvalidInputError(
                f"document {self.count}: 'text' must be a string, got "
                f"{'nothing' if text is None else type(text).__name__}"
            )
        out = dict(doc)
        did = doc.get("id")
        if did is None:
            out["id"] = str(self.count)
        elif isinstance(did, int) and not isinstance(did, bool):
            out["id"] = str(did)
        elif not isinstance(did, str):
            raise InvalidInputError(
                f"document {self.count}: 'id' must be a string (or an integer to convert), got "
                f"{type(did).__name__}"
            )
        if out.get("source") is None:
            out["source"] = self.source
        elif not isinstance(out["source"], str):
            raise InvalidInputError(f"document {self.count}: 'source' must be a string")
        return out

    def write(self, doc: dict[str, Any]) -> None:
        bad = _non_finite(doc)
        if bad is not None:  # orjson would silently write null
            raise InvalidInputError(
                f"document {self.count}: {bad} is not finite; JSON has no NaN or infinity"
            )
        try:
            line = (
                orjson.dumps(
                    self.normalize(doc), default=_to_json, option=orjson.OPT_SERIALIZE_NUMPY
                )
                + b"\n"
            )
        except TypeError as e:  # orjson.JSONEncodeError is a TypeError
            raise InvalidInputError(
                f"document {self.count} cannot be stored as JSON: {e}"
            ) from None
        if (
            self._file is None
            or self._file_bytes >= self.max_file_bytes
            or (self.max_file_docs is not None and self._file_docs >= self.max_file_docs)
        ):
            self._next_file()
        self._file.write(line)
        self._file_bytes += len(line)
        self._file_docs += 1
        self.count += 1

    def close(self) -> None:
        if self._out.done:
            return
        try:
            if self._file is None:
                self._next_file()  # an empty dataset still has one (empty) documents file
            self._file.close()
            self._out.count(self._file_docs, self._file_name)
            self._file = None
        except BaseException:
            self.abort()
            raise
        self._out.commit()

    def abort(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except Exception:  # discarding the output anyway
                pass
            self._file = None
        self._out.abort()
