"""MosaicML streaming datasets: MDS, CSV, TSV and JSONL shards described by index.json.

One module serves four format names (``mds``, ``mds-csv``, ``mds-tsv``, ``mds-jsonl``): the
registry passes ``format=<name>`` to :func:`open`, :class:`Writer`, :func:`validate` and
:func:`info`, and :func:`detect_format` says which one a directory holds. Reading does not
depend on the name: every shard says its own format, as in streaming.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from lmdata.errors import LmdataError
from lmdata.formats.mds.index import FORMAT_NAMES, index_head, split_dirs
from lmdata.formats.mds.merge import merge
from lmdata.formats.mds.reader import MDSReader
from lmdata.formats.mds.tokens import MDSTokens, auto_token_column
from lmdata.formats.mds.validate import validate
from lmdata.formats.mds.writer import Writer
from lmdata.storage import apparent_size, disk_usage, resolve

KIND = "records"
HAS_SPLITS = True  # index.json files in sub-folders, as streaming's split=
NAMES_SHARE_MODULE = True

__all__ = [
    "KIND",
    "NAMES_SHARE_MODULE",
    "MDSReader",
    "MDSTokens",
    "Writer",
    "detect",
    "detect_format",
    "info",
    "merge",
    "open",
    "validate",
]

_HEAD = 1 << 16
_FORMAT_RE = re.compile(rb'"format": "(mds|csv|tsv|xsv|json)"')


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """``mds``/``mds-csv``/``mds-tsv``/``mds-jsonl`` for a streaming dataset, else None.

    Cheap: reads at most the first 64 KiB of index.json (merged indexes reach gigabytes).
    """
    head = index_head(path, _HEAD)
    if head is None:
        return None
    if not head.lstrip().startswith(b"{") or b'"shards"' not in head:
        return None
    if len(head) < _HEAD:
        try:
            obj = json.loads(head)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("version") != 2:
            return None
        shards = obj.get("shards")
        if not isinstance(shards, list):
            return None
        if not shards:
            return "mds"
        first = shards[0]
        if not isinstance(first, dict):
            return None
        # An MDS index whose first shard names no known format: open it as mds, so that the
        # index check reports the bad field instead of "cannot tell the format".
        fmt = first.get("format")
        return FORMAT_NAMES.get(fmt, "mds") if isinstance(fmt, str) else "mds"
    m = _FORMAT_RE.search(head)
    return FORMAT_NAMES[m.group(1).decode()] if m else None


def detect(path: str | os.PathLike[str]) -> bool:
    return detect_format(path) is not None


def open(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    split: str | None = None,
    token_column: str | None = None,
    **options: Any,
) -> MDSReader:
    """A records reader, or a token-sequence reader (:class:`MDSTokens`) when the dataset has
    exactly one column and it is an integer ndarray, or when ``token_column`` names one."""
    reader = MDSReader(path, format=format, split=split, **options)
    if token_column is None and not options.get("columns"):
        token_column = auto_token_column(reader)
    if token_column is not None:
        return MDSTokens.wrap(reader, token_column)
    return reader


def info(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    split: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    r = open(path, format=format, split=split, **options)
    out: dict[str, Any] = {"format": r.format, "path": str(path)}
    out.update(r.info())
    root = r.index.store.url(r.index.root)
    out["bytes_on_disk"] = disk_usage(root)
    out["apparent_bytes"] = apparent_size(root)
    return out


def splits(path: str | os.PathLike[str]) -> list[str]:
    """Sub-directories that hold their own index.json (streaming's splits)."""
    try:
        return split_dirs(*resolve(path))
    except OSError as e:
        raise LmdataError(f"cannot list: {e}", path=os.fspath(path)) from None
