"""modalities-jsonl: a JSONL file with the raw ``.idx`` index modalities builds for it.

``lmdata index FILE.jsonl`` (:func:`build_index`) writes the index; :func:`open` returns a
Records reader with O(1) access to each line's JSON value; :class:`Writer` writes both files.
"""

from __future__ import annotations

import os
from typing import Any

from lmdata._report import ProblemReport
from lmdata.errors import LmdataError
from lmdata.formats._spec import FormatSpec, detector
from lmdata.formats.modalities_jsonl.checks import unindexed_problems
from lmdata.formats.modalities_jsonl.index import IndexResult, SkippedLine, build_index, scan
from lmdata.formats.modalities_jsonl.lines import (
    default_index_path,
    iter_lines,
    loads,
    map_object,
    release,
    shown_path,
)
from lmdata.formats.modalities_jsonl.reader import JsonlDocuments, open_data, read_index
from lmdata.formats.modalities_jsonl.writer import Writer
from lmdata.storage import disk_usage, resolve

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


def detect(path: str | os.PathLike[str]) -> bool:
    """A file with a pickled ``<stem>.idx`` beside it (``foo.jsonl`` + ``foo.idx``)."""
    try:
        store, key = resolve(path)
        if key.endswith(".idx") or not store.exists(key) or store.is_dir(key):
            return False
        return store.read_range(str(default_index_path(key)), 0, 1) == b"\x80"
    except (OSError, LmdataError):
        return False


def open(path: str | os.PathLike[str], **options: Any) -> JsonlDocuments:
    """The Records reader of a JSONL file through its index (``index_path``, ...)."""
    options.pop("split", None)
    return JsonlDocuments(path, **options)


def info(path: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    options.pop("split", None)
    with JsonlDocuments(path, **options) as r:
        _, _, istore, ikey = open_data(
            path, options.get("index_path"), options.get("storage_options")
        )
        return {
            "format": "modalities-jsonl",
            "path": r.store.url(r.key),
            "index_path": istore.url(ikey),
            "documents": len(r),
            "data_bytes": r.file_size,
            "index_bytes": istore.size(ikey),
            "bytes_on_disk": disk_usage(r.store.url(r.key)) + disk_usage(istore.url(ikey)),
        }


def validate(path: str | os.PathLike[str], **options: Any) -> list[str]:
    """Every disagreement between the file and its index, with line numbers.

    Each entry must be exactly one line (from its start up to, not including, the newline)
    that parses as JSON; a line that parses but is missing from the index means the index is
    stale. Lines left out because they are not JSON (``--skip-invalid``) are fine.
    """
    try:
        store, key, istore, ikey = open_data(
            path, options.get("index_path"), options.get("storage_options")
        )
        index = read_index(
            store, key, istore, ikey, allow_unsafe=bool(options.get("allow_unsafe_pickle"))
        )
    except LmdataError as e:
        return [str(e)]
    p, idx_path = shown_path(store, key), shown_path(istore, ikey)
    rep = ProblemReport()
    add = rep.add
    buf = map_object(store, key)
    try:
        lines = {off: (lineno, ln) for lineno, off, ln in iter_lines(buf)}
        indexed: set[int] = set()
        entries = zip(index.offsets.tolist(), index.lengths.tolist(), strict=True)
        for i, (off, ln) in enumerate(entries):
            where = f"{idx_path.name} entry {i}"
            line = lines.get(off)
            if line is None:
                add("start", f"{where}: offset {off} is not the start of a line")
                continue
            lineno, true_len = line
            indexed.add(off)
            if ln != true_len:
                add(
                    "length",
                    f"{where}: length {ln}, but line {lineno} has {true_len} bytes "
                    "(without its newline)",
                )
                continue
            try:
                loads(buf[off : off + ln] if buf is not None else b"")
            except ValueError as e:
                add("json", f"{p.name} line {lineno} (byte {off}): indexed but not JSON ({e})")
        for off, (lineno, ln) in lines.items():
            if off in indexed:
                continue
            try:
                loads(buf[off : off + ln] if buf is not None else b"")
            except ValueError:
                continue  # left out on purpose (--skip-invalid)
            add(
                "missing",
                f"{p.name} line {lineno} (byte {off}): valid JSON but missing from "
                f"the index; rebuild it with `lmdata index --overwrite {p}`",
            )
        for msg in unindexed_problems(p, idx_path, index, buf):
            add("unindexed", msg)
    finally:
        release(buf)
    return rep.finish()


SPEC = FormatSpec(
    name="modalities-jsonl",
    kind="records",
    summary="raw JSONL with the .idx index modalities builds for it",
    detect=detector(detect, "modalities-jsonl"),
    open=open,
    writer=Writer,
    validate=validate,
    info=info,
    aliases=("modalities_jsonl",),
)
