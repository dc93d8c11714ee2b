"""The Dolma toolkit's outputs in their tree's manifest.

A Dolma tree's manifest lies at its root (``<tree>/lmdata-manifest``), beside ``documents/`` and
``attributes/``, never inside them: dolma's globs (``documents/*``, ``attributes/<name>/*``)
never meet it. It lists the files lmdata wrote into the tree: the Dolma writer's documents
files, then what each toolkit job wrote there (tag, dedupe and decontaminate: their attribute
files; mix: its shards, when its output folder is a tree's ``documents/``), added when the job
is done, every other entry kept as it was (see :func:`lmdata.storage.manifest_check.update`).
A job's files come from many workers and server-side joins of pieces, so they are hashed once
more when it is done. A mix output folder in no tree (no ``documents`` in its path) gets none:
its folder holds the origin's shards only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lmdata.storage import basename, parent, resolve
from lmdata.storage import manifest_check as mc


def tree_of_attributes(doc: str, attr: str) -> str | None:
    """The tree of an attribute file written for document file ``doc``: ``<tree>`` of
    ``<tree>/attributes/<name>/<the document's path below documents/>``."""
    d, a = doc.split("/"), attr.split("/")
    same = 0
    while same < min(len(d), len(a)) - 1 and d[-1 - same] == a[-1 - same]:
        same += 1
    folder = "/".join(a[: len(a) - same])  # <tree>/attributes/<name>
    return parent(parent(folder)) if basename(parent(folder)) == "attributes" else None


def tree_of_documents(path: str, documents: str = "documents") -> str | None:
    """The tree of a file written below a ``documents`` folder (the last one in its path)."""
    head, sep, rest = path.rpartition("://")
    parts = rest.split("/")
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == documents:
            return head + sep + "/".join(parts[:i])
    return None


def record(
    written: Iterable[tuple[str | None, str]], storage_options: dict[str, Any] | None
) -> None:
    """Add each ``(tree, file)`` a job wrote to its tree's manifest (files of no tree, whose
    tree is None, are left out), once per tree."""
    trees: dict[str, list[str]] = {}
    for tree, f in written:
        if tree is not None:
            trees.setdefault(tree, []).append(f)
    for tree, files in sorted(trees.items()):
        store, key = resolve(tree, storage_options)
        base = key.rstrip("/") + "/"
        names = [k[len(base) :] for k in (resolve(f, storage_options)[1] for f in files)]
        mc.update(store, key, [n for n in names if n and not n.startswith("/")])


def record_attributes(
    pairs: Iterable[tuple[str, str]], storage_options: dict[str, Any] | None
) -> None:
    """:func:`record` for the attribute files of ``(document file, attribute file)`` pairs."""
    record(((tree_of_attributes(d, a), a) for d, a in pairs), storage_options)


__all__ = ["record", "record_attributes", "tree_of_attributes", "tree_of_documents"]
