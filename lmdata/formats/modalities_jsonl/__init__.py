"""modalities-jsonl: a JSONL file with the raw ``.idx`` index modalities builds for it.

``lmdata index FILE.jsonl`` (:func:`build_index`) writes the index; :func:`open` returns a
Records reader with O(1) access to each line's JSON value; :class:`Writer` writes both files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmdata._lazy import lazy_exports
from lmdata._progress import OnProgress, Ticker
from lmdata.errors import InvalidInputError, LmdataError, StorageError
from lmdata.formats._spec import FormatSpec, detector, lazy

if TYPE_CHECKING:
    from lmdata.formats.modalities_jsonl.index import IndexResult, SkippedLine, build_index, scan
    from lmdata.formats.modalities_jsonl.lines import default_index_path
    from lmdata.formats.modalities_jsonl.reader import JsonlDocuments
    from lmdata.formats.modalities_jsonl.writer import Writer

__all__ = [
    "SPEC",
    "IndexResult",
    "JsonlDocuments",
    "SkippedLine",
    "Writer",
    "build_index",
    "default_index_path",
    "detect",
    "info",
    "open",
    "scan",
    "validate",
]


__getattr__ = lazy_exports(
    __name__,
    {
        "IndexResult": "lmdata.formats.modalities_jsonl.index",
        "SkippedLine": "lmdata.formats.modalities_jsonl.index",
        "build_index": "lmdata.formats.modalities_jsonl.index",
        "scan": "lmdata.formats.modalities_jsonl.index",
        "default_index_path": "lmdata.formats.modalities_jsonl.lines",
        "JsonlDocuments": "lmdata.formats.modalities_jsonl.reader",
        "Writer": "lmdata.formats.modalities_jsonl.writer",
    },
)


def detect(path: str | os.PathLike[str]) -> bool:
    """A file with a pickled ``<stem>.idx`` beside it (``foo.jsonl`` + ``foo.idx``), or with
    an empty one: an index cut short (validate and open then say so, rather than reading the
    file as plain JSONL)."""
    from lmdata.storage import resolve

    try:
        store, key = resolve(path)
        if key.endswith(".idx") or not store.exists(key) or store.is_dir(key):
            return False
        # the index is ``foo.idx`` beside ``foo.jsonl`` (lines.default_index_path)
        idx = str(Path(key).with_suffix(".idx"))
        head = store.read_range(idx, 0, 1)
        return head == b"\x80" or (head == b"" and not store.is_dir(idx))
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except (OSError, LmdataError):
        return False


# open(path, *, index_path, allow_unsafe_pickle, storage_options): the Records reader of a
# JSONL file through its index
open = lazy("lmdata.formats.modalities_jsonl.reader:JsonlDocuments")


def info(
    path: str | os.PathLike[str],
    *,
    scan: bool = True,
    progress: OnProgress | None = None,
    index_path: str | os.PathLike[str] | None = None,
    allow_unsafe_pickle: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Documents (from the index) and sizes; ``scan`` is accepted: nothing here reads the data
    (``progress`` gets the file's bytes once the index is read)."""
    from lmdata.formats.modalities_jsonl.reader import JsonlDocuments
    from lmdata.storage import disk_usage

    with JsonlDocuments(
        path,
        index_path=index_path,
        allow_unsafe_pickle=allow_unsafe_pickle,
        storage_options=storage_options,
    ) as r:
        istore, ikey = r.index_store, r.index_key
        Ticker(progress, r.file_size, "info").finish()
        return {
            "format": "modalities-jsonl",
            "path": r.store.url(r.key),
            "index_path": istore.url(ikey),
            "documents": len(r),
            "data_bytes": r.file_size,
            "index_bytes": istore.size(ikey),
            "bytes_on_disk": disk_usage(r.store.url(r.key)) + disk_usage(istore.url(ikey)),
        }


def validate(
    path: str | os.PathLike[str],
    *,
    progress: OnProgress | None = None,
    index_path: str | os.PathLike[str] | None = None,
    allow_unsafe_pickle: bool = False,
    max_line_bytes: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Every disagreement between the file and its index, with line numbers.

    Each entry must be exactly one line (from its start up to, not including, the newline)
    that parses as JSON; a line that parses but is missing from the index means the index is
    stale. Lines left out because they are not JSON (``--skip-invalid``) are fine between
    indexed lines; after the last one they are reported (data appended after indexing looks
    the same). A line longer than ``max_line_bytes`` (default 256 MiB) is reported, not read.
    ``progress`` counts the bytes of the file checked.
    """
    from lmdata.formats.modalities_jsonl.checks import index_problems
    from lmdata.formats.modalities_jsonl.lines import MAX_LINE_BYTES, shown_path
    from lmdata.formats.modalities_jsonl.reader import open_data, read_index

    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"max_line_bytes must be a positive integer, got {limit!r}")
    try:
        store, key, istore, ikey = open_data(path, index_path, storage_options)
        index = read_index(store, key, istore, ikey, allow_unsafe=bool(allow_unsafe_pickle))
    except LmdataError as e:
        return [str(e)]
    return index_problems(store, key, shown_path(istore, ikey), index, progress, limit)


def _index_of(key: str) -> str:
    """The raw index beside a JSONL file (``foo.jsonl`` -> ``foo.idx``), which its manifest
    lists with it."""
    from lmdata.formats.modalities_jsonl.lines import default_index_path

    return str(default_index_path(key))


SPEC = FormatSpec(
    name="modalities-jsonl",
    kind="records",
    summary="raw JSONL with the .idx index modalities builds for it",
    detect=detector(detect, "modalities-jsonl"),
    open=open,
    writer=lazy("lmdata.formats.modalities_jsonl.writer:Writer"),
    validate=validate,
    info=info,
    aliases=("modalities_jsonl",),
    companions=lambda key: [_index_of(key)],
)
