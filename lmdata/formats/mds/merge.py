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

from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats.mds.index import INDEX, load_index_json
from lmdata.storage import LocalStore, atomic_file, local_path, require_exists

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


def merge(inputs: list[str], output: str, overwrite: bool = False) -> str:
    """Write ``output/index.json`` over the partitions in ``inputs``; returns a summary."""
    out = local_path(output, "mds merge")
    parts = _partitions(list(inputs), out)
    dest = out / INDEX
    if dest.exists() and not overwrite:
        raise OutputExistsError(
            "index.json already exists; pass overwrite=True (--overwrite)", path=dest
        )
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, Any]] = []
    for part in parts:
        _, obj = load_index_json(LocalStore(), str(part / INDEX))  # checked, parsed once
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
        for shard in obj["shards"]:
            for key in _FILE_KEYS:
                if shard.get(key):
                    shard[key]["basename"] = f"{rel}/{shard[key]['basename']}"
            shards.append(shard)
    with atomic_file(dest, overwrite=overwrite) as tmp:
        tmp.write_text(json.dumps({"version": 2, "shards": shards}), encoding="utf-8")
    n = sum(s.get("samples", 0) for s in shards)
    return f"merged {len(parts)} partitions ({len(shards)} shards, {n} samples) -> {dest}"
