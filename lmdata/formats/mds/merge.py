"""``lmdata merge`` for streaming datasets: one index.json over partition folders.

Like streaming's ``merge_index``: the shard lists of the partitions' index.json files are
concatenated and each basename is prefixed with the partition's path relative to the output
folder (``"0/shard.00000.mds"``); the merged file has streaming's merged layout
(``{"version": 2, "shards": [...]}``, keys unsorted). Unlike it, JSONL partitions work,
partitions may sit at any depth below the output, and partitions outside the output folder
are linked (or copied) into it first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from lmdata._progress import OnProgress, Ticker
from lmdata.errors import InvalidInputError, LmdataError, OutputExistsError
from lmdata.formats._spec import MergeSummary
from lmdata.formats.mds.index import INDEX, load_index_json, split_dirs
from lmdata.storage import (
    LocalStore,
    Store,
    atomic_file,
    join,
    local_path,
    require_exists,
    resolve,
    scheme,
)
from lmdata.storage.manifest import NAME as MANIFEST
from lmdata.storage.manifest import FileEntry
from lmdata.storage.manifest import read as read_manifest
from lmdata.storage.manifest_check import create as create_manifest

_FILE_KEYS = ("raw_data", "zip_data", "raw_meta", "zip_meta")


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _partitions(inputs: list[str], out: Path) -> list[Path]:
    found: list[Path] = []
    for raw in inputs:
        p = require_exists(local_path(raw, "mds merge"))
        if (p / INDEX).is_file() and p.resolve() != out.resolve():
            found.append(p)
            continue
        subs = (
            sorted(
                (c for c in p.iterdir() if c.is_dir() and (c / INDEX).is_file()),
                key=lambda c: _natural(c.name),
            )
            if p.is_dir()
            else []
        )
        if not subs:
            raise InvalidInputError(
                "neither a dataset (no index.json) nor a folder of partitions", path=p
            )
        found.extend(subs)
    seen: set[Path] = set()
    unique = []
    for p in found:
        r = p.resolve()
        if r not in seen:
            seen.add(r)
            unique.append(p)
    return unique


def _rebased(shards: list[dict[str, Any]], rel: str) -> list[dict[str, Any]]:
    """A partition's shard entries with their files named from the output (``rel/NAME``)."""
    for shard in shards:
        for key in _FILE_KEYS:
            if shard.get(key):
                shard[key]["basename"] = f"{rel}/{shard[key]['basename']}"
    return shards


def _kept(objs: list[Any], names: list[str]) -> dict[str, Any] | None:
    """The partitions' one tokenizer record (refused if they differ), before anything is
    copied."""
    from lmdata import _provenance

    return _provenance.joined([_provenance.parse(o.get(_provenance.KEY)) for o in objs], names)


def _index(shards: list[dict[str, Any]], kept: dict[str, Any] | None) -> bytes:
    """The merged index.json: the shards, and the tokenizer record (under lmdata's key, which
    streaming ignores)."""
    from lmdata import _provenance

    extra = {} if kept is None else {_provenance.KEY: kept}
    return json.dumps({"version": 2, "shards": shards, **extra}).encode()


def _summary(parts: int, shards: list[dict[str, Any]], dest: str) -> MergeSummary:
    n = sum(s.get("samples", 0) for s in shards)
    return MergeSummary("mds", parts, dest, n)


def _part_bytes(obj: dict[str, Any]) -> int:
    """The uncompressed bytes of a partition's shards, as its index.json declares them."""
    n = 0
    for shard in obj["shards"]:
        for key in ("raw_data", "raw_meta"):
            b = (shard.get(key) or {}).get("bytes")
            n += b if isinstance(b, int) and b > 0 else 0
    return n


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _inside(part: Path, out: Path) -> str | None:
    rel = os.path.relpath(part.resolve(), out.resolve())
    if rel == "." or rel.startswith(".."):
        return None
    return Path(rel).as_posix()


def merge(
    inputs: list[str], output: str, overwrite: bool = False, progress: OnProgress | None = None
) -> MergeSummary:
    """Write ``output/index.json`` over the partitions in ``inputs``; returns a summary.
    ``progress`` counts the partitions' shard bytes (from their indexes), partition by
    partition, once every index is read."""
    if any(scheme(p) not in (None, "file") for p in (output, *inputs)):  # file:// is local
        return _merge_on_store(inputs, output, overwrite, progress)
    out = local_path(output, "mds merge")
    parts = _partitions(list(inputs), out)
    dest = out / INDEX
    if dest.exists() and not overwrite:
        raise OutputExistsError(
            "index.json already exists; pass overwrite=True (--overwrite)", path=dest
        )
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, Any]] = []
    placed: list[str] = []  # where each partition is, relative to the output
    objs = [load_index_json(LocalStore(), str(p / INDEX))[1] for p in parts]  # checked, once
    kept = _kept(objs, [str(p) for p in parts])
    tick = Ticker(progress, sum(_part_bytes(obj) for obj in objs), "merge")
    for part, obj in zip(parts, objs, strict=True):
        rel = _inside(part, out)
        if rel is None:
            target = out / part.name
            if target.exists():
                raise OutputExistsError(
                    f"cannot bring partition {part} into the output: {target.name} exists",
                    path=target,
                )
            shutil.copytree(part, target, copy_function=_link_or_copy)
            rel = part.name
        placed.append(rel)
        tick.add(_part_bytes(obj))
        shards.extend(_rebased(obj["shards"], rel))
    store = LocalStore()
    carried = _carried(store, str(out), placed)
    _drop_manifest(store, str(out))
    with atomic_file(dest, overwrite=overwrite) as tmp:
        tmp.write_bytes(_index(shards, kept))
    _write_manifest(store, str(out), shards, carried)
    return _summary(len(parts), shards, str(dest))


def _merge_on_store(
    inputs: list[str], output: str, overwrite: bool, progress: OnProgress | None
) -> MergeSummary:
    """:func:`merge` on an object store: the partitions are found by listing, those outside
    ``output`` are copied below it (server-side, same store only), and the merged index.json
    is written last as one object."""
    ostore, okey = resolve(output)
    okey = okey.rstrip("/")
    dest = join(okey, INDEX)
    if ostore.exists(dest) and not overwrite:
        raise OutputExistsError(
            "index.json already exists; pass overwrite=True (--overwrite)", path=ostore.url(dest)
        )
    parts: list[str] = []
    for raw in inputs:
        store, key = resolve(raw)
        if store.id != ostore.id:
            raise InvalidInputError(
                "partitions on a store are merged in that store: copy them below the output",
                path=store.url(key),
            )
        key = key.rstrip("/")
        if INDEX in ostore.list(key) and key != okey:
            found = [key]
        else:
            found = [join(key, n) for n in sorted(split_dirs(ostore, key), key=_natural)]
        if not found:
            raise InvalidInputError(
                "neither a dataset (no index.json) nor a folder of partitions",
                path=ostore.url(key),
            )
        parts.extend(p for p in found if p not in parts)
    shards: list[dict[str, Any]] = []
    objs = [load_index_json(ostore, join(p, INDEX))[1] for p in parts]
    kept = _kept(objs, [ostore.url(p) for p in parts])
    tick = Ticker(progress, sum(_part_bytes(obj) for obj in objs), "merge")
    for part, obj in zip(parts, objs, strict=True):
        if part.startswith(okey + "/"):
            rel = part[len(okey) + 1 :]
        else:
            rel = part.rsplit("/", 1)[-1]
            if ostore.exists(join(okey, rel)):
                raise OutputExistsError(
                    f"cannot bring partition {ostore.url(part)} into the output: {rel} exists",
                    path=ostore.url(join(okey, rel)),
                )
            ostore.copy_tree(part, join(okey, rel))
        tick.add(_part_bytes(obj))
        shards.extend(_rebased(obj["shards"], rel))
    carried = _carried(ostore, okey, [_rel(okey, p) for p in parts])
    _drop_manifest(ostore, okey)
    out = ostore.output(dest, directory=False, overwrite=overwrite)
    try:
        out.write_last("", _index(shards, kept))
        out.commit()
    except BaseException:
        out.abort()
        raise
    _write_manifest(ostore, okey, shards, carried)
    return _summary(len(parts), shards, ostore.url(dest))


def _rel(okey: str, part: str) -> str:
    """Where a partition lies below the output (one outside was copied in by its name)."""
    return part[len(okey) + 1 :] if part.startswith(okey + "/") else part.rsplit("/", 1)[-1]


def _carried(store: Store, out: str, rels: list[str]) -> dict[str, FileEntry]:
    """The files of the partitions (``rels``, below ``out``) as their own manifests list
    them, named from ``out``: the merged manifest keeps what their writers wrote."""
    found: dict[str, FileEntry] = {}
    for rel in rels:
        try:
            m = read_manifest(store, join(out, rel, MANIFEST))
        except LmdataError:
            m = None
        for e in m.files if m is not None else ():
            found[f"{rel}/{e.name}"] = e.renamed(f"{rel}/{e.name}")
    return found


def _drop_manifest(store: Store, out: str) -> None:
    """The merged folder's old manifest goes before its index changes (never a stale one)."""
    key = join(out, MANIFEST)
    if store.exists(key):
        store.remove(key)


def _write_manifest(
    store: Store, out: str, shards: list[dict[str, Any]], carried: dict[str, FileEntry]
) -> None:
    """The merged dataset's manifest: its index.json and every file below it, the
    partitions' files with the entries of their own manifests where they have them."""
    samples = sum(s.get("samples", 0) for s in shards if isinstance(s.get("samples"), int))
    create_manifest(store, out, directory=True, format="mds", records=samples, carried=carried)
