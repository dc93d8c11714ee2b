"""Paths of a Dolma tree: which names are documents and where their attributes live, in any
:class:`lmdata.storage.Store` (the listing and globbing are :mod:`lmdata.storage.listing`'s).
"""

from __future__ import annotations

import glob
import os
from typing import Any

from lmdata.errors import FormatError
from lmdata.storage import Store, basename, is_url, join, parent, resolve, scheme
from lmdata.storage import shown as shown

# re-exported: the Dolma modules take their listing from here
from lmdata.storage.listing import glob_keys, walk_files
from lmdata.storage.listing import is_file as is_file
from lmdata.storage.paths import COMMITTING

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


# what an lmdata writer puts in a tree while it moves the tree's files into place on an object
# store (the tree is unfinished until it goes); dolma itself writes no such thing
COMMIT_MARKER = f"documents/{COMMITTING}"


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


class Stores:
    """``(store, key)`` for the many paths of one job, with one store per scheme (a
    filesystem client is made once, not once per file)."""

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = storage_options
        self._by_id: dict[str, Store] = {}

    def __call__(self, path: str | os.PathLike[str]) -> tuple[Store, str]:
        store, key = resolve(path, self.storage_options)
        return self._by_id.setdefault(store.id, store), key


def documents_dir(store: Store, root: str, name: str = "documents") -> str:
    """The documents folder (``name``: dolma's ``document_dir``) of a tree given as the tree
    root or as the folder itself."""
    if basename(root) == name and store.is_dir(root):
        return root
    return join(root, name)


def tree_root(store: Store, key: str) -> str:
    """The tree of a path given as the tree root or as its ``documents`` folder."""
    return parent(key) if basename(key) == "documents" and store.is_dir(key) else key


def list_documents(store: Store, root: str, name: str = "documents") -> list[str]:
    """Every document file below ``root/<name>``, sorted by relative path (input order)."""
    ddir = documents_dir(store, root, name)
    if not store.is_dir(ddir):
        raise FormatError(
            f"not a Dolma tree: no {name}/ folder (a Dolma dataset keeps its JSONL files under "
            f"<dataset>/{name}/)",
            path=store.url(root),
        )
    listed = list(walk_files(store, ddir))
    refuse_unfinished(store, root, listed)
    out = [k for k in listed if is_doc_file(basename(k))]
    cut = len(ddir.rstrip("/")) + 1
    return sorted(out, key=lambda k: k[cut:].replace(os.sep, "/"))


def refuse_unfinished(store: Store, root: str, keys: list[str]) -> None:
    """FormatError if the listing ``keys`` of a tree's documents holds the marker of an lmdata
    commit in progress or cut short (:data:`COMMIT_MARKER`): its files are not all in place."""
    if any(basename(k) == COMMITTING for k in keys):
        raise FormatError(
            "an lmdata writer is putting this tree in place, or was stopped while doing so: "
            "its files are not all there yet. Wait for the writer; if none is running, "
            f"`lmdata clean {store.url(root)} --claims` finishes its commit",
            path=store.url(root),
        )


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
            walked: list[str] = []
            found = glob_keys(store, key, walked)
            folders = {parent(k) for k in found}  # a tree being committed marks its folder
            marked = [k for k in walked if basename(k) == COMMITTING and parent(k) in folders]
            if marked:
                refuse_unfinished(store, parent(parent(marked[0])), marked)
            matches = [store.url(k) for k in found]
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


def attribute_path(doc_path: str, name: str, documents: str = "documents") -> str:
    """Where attribute set ``name`` of a document file lives: the last ``documents`` component
    of the path (a key or a URL) replaced by ``attributes/<name>`` (dolma substitutes the same
    component; its dedupe's ``document_dir`` names another)."""
    head, sep, path = doc_path.rpartition("://")
    parts = path.split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == documents:
            return head + sep + "/".join([*parts[:i], "attributes", name, *parts[i + 1 :]])
    raise FormatError(
        f"the document path has no '{documents}' component, so its attributes have no place; "
        f"keep document files under <dataset>/{documents}/",
        path=doc_path,
    )
