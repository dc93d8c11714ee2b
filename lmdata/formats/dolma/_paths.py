"""Paths of a Dolma tree: which names are documents, where their attributes live, and the
listing and globbing of files in any :class:`lmdata.storage.Store` (local paths and
``memory://``, ``s3://``, ``gs://`` URLs alike).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmdata.errors import FormatError, InvalidInputError
from lmdata.storage import LocalStore, Store, basename, is_url, join, parent, resolve, scheme

# Extensions dolma reads (compression is inferred from the name, like smart_open / src/io.rs).
DOC_SUFFIXES = (
    ".jsonl.gz",
    ".json.gz",
    ".jsonl.zst",
    ".json.zst",
    ".jsonl.zstd",
    ".jsonl",
    ".json",
)


def is_doc_file(name: str) -> bool:
    return name.endswith(DOC_SUFFIXES) and not name.startswith(".")


def codec_of(path: str | os.PathLike[str]) -> str:
    """``gz``, ``zst`` or ``none``."""
    name = os.fspath(path)
    if name.endswith(".gz"):
        return "gz"
    if name.endswith((".zst", ".zstd")):
        return "zst"
    return "none"


def shown(store: Store, key: str) -> Path | str:
    """How a file is handed to users: a local Path, or the URL of an object."""
    return Path(key) if isinstance(store, LocalStore) else store.url(key)


class Stores:
    """``(store, key)`` for the many paths of one job, with one store per scheme (a
    filesystem client is made once, not once per file)."""

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = storage_options
        self._by_id: dict[str, Store] = {}

    def __call__(self, path: str | os.PathLike[str]) -> tuple[Store, str]:
        store, key = resolve(path, self.storage_options)
        return self._by_id.setdefault(store.id, store), key


def is_file(store: Store, key: str) -> bool:
    """True if ``key`` is a file (one metadata request on object stores, not two)."""
    if isinstance(store, LocalStore):
        return os.path.isfile(key)
    try:
        store.size(key)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False
    return True


def documents_dir(store: Store, root: str) -> str:
    """The ``documents`` folder of a tree given as the tree root or as the folder itself."""
    if basename(root) == "documents" and store.is_dir(root):
        return root
    return join(root, "documents")


def tree_root(store: Store, key: str) -> str:
    """The tree of a path given as the tree root or as its ``documents`` folder."""
    return parent(key) if basename(key) == "documents" and store.is_dir(key) else key


def walk_files(store: Store, top: str) -> Iterator[str]:
    """Keys of every file below ``top`` (hidden folders skipped), in no particular order."""
    if isinstance(store, LocalStore):  # scandir: one call per folder
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            yield from (os.path.join(dirpath, f) for f in files)
        return
    fs = getattr(store, "fs", None)
    if fs is not None:  # fsspec: one recursive listing, not one request per folder and entry
        base = top.rstrip("/") + "/"
        for k in fs.find(top):
            hidden = any(p.startswith(".") for p in k[len(base) :].split("/")[:-1])
            if k.startswith(base) and not hidden:
                yield k
        return
    todo = [top]
    while todo:
        d = todo.pop()
        for name in store.list(d):
            key = join(d, name)
            if store.is_dir(key):
                if not name.startswith("."):
                    todo.append(key)
            else:
                yield key


def list_documents(store: Store, root: str) -> list[str]:
    """Every document file below ``root/documents``, sorted by relative path (input order)."""
    ddir = documents_dir(store, root)
    if not store.is_dir(ddir):
        raise FormatError(
            "not a Dolma tree: no documents/ folder (a Dolma dataset keeps its JSONL files under "
            "<dataset>/documents/)",
            path=store.url(root),
        )
    out = [k for k in walk_files(store, ddir) if is_doc_file(basename(k))]
    cut = len(ddir.rstrip("/")) + 1
    return sorted(out, key=lambda k: k[cut:].replace(os.sep, "/"))


def _component_regex(part: str) -> str:
    """A glob of one path component as a regex that never crosses a ``/``."""
    out = []
    i = 0
    while i < len(part):
        c = part[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            start = i + (part[i : i + 1] == "!")
            end = part.find("]", start + (part[start : start + 1] == "]"))
            if end < 0:
                out.append(re.escape(c))
                continue
            body = part[i:end]
            neg = body.startswith("!")
            # as fnmatch: every character of the set literal ("[^a]" is "^" or "a")
            body = re.sub(r"([\\\[^&~|])", r"\\\1", body[1:] if neg else body)
            out.append("[" + ("^" if neg else "") + body + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
    return "".join(out)


def glob_keys(store: Store, pattern: str) -> list[str]:
    """Keys of the files matching ``pattern`` (``*``, ``?``, ``[..]`` within a name, ``**``
    over folders; names starting with a dot only when the pattern says so), sorted."""
    parts = pattern.split("/")
    first = next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))
    if first == len(parts):
        return [pattern] if is_file(store, pattern) else []
    top = "/".join(parts[:first]) or "/"
    rest = parts[first:]
    rx = []
    for i, p in enumerate(rest):
        last = i == len(rest) - 1
        if p == "**":
            rx.append(r"[^/.][^/]*(?:/[^/.][^/]*)*" if last else r"(?:[^/.][^/]*/)*")
        else:
            hidden = "" if p.startswith(".") else r"(?!\.)"
            rx.append(hidden + _component_regex(p) + ("" if last else "/"))
    try:
        regex = re.compile("".join(rx) + r"\Z", re.S)
    except re.error as e:  # e.g. a reversed range "[z-a]"
        raise InvalidInputError(f"bad glob pattern {pattern!r}: {e}") from None
    cut = len(top.rstrip("/")) + 1
    hits = [k for k in walk_files(store, top) if regex.match(k[cut:])]
    return sorted(hits)


def expand_globs(
    patterns: list[str] | tuple[str, ...],
    base: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Document files (local paths or URLs, as given) matching ``patterns`` (``**``
    allowed), each pattern's matches sorted, duplicates dropped; relative local patterns are
    taken from ``base`` (default: the cwd)."""
    seen: set[str] = set()
    out: list[str] = []
    for pat in patterns:
        if is_url(pat) and scheme(pat) != "file":
            store, key = resolve(pat, storage_options)
            matches = [store.url(k) for k in glob_keys(store, key)]
        else:
            pat = str(resolve(pat)[1]) if is_url(pat) else pat
            full = pat if base is None or os.path.isabs(pat) else os.path.join(base, pat)
            matches = sorted(glob.glob(full, recursive=True))
            if not matches and not glob.has_magic(full) and os.path.isfile(full):
                matches = [full]
            matches = [m for m in matches if os.path.isfile(m)]
        for m in matches:
            if m not in seen:
                seen.add(m)
                out.append(m)
    return out


def attribute_path(doc_path: str, name: str) -> str:
    """Where attribute set ``name`` of a document file lives: the last ``documents`` component
    of the path (a key or a URL) replaced by ``attributes/<name>`` (dolma substitutes the same
    component)."""
    head, sep, path = doc_path.rpartition("://")
    parts = path.split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "documents":
            return head + sep + "/".join([*parts[:i], "attributes", name, *parts[i + 1 :]])
    raise FormatError(
        "the document path has no 'documents' component, so its attributes have no place; "
        "keep document files under <dataset>/documents/",
        path=doc_path,
    )
