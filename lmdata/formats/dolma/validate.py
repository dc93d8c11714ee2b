"""Every rule of the Dolma data format, checked line by line, each failure with file:line.

Documents: one JSON object per line; ``id``, ``text``, ``source`` present and strings;
``added``, ``created``, ``version`` strings and ``metadata`` an object when present; ids unique
within a source. Attributes (``attributes/<name>/`` mirroring ``documents/``): one row per
document with the same id in the same order, an ``attributes`` object, and span lists of the
form ``[start, end, score]`` with ``0 <= start <= end`` (other JSON values are accepted, as
dolma's mixer merges any value).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson
import xxhash

from lmdata._progress import OnProgress, Ticker
from lmdata._report import ProblemReport
from lmdata.errors import LmdataError
from lmdata.formats.dolma._files import MAX_LINE_BYTES, iter_raw_lines
from lmdata.formats.dolma._paths import (
    attribute_path,
    documents_dir,
    is_doc_file,
    is_file,
    list_documents,
    tree_root,
    walk_files,
)
from lmdata.storage import Store, basename, join, parent, resolve

REQUIRED = ("id", "text", "source")
OPTIONAL_STR = ("added", "created", "version")


def _type(v: Any) -> str:
    return (
        "null"
        if v is None
        else {
            "str": "string",
            "int": "integer",
            "float": "number",
            "bool": "boolean",
            "dict": "object",
            "list": "array",
        }.get(type(v).__name__, type(v).__name__)
    )


def _lines(
    store: Store,
    key: str,
    rep: ProblemReport,
    max_line_bytes: int = MAX_LINE_BYTES,
    read: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """(line, parsed object or None when it is not a JSON object) — problems are reported;
    ``read(n)`` is told of the stored bytes read, chunk by chunk."""
    path = store.url(key)
    try:
        for lineno, raw in iter_raw_lines(store, key, max_line_bytes=max_line_bytes, read=read):
            where = f"{path}:{lineno}"
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                what = "empty line" if not raw.strip() else f"invalid JSON ({e})"
                rep.add("json", f"{where}: {what}")
                yield lineno, None
                continue
            if not isinstance(obj, dict):
                rep.add("json", f"{where}: a JSON {_type(obj)} where an object was expected")
                yield lineno, None
                continue
            yield lineno, obj
    except LmdataError as e:
        rep.add("file", str(e))


def _check_doc(doc: dict[str, Any], where: str, rep: ProblemReport) -> None:
    for k in REQUIRED:
        if k not in doc:
            rep.add(
                f"missing-{k}",
                f"{where}: missing mandatory field '{k}' "
                "(every document needs id, text and source)",
            )
        elif not isinstance(doc[k], str):
            fix = ' (dolma compares ids as strings: write it as "...")' if k == "id" else ""
            rep.add(f"type-{k}", f"{where}: '{k}' must be a string, got {_type(doc[k])}{fix}")
    for k in OPTIONAL_STR:
        if k in doc and not isinstance(doc[k], str):
            rep.add(f"type-{k}", f"{where}: '{k}' must be a string, got {_type(doc[k])}")
    if "metadata" in doc and not isinstance(doc["metadata"], dict):
        rep.add(
            "type-metadata", f"{where}: 'metadata' must be an object, got {_type(doc['metadata'])}"
        )
    if "attributes" in doc and not isinstance(doc["attributes"], dict):
        rep.add(
            "type-attributes",
            f"{where}: 'attributes' must be an object, got {_type(doc['attributes'])}",
        )


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_value(key: str, value: Any) -> str | None:
    """What is wrong with one attribute value, or None (span lists are checked in full)."""
    if not isinstance(value, list):
        return None
    for i, span in enumerate(value):
        if not isinstance(span, list) or len(span) != 3:
            return (
                f"attribute '{key}' span {i}: expected [start, end, score], got "
                f"{orjson.dumps(span).decode()[:80]}"
            )
        s, e, score = span
        if (
            not (isinstance(s, int) and isinstance(e, int))
            or isinstance(s, bool)
            or isinstance(e, bool)
        ):
            return f"attribute '{key}' span {i}: start and end must be integers, got {s!r}, {e!r}"
        if not 0 <= s <= e:
            return f"attribute '{key}' span {i}: needs 0 <= start <= end, got [{s}, {e}]"
        if not _is_num(score):
            return f"attribute '{key}' span {i}: score must be a number, got {_type(score)}"
    return None


def _check_attr_row(row: dict[str, Any], doc_id: Any, where: str, rep: ProblemReport) -> None:
    if "id" not in row:
        rep.add("attr-id", f"{where}: attribute row has no 'id'")
    elif row["id"] != doc_id or type(row["id"]) is not type(doc_id):
        rep.add(
            "attr-id",
            f"{where}: attribute row id {row['id']!r} does not match the "
            f"document id {doc_id!r} on the same line (rows must line up)",
        )
    attrs = row.get("attributes")
    if not isinstance(attrs, dict):
        rep.add(
            "attr-object",
            f"{where}: attribute row needs an 'attributes' object, got {_type(attrs)}",
        )
        return
    for k, v in attrs.items():
        msg = check_value(k, v)
        if msg:
            rep.add("attr-span", f"{where}: {msg}")


def attribute_sets(store: Store, root: str) -> list[str]:
    """Names of the attribute sets of a tree (the folders below ``attributes/``)."""
    adir = join(root, "attributes")
    return sorted(
        n for n in store.list(adir) if not n.startswith(".") and store.is_dir(join(adir, n))
    )


def validate(
    path: str | os.PathLike[str],
    attributes: list[str] | None = None,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    storage_options: dict[str, Any] | None = None,
    progress: OnProgress | None = None,
) -> list[str]:
    """All problems found in the Dolma tree at ``path`` (empty when it is valid); a line
    longer than ``max_line_bytes`` is reported and ends the check of its file. ``progress``
    counts the bytes of the document files (as stored) as they are read."""
    store, key = resolve(path, storage_options)
    root = tree_root(store, key)
    rep = ProblemReport()
    try:
        files = list_documents(store, root)
    except LmdataError as e:
        return [str(e)]
    if not files:
        return [
            f"{store.url(documents_dir(store, root))}: no document files "
            "(*.jsonl.gz, *.jsonl, *.jsonl.zst)"
        ]
    names = attribute_sets(store, root) if attributes is None else list(attributes)
    hashes: list[np.ndarray] = []
    where_of: list[np.ndarray] = []
    sizes = file_sizes(store, files) if progress is not None else [0] * len(files)
    tick = Ticker(progress, sum(sizes), "validate")
    for k, f in enumerate(files):
        ids: list[Any] = []
        h = []
        fu = store.url(f)
        before = tick.done
        read = tick.add if progress is not None else None  # within a file too, chunk by chunk
        for lineno, doc in _lines(store, f, rep, max_line_bytes, read):
            if doc is None:
                ids.append(None)
                continue
            _check_doc(doc, f"{fu}:{lineno}", rep)
            did = doc.get("id")
            ids.append(did)
            if isinstance(did, str) and isinstance(doc.get("source"), str):
                h.append(
                    (xxhash.xxh3_64_intdigest(f"{doc['source']}\0{did}".encode()), k << 40 | lineno)
                )
        if h:
            arr = np.array(h, dtype=np.uint64)
            hashes.append(arr[:, 0])
            where_of.append(arr[:, 1])
        for name in names:
            _check_attribute_file(store, f, name, ids, rep, max_line_bytes)
        tick.to(before + sizes[k])
    for name in names:
        _orphans(store, root, name, set(files), rep)
    if hashes:
        _duplicates(store, np.concatenate(hashes), np.concatenate(where_of), files, rep)
    return rep.finish()


def file_sizes(store: Store, keys: list[str]) -> list[int]:
    """The stored bytes of each file in ``keys``, from one listing per folder (0 for a file
    the listing does not show)."""
    listed: dict[str, dict[str, int]] = {}
    out = []
    for k in keys:
        d = parent(k)
        if d not in listed:
            try:
                listed[d] = store.sizes(d)
            except OSError:
                listed[d] = {}
        out.append(listed[d].get(basename(k), 0))
    return out


def _check_attribute_file(
    store: Store,
    f: str,
    name: str,
    ids: list[Any],
    rep: ProblemReport,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> None:
    ap = attribute_path(f, name)
    apu = store.url(ap)
    if not is_file(store, ap):
        rep.add(
            "attr-missing", f"{apu}: missing: attribute set '{name}' has no file for {store.url(f)}"
        )
        return
    n = 0
    for lineno, row in _lines(store, ap, rep, max_line_bytes):
        n = lineno
        if lineno > len(ids):
            continue
        if row is not None:
            _check_attr_row(row, ids[lineno - 1], f"{apu}:{lineno}", rep)
    if n != len(ids):
        rep.add(
            "attr-rows",
            f"{apu}: {n} rows for the {len(ids)} documents of {store.url(f)} "
            "(one row per document, in the same order)",
        )


def _orphans(store: Store, root: str, name: str, docs: set[str], rep: ProblemReport) -> None:
    adir = join(root, "attributes", name)
    ddir = documents_dir(store, root)
    cut = len(adir.rstrip("/")) + 1
    for k in sorted(walk_files(store, adir)):
        if not is_doc_file(k.rsplit("/", 1)[-1]):
            continue
        rel = k[cut:]
        if join(ddir, rel) not in docs:
            rep.add(
                "attr-orphan",
                f"{store.url(k)}: attribute file with no document file documents/{rel}",
            )


def _duplicates(
    store: Store, h: np.ndarray, where: np.ndarray, files: list[str], rep: ProblemReport
) -> None:
    """Ids seen twice within a source: hash first, then confirm the candidates exactly."""
    order = np.argsort(h, kind="stable")
    hs = h[order]
    dup = np.nonzero(hs[1:] == hs[:-1])[0]
    if dup.size == 0:
        return
    cand = np.unique(np.concatenate([order[dup], order[dup + 1]]))
    wanted: dict[int, set[int]] = defaultdict(set)
    for w in where[cand].tolist():
        wanted[w >> 40].add(w & ((1 << 40) - 1))
    first: dict[tuple[str, str], str] = {}
    for k in sorted(wanted):
        last = max(wanted[k])
        try:
            for lineno, raw in iter_raw_lines(store, files[k]):
                if lineno > last:
                    break
                if lineno in wanted[k]:
                    doc = orjson.loads(raw)
                    key = (doc["source"], doc["id"])
                    here = f"{store.url(files[k])}:{lineno}"
                    if key in first:
                        rep.add(
                            "dup-id",
                            f"{here}: id {key[1]!r} already used in source "
                            f"{key[0]!r} at {first[key]} (ids must be unique within "
                            "a source)",
                        )
                    else:
                        first[key] = here
        except LmdataError:  # damage after these lines, already reported by the first pass
            pass
