"""Manifests at the level of datasets: what ``open``, ``validate``, ``info`` and
``lmdata manifest`` ask of them (the format-independent parts live in :mod:`lmdata.storage`).

A dataset folder's manifest covers every file below it; a one-file dataset's covers the file
and the files its format keeps beside it (``FormatSpec.companions``: a JSONL file's ``.idx``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmdata._progress import OnProgress, Progress, relabelled
from lmdata.errors import CorruptDataError, InvalidInputError, LmdataError, OutputExistsError
from lmdata.formats import FormatSpec
from lmdata.storage import basename, join, parent, resolve
from lmdata.storage import manifest_check as mc


def verify(path: Any, spec: FormatSpec, split: str | None, reader: Any = None) -> None:
    """Check the dataset's files against its manifest by names and sizes (one listing): a
    difference is a CorruptDataError naming the file. A split kept in a folder of its own
    (MDS) is checked against that folder's manifest too. Given the ``reader`` just opened
    (object stores), its store is used: the listings it made serve the check."""
    store, key = resolve(path)
    mine = getattr(reader, "store", None)
    if mine is not None and getattr(mine, "id", None) == store.id:
        store = mine
    mc.verify(store, key)
    if split is not None and spec.has_splits and not spec.splits:
        sub = join(key, split)
        if store.is_dir(sub):
            mc.verify(store, sub, is_dir=True)


def problems(
    path: Any,
    deep: bool,
    progress: OnProgress | None,
    run_format: Callable[[OnProgress | None], list[str]],
) -> list[str]:
    """The dataset's differences from its manifest (names and sizes; every block with
    ``deep``), then its format's problems (``run_format(progress)``); ``progress`` counts
    the format's bytes and then those hashed."""
    store, key = resolve(path)
    out: list[str] = []
    try:
        found = mc.find(store, key)
    except LmdataError as e:
        found = None
        out.append(str(e))
    listing: list[mc.Problem] = []
    if found is not None:
        listing = mc.listing_problems(store, found)
        out += [f"{store.url(join(found.folder, p.name))}: {p.detail}" for p in listing]
    hashed = 0
    if deep and found is not None:
        skip = {p.name for p in listing}
        hashed = sum(e.size for e in found.manifest.files if e.name not in skip)
    seen = [0]

    def format_progress(e: Progress) -> None:
        seen[0] = e.total or 0
        assert progress is not None
        progress(Progress(e.done, seen[0] + hashed, e.unit, e.what))

    out += run_format(format_progress if progress is not None else None)
    if deep and found is not None:
        prog = relabelled(progress, "validate", seen[0], seen[0] + hashed)
        for p in mc.deep_problems(store, found, {p.name for p in listing}, prog):
            out.append(f"{store.url(join(found.folder, p.name))}: {p.detail}")
    return out


def recorded_format(path: Any) -> str | None:
    """The format the dataset's manifest names (if it has a readable one naming a known
    format): what lmdata falls back on when the files no longer tell it."""
    from lmdata import formats

    try:
        store, key = resolve(path)
        found = mc.find(store, key)
    except (LmdataError, OSError):
        return None
    name = found.manifest.format if found is not None else None
    return name if name in formats.names() else None


def summary(path: Any) -> dict[str, Any] | str:
    """What ``info`` shows of the dataset's manifest: when and by what it was made, its files,
    bytes and records; ``"none"`` without one."""
    store, key = resolve(path)
    try:
        found = mc.find(store, key)
    except LmdataError as e:
        return f"unreadable: {e}"
    if found is None:
        return "none"
    m = found.manifest
    out: dict[str, Any] = {"file": store.url(found.key), "made": mc.modified(store, found.key)}
    if m.made_by:
        out["made_by"] = m.made_by
    out["files"] = len(m.files)
    out["bytes"] = m.total_bytes
    if m.records is not None:
        out["records"] = m.records
    return out


def check(
    path: Any, progress: OnProgress | None = None, workers: int | None = None
) -> tuple[mc.Found, list[str]]:
    """Every difference between the dataset and its manifest, each block hashed; an
    InvalidInputError if it has no manifest."""
    store, key = resolve(path)
    found = mc.find(store, key)
    if found is None:
        raise InvalidInputError(
            "the dataset has no manifest; `lmdata manifest PATH` writes one (after validating "
            "the data)",
            path=store.url(key),
        )
    listing = mc.listing_problems(store, found)
    skip = {p.name for p in listing}
    prog = relabelled(progress, "manifest --check")
    deep = mc.deep_problems(store, found, skip, prog, workers)
    return found, [f"{store.url(join(found.folder, p.name))}: {p.detail}" for p in listing + deep]


def create(
    path: Any,
    spec: FormatSpec,
    *,
    overwrite: bool,
    validate: Callable[[], list[str]],
    records: Callable[[], int | None],
    progress: OnProgress | None = None,
    workers: int | None = None,
) -> mc.Manifest:
    """Write a manifest for the dataset at ``path`` (written by another tool), once its
    format's ``validate()`` finds nothing wrong; ``records()`` is its record count."""
    store, key = resolve(path)
    directory = store.is_dir(key)
    existing = mc.find(store, key, directory)
    if existing is not None and not overwrite:
        raise OutputExistsError(
            "the dataset has a manifest already; `lmdata manifest --check` verifies the data "
            "against it, --overwrite replaces it (after validating the data)",
            path=store.url(existing.key),
        )
    found = validate()
    if found:
        shown = "; ".join(found[:3]) + (f"; ... ({len(found)} problems)" if len(found) > 3 else "")
        raise CorruptDataError(
            f"not valid, so no manifest was written: {shown}. `lmdata validate` lists the problems",
            path=store.url(key),
        )
    names = None
    if not directory:
        names = [basename(key)]
        for c in spec.companions(key) if spec.companions else ():
            if parent(c) == parent(key) and store.exists(c):
                names.append(basename(c))
    try:
        n = records()
    except LmdataError:
        n = None
    return mc.create(
        store,
        key,
        directory=directory,
        names=names,
        format=spec.name,
        records=n,
        progress=progress,
        workers=workers,
    )
