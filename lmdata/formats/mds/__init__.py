"""MosaicML streaming datasets: MDS, CSV, TSV and JSONL shards described by index.json.

One package serves four format names (``mds``, ``mds-csv``, ``mds-tsv``, ``mds-jsonl``), one
spec each in :data:`SPECS`: the registry passes ``format=<name>`` to :func:`open`,
:class:`Writer`, :func:`validate` and :func:`info`, and :func:`detect_format` says which one a
directory holds. Reading does not depend on the name: every shard says its own format, as in
streaming. A dataset opens as records (dicts, as streaming returns them); ``token_column=``
gives the token-sequence view of one integer ndarray column.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from lmdata import _json
from lmdata._lazy import lazy_exports
from lmdata._progress import OnProgress, Ticker
from lmdata.errors import LmdataError, StorageError
from lmdata.formats._spec import (
    FormatSpec,
    TokenTarget,
    column_sink,
    lazy,
)
from lmdata.formats.mds.index import FORMAT_NAMES, INDEX, index_head, split_dirs
from lmdata.formats.mds.merge import merge
from lmdata.storage import resolve, usage

if TYPE_CHECKING:
    from collections.abc import Sequence

    from lmdata.formats.mds.reader import MDSReader

# the reader, writer and checks load on first use
__getattr__ = lazy_exports(
    __name__,
    {
        "MDSReader": "lmdata.formats.mds.reader",
        "MDSTokens": "lmdata.formats.mds.tokens",
        "Writer": "lmdata.formats.mds.writer",
    },
)
validate = lazy("lmdata.formats.mds.validate:validate")

__all__ = [
    "SPECS",
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
            obj = _json.parse(head, _json.MAX_METADATA_DEPTH)
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
    columns: Sequence[str] | None = None,
    allow_unsafe_pickle: bool = False,
    cache_bytes: int | None = None,
    max_open_shards: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> MDSReader:
    """A records reader; with ``token_column``, the token-sequence view (:class:`MDSTokens`)
    of that integer ndarray column. ``columns``: read only these; ``cache_bytes`` (decoded
    shards kept, default 512 MiB) and ``max_open_shards`` (default 1024) bound memory."""
    from lmdata.formats.mds.reader import MDSReader

    sizes = {"cache_bytes": cache_bytes, "max_open_shards": max_open_shards}
    reader = MDSReader(
        path,
        format=format,
        split=split,
        columns=columns,
        allow_unsafe_pickle=allow_unsafe_pickle,
        storage_options=storage_options,
        **{k: v for k, v in sizes.items() if v is not None},
    )
    if token_column is not None:
        from lmdata.formats.mds.tokens import MDSTokens

        return MDSTokens.wrap(reader, token_column)
    return reader


def info(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    split: str | None = None,
    scan: bool = True,
    progress: OnProgress | None = None,
    allow_unsafe_pickle: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Columns, counts and sizes from the index (``scan`` is accepted: nothing here reads the
    shards; ``progress`` gets their uncompressed bytes once the index is read). A root whose
    splits are sub-directories (streaming's layout) and no split asked: each split's summary
    under ``splits``."""
    opts: dict[str, Any] = {
        "allow_unsafe_pickle": allow_unsafe_pickle,
        "storage_options": storage_options,
    }
    if split is None:
        store, key = resolve(path)
        subs = split_dirs(store, key) if store.is_dir(key) and INDEX not in store.list(key) else []
        if subs:
            parts = {
                name: info(path, format=format, split=name, scan=scan, **opts) for name in subs
            }
            Ticker(progress, 0, "info").finish()
            return {
                "format": next(iter(parts.values()))["format"],
                "path": str(path),
                "splits": parts,
            }
    r = open(path, format=format, split=split, **opts)
    shards = r.index.shards
    Ticker(
        progress,
        sum(s.raw_data.bytes + (s.raw_meta.bytes if s.raw_meta else 0) for s in shards),
        "info",
    ).finish()
    out: dict[str, Any] = {"format": r.format, "path": str(path)}
    out.update(r.info())
    root = r.index.store.url(r.index.root)
    used = usage(root, storage_options)
    out["bytes_on_disk"], out["apparent_bytes"] = used.disk, used.apparent
    if r.index.provenance is not None:
        out["provenance"] = r.index.provenance
    return out


def splits(path: str | os.PathLike[str]) -> list[str]:
    """Sub-directories that hold their own index.json (streaming's splits)."""
    try:
        return split_dirs(*resolve(path))
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except OSError as e:
        raise LmdataError(f"cannot list: {e}", path=os.fspath(path)) from None


_SUMMARIES = {
    "mds": "MosaicML streaming MDS shards + index.json",
    "mds-csv": "MosaicML streaming CSV shards + index.json",
    "mds-tsv": "MosaicML streaming TSV shards + index.json",
    "mds-jsonl": "MosaicML streaming JSONL shards + index.json",
}

SPECS = tuple(
    FormatSpec(
        name=name,
        kind="records",
        summary=summary,
        detect=detect_format,  # one detector for the family: it names what it found
        open=open,
        writer=lazy("lmdata.formats.mds.writer:Writer"),
        validate=validate,
        info=info,
        aliases=(name.replace("-", "_"),) + (("streaming",) if name == "mds" else ()),
        has_splits=True,  # index.json files in sub-folders, as streaming's split=
        list_splits=splits,
        merge=merge,
        token_view=lazy("lmdata.formats.mds.tokens:MDSTokens.wrap"),
        provenance=lambda reader: reader.index.provenance,
        pass_name=True,
        # tokenize writes samples {"tokens": ids}; read them back with token_column="tokens"
        tokens=TokenTarget(
            open=column_sink(lazy("lmdata.formats.mds.writer:Writer"), declare_columns=True),
            options=frozenset({"compression"}),
        )
        if name == "mds"
        else None,
    )
    for name, summary in _SUMMARIES.items()
)
