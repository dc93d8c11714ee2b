"""Manifests of the Dolma toolkit's outputs: each folder a job writes files into (an attribute
set, ``<tree>/attributes/<name>/`` of tag, dedupe and decontaminate; a mix stream's output
folder) gets its own ``lmdata-manifest`` once every file of the job is there, written last.

It lists every file below that folder: the job's outputs hashed once the job is done (its files
come from many workers and server-side joins of pieces, so they are read once more here), the
other files (an earlier job's, into the same folder) carried from the folder's last manifest
where their size is unchanged, else hashed. A Dolma tree's own manifest (its writer's, at the
root) covers its documents; a folder with a manifest of its own is checked against that.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lmdata.errors import LmdataError
from lmdata.storage import manifest_check as mc
from lmdata.storage import parent, resolve


def attribute_folders(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """``{attribute folder: [attribute files]}`` for ``(document file, attribute file)``
    pairs: the folder is the attribute file's path without the part it shares with its
    document file below ``documents/`` (``<tree>/attributes/<name>``)."""
    out: dict[str, list[str]] = {}
    for doc, attr in pairs:
        d, a = doc.split("/"), attr.split("/")
        same = 0
        while same < min(len(d), len(a)) - 1 and d[-1 - same] == a[-1 - same]:
            same += 1
        out.setdefault("/".join(a[: len(a) - same]), []).append(attr)
    return out


def output_folders(outputs: Iterable[str]) -> dict[str, list[str]]:
    """``{folder: [files]}`` for output files written straight into their folder (mix)."""
    out: dict[str, list[str]] = {}
    for o in outputs:
        out.setdefault(parent(o), []).append(o)
    return out


def write(folders: dict[str, list[str]], storage_options: dict[str, Any] | None) -> None:
    """Write the manifest of each folder, its job's ``files`` hashed anew."""
    for folder, files in sorted(folders.items()):
        store, key = resolve(folder, storage_options)
        if not store.exists(key):
            continue  # the job wrote nothing there (no documents)
        mine = {resolve(f, storage_options)[1][len(key.rstrip("/")) + 1 :] for f in files}
        try:
            old = mc.find(store, key, True)
        except LmdataError:  # unreadable: every file is hashed anew
            old = None
        carried = {}
        if old is not None:
            carried = {e.name: e for e in old.manifest.files if e.name not in mine}
        mc.create(store, key, directory=True, carried=carried)


__all__ = ["attribute_folders", "output_folders", "write"]
