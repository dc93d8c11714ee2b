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
from pathlib import Path
from typing import Any

from lmdata.formats._spec import FormatSpec, detector
from lmdata.formats.dolma._files import attribute_path, codec_of
from lmdata.formats.dolma._lines import LineIndex
from lmdata.formats.dolma.reader import DolmaDocuments, detect
from lmdata.formats.dolma.validate import attribute_sets, validate
from lmdata.formats.dolma.writer import Writer
from lmdata.storage import apparent_size, disk_usage

__all__ = ["SPEC", "DolmaDocuments", "Writer", "detect", "info", "open", "validate"]


def open(
    path: str | os.PathLike[str], attributes: list[str] | str | None = None, **options: Any
) -> DolmaDocuments:
    """The documents of the tree at ``path`` (a tree root, its ``documents`` folder, or one
    document file), with the named attribute sets merged into ``doc["attributes"]``."""
    return DolmaDocuments(path, attributes=attributes, **options)


def info(path: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    """Files, documents (one decoding pass), codecs and attribute sets of a tree."""
    reader = DolmaDocuments(path, **options)
    root = reader.root if Path(path).is_dir() else Path(path)
    if root.name == "documents":
        root = root.parent
    counts = [LineIndex(f, reader.max_line_bytes).num_lines for f in reader.files]
    attrs: dict[str, Any] = {}
    for name in attribute_sets(root):
        present = sum(attribute_path(f, name).is_file() for f in reader.files)
        attrs[name] = {"files": present, "missing_files": len(reader.files) - present}
    return {
        "format": "dolma",
        "path": str(root),
        "files": len(reader.files),
        "documents": sum(counts),
        "codecs": dict(Counter(codec_of(f) for f in reader.files)),
        "attribute_sets": attrs,
        "bytes_on_disk": disk_usage(root),
        "apparent_bytes": apparent_size(root),
    }


SPEC = FormatSpec(
    name="dolma",
    kind="records",
    summary="documents and attribute sets as JSONL(.gz/.zst) trees (AllenAI dolma)",
    detect=detector(detect, "dolma"),
    open=open,
    writer=Writer,
    validate=validate,
    info=info,
    document_files=True,
)
