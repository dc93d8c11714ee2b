"""Plain JSONL (``*.jsonl``, ``*.ndjson``): one JSON value per line, no index file.

The spec and its detector (a file name check); the reader, writer and checks are
:mod:`lmdata.formats.modalities_jsonl.plain`, imported on first use. Opening scans the file
once and keeps the line offsets in memory; reads then go through the same reader as
Modalities' indexed JSONL.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lmdata._lazy import lazy_exports
from lmdata.errors import LmdataError, StorageError
from lmdata.formats._spec import FormatSpec, detector, lazy

if TYPE_CHECKING:
    from lmdata.formats.modalities_jsonl.plain import JsonlFile, Writer

__all__ = ["SPEC", "JsonlFile", "Writer", "detect", "info", "open", "validate"]

SUFFIXES = (".jsonl", ".ndjson")
__getattr__ = lazy_exports(
    __name__,
    {
        "JsonlFile": "lmdata.formats.modalities_jsonl.plain",
        "Writer": "lmdata.formats.modalities_jsonl.plain",
    },
)


def detect(path: str | os.PathLike[str]) -> bool:
    from lmdata.storage import resolve

    try:
        store, key = resolve(path)
        if not key.lower().endswith(SUFFIXES):
            return False
        return store.exists(key) and not store.is_dir(key)
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except (OSError, LmdataError):
        return False


open = lazy("lmdata.formats.modalities_jsonl.plain:open")
validate = lazy("lmdata.formats.modalities_jsonl.plain:validate")
info = lazy("lmdata.formats.modalities_jsonl.plain:info")

SPEC = FormatSpec(
    name="jsonl",
    kind="records",
    summary="plain JSON lines, no index (offsets scanned on open)",
    detect=detector(detect, "jsonl"),
    open=open,
    writer=lazy("lmdata.formats.modalities_jsonl.plain:Writer"),
    validate=validate,
    info=info,
    aliases=("ndjson",),
)
