"""Dolma (AllenAI): documents as JSONL(.gz) under ``documents/`` and attribute sets under
``attributes/<name>/`` that mirror them row for row.

Exports :data:`SPEC` (the registry's entry) and the verbs behind it: :func:`detect`,
:func:`open` (records: document dicts, optionally with ``attributes=[...]`` merged in),
:class:`Writer`, :func:`validate` and :func:`info`. The
toolkit over this format (tag, dedupe, mix) lives in :mod:`lmdata.dolma`.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from lmdata._lazy import lazy_exports
from lmdata._progress import OnProgress, Ticker
from lmdata.errors import LmdataError, StorageError
from lmdata.formats._spec import FormatSpec, detector, lazy

if TYPE_CHECKING:
    from lmdata.formats.dolma.reader import DolmaDocuments

# the reader, writer and checks load on first use
__getattr__ = lazy_exports(
    __name__,
    {
        "DolmaDocuments": "lmdata.formats.dolma.reader",
        "Writer": "lmdata.formats.dolma.writer",
    },
)
validate = lazy("lmdata.formats.dolma.validate:validate")

__all__ = ["SPEC", "DolmaDocuments", "Writer", "detect", "info", "open", "validate"]


def detect(path: str | os.PathLike[str]) -> bool:
    """A folder with a ``documents/`` subfolder holding at least one JSONL(.gz/.zst) file
    (a file is answered without importing the reader)."""
    from lmdata.storage import resolve

    try:
        store, key = resolve(path)
        if not store.is_dir(key):
            return False
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except (OSError, LmdataError):
        return False
    from lmdata.formats.dolma.reader import detect as detect_tree

    return detect_tree(path)


# open(path, attributes=None, *, max_line_bytes, storage_options): the documents of the tree
# at ``path`` (a tree root, its ``documents`` folder, or one document file; a local path or a
# URL), with the named attribute sets merged into ``doc["attributes"]``
open = lazy("lmdata.formats.dolma.reader:DolmaDocuments")


def info(
    path: str | os.PathLike[str],
    *,
    scan: bool = True,
    progress: OnProgress | None = None,
    max_line_bytes: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Files, documents (one decoding pass; not counted with ``scan=False``), codecs and
    attribute sets of a tree; ``progress`` counts the document files' bytes, file by file."""
    from lmdata.formats.dolma._lines import LineIndex
    from lmdata.formats.dolma._paths import attribute_path, codec_of, is_file, tree_root
    from lmdata.formats.dolma.reader import DolmaDocuments
    from lmdata.formats.dolma.validate import attribute_sets, file_sizes
    from lmdata.storage import usage

    limit = {} if max_line_bytes is None else {"max_line_bytes": max_line_bytes}
    reader = DolmaDocuments(path, storage_options=storage_options, **limit)
    store = reader.store
    root = reader.keys[0] if reader.single_file else tree_root(store, reader.root_key)
    sizes = file_sizes(store, reader.keys) if progress is not None else [0] * len(reader.keys)
    tick = Ticker(progress, sum(sizes), "info")
    counts: list[int] | None = None
    if scan:
        counts = []
        for f, size in zip(reader.keys, sizes, strict=True):
            counts.append(LineIndex(store, f, reader.max_line_bytes).num_lines)
            tick.add(size)
    tick.finish()
    attrs: dict[str, Any] = {}
    for name in attribute_sets(store, root):
        present = sum(is_file(store, attribute_path(f, name)) for f in reader.keys)
        attrs[name] = {"files": present, "missing_files": len(reader.keys) - present}
    url = store.url(root)
    used = usage(url, storage_options)  # one walk (one listing) for both sizes
    return {
        "format": "dolma",
        "path": url,
        "files": len(reader.keys),
        **({"documents": sum(counts)} if counts is not None else {}),
        "codecs": dict(Counter(codec_of(f) for f in reader.keys)),
        "attribute_sets": attrs,
        "bytes_on_disk": used.disk,
        "apparent_bytes": used.apparent,
    }


SPEC = FormatSpec(
    name="dolma",
    kind="records",
    summary="documents and attribute sets as JSONL(.gz/.zst) trees (AllenAI dolma)",
    detect=detector(detect, "dolma"),
    open=open,
    writer=lazy("lmdata.formats.dolma.writer:Writer"),
    validate=validate,
    info=info,
    document_files=True,
)
