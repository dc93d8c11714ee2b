"""Every rule of the Atlas format checked, each problem reported with its shard and block."""

from __future__ import annotations

import os
from pathlib import PurePath
from typing import Any

import numpy as np

from lmdata import _provenance
from lmdata._progress import OnProgress, Ticker
from lmdata._report import MAX_REPORTED, ProblemReport
from lmdata.errors import LmdataError
from lmdata.formats.atlas.meta import (
    DATA,
    DICT,
    INDEX,
    META,
    ROOT_KEYS,
    SHARD_KEYS,
    Strategy,
    is_shard_name,
)
from lmdata.formats.atlas.reader import Atlas
from lmdata.storage import usage


def validate(
    path: str | os.PathLike[str],
    *,
    allow_unsafe_pickle: bool = False,
    progress: OnProgress | None = None,
    max_block_bytes: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """All problems in the Atlas dataset at ``path`` (empty when valid): metas, folder names,
    every offset, every block decoded and counted; ``progress`` counts data.bin bytes, shard
    by shard."""
    rep = ProblemReport()
    try:
        ds = Atlas(
            path,
            allow_unsafe_pickle=allow_unsafe_pickle,
            storage_options=storage_options,
            **({} if max_block_bytes is None else {"max_block_bytes": max_block_bytes}),
        )
    except LmdataError as e:
        return [str(e)]
    sizes = data_sizes(ds) if progress is not None else [0] * len(ds.shards)
    tick = Ticker(progress, sum(sizes), "validate")
    _check_layout(ds, ds.root, rep)
    for s in range(len(ds.shards)):
        _check_shard(ds, s, rep)
        tick.add(sizes[s])
    return rep.finish()


def data_sizes(ds: Atlas) -> list[int]:
    """The bytes of each shard's data.bin (0 where it is missing)."""
    return [
        ds.store.size(str(sh.folder / DATA)) if _is_file(ds, sh.folder / DATA) else 0
        for sh in ds.shards
    ]


def _is_file(ds: Atlas, p: PurePath) -> bool:
    return ds.store.exists(str(p)) and not ds.store.is_dir(str(p))


def _check_layout(ds: Atlas, root: PurePath, rep: ProblemReport) -> None:
    if ds.meta is None:  # a single shard opened on its own
        return
    shown = ds._shown  # keys as the user names them (full URLs on object stores)
    m = ds.meta
    if m.extra_keys:
        rep.add(
            "meta",
            f"{shown(root / META)}: extra keys {list(m.extra_keys)}; the origin's reader "
            f"accepts only {list(ROOT_KEYS)}",
        )
    others = [
        n
        for n in ds.store.list(str(root))
        if not is_shard_name(n) and ds.store.is_dir(str(root / n))
    ]
    if others:
        rep.add(
            "layout",
            f"{shown(root)}: folders {others} are not shards; the origin's reader treats "
            "every folder as a shard and fails on them",
        )
    names = [sh.folder.name for sh in ds.shards]
    numbers = [sh.number for sh in ds.shards]
    if not names:
        rep.add("layout", f"{shown(root)}: no shard folders (the origin's reader fails on len())")
        return
    if numbers != list(range(len(numbers))):
        rep.add(
            "layout",
            f"{shown(root)}: shard numbers are not 0..{len(numbers) - 1} without gaps "
            f"(found {numbers[:5]}...); examples after a gap shift position",
        )
    width = len(str(max(numbers)))
    if any(len(n) != width for n in names):
        rep.add(
            "layout",
            f"{shown(root)}: shard folder names are not all zero-padded to {width} "
            "digits (an unfinished write?); the origin's reader would read "
            "shards in the wrong order",
        )
    sizes = [sh.meta.stored_examples for sh in ds.shards]
    if list(m.shard_sizes) != sizes:
        rep.add(
            "meta",
            f"{shown(root / META)}: shard_sizes {list(m.shard_sizes)[:8]}... does not "
            f"match the shards' stored_examples {sizes[:8]}...",
        )
    strategies = {sh.meta.compression_strategy for sh in ds.shards}
    if m.compression_strategy == Strategy.SHARED_DICTIONARY_COMPRESSION:
        if not _is_file(ds, root / DICT):
            rep.add("dict", f"{shown(root)}: strategy 2 needs zstd_dict.bin at the root")
        # The origin's reader takes the shared dictionary only from a root saying strategy 2.
    elif Strategy.SHARED_DICTIONARY_COMPRESSION in strategies:
        rep.add(
            "meta",
            f"{shown(root / META)}: shards use strategy 2 but the root says "
            f"{int(m.compression_strategy)}; the origin's reader would not load the "
            "shared dictionary",
        )


def _check_shard(ds: Atlas, s: int, rep: ProblemReport) -> None:
    sh = ds.shards[s]
    f, meta = sh.folder, sh.meta
    shown = ds._shown  # keys as the user names them (full URLs on object stores)
    if meta.extra_keys:
        rep.add(
            "meta",
            f"{shown(f / META)}: extra keys {list(meta.extra_keys)}; the origin's reader "
            f"accepts only {list(SHARD_KEYS)}",
        )
    if meta.compression_strategy == Strategy.DICTIONARY_COMPRESSION and not _is_file(ds, f / DICT):
        rep.add("dict", f"{shown(f)}: strategy 3 needs the shard's own zstd_dict.bin")
        return
    try:
        idx = np.asarray(ds._shard_index(s))
    except LmdataError as e:
        rep.add("index", str(e))
        return
    trailing = ds._load_index(s)[1]
    if trailing:
        rep.add(
            "index",
            f"{shown(f / INDEX)}: {trailing} bytes follow the array (from byte "
            f"{ds.store.size(str(f / INDEX)) - trailing}); readers ignore them, so the file was "
            "appended to or overwritten in part: write the shard again",
        )
    if idx.dtype.kind != "u":
        rep.add(
            "index", f"{shown(f / INDEX)}: dtype {idx.dtype} is signed; Atlas offsets are unsigned"
        )
    if idx[0] != 0:
        rep.add("index", f"{shown(f / INDEX)}: the first offset is {idx[0]}, not 0")
    has_data = _is_file(ds, f / DATA)
    size = ds.store.size(str(f / DATA)) if has_data else 0
    if not has_data and meta.stored_examples:
        rep.add("data", f"{shown(f)}: missing data.bin")
        return
    if int(idx[-1]) != size:
        rep.add(
            "index",
            f"{shown(f / INDEX)}: the last offset is {int(idx[-1])} but data.bin has {size} bytes",
        )
    elif idx.dtype.kind == "u" and np.iinfo(idx.dtype).max < size:
        rep.add("index", f"{shown(f / INDEX)}: dtype {idx.dtype} cannot hold {size}")
    back = np.flatnonzero(np.diff(idx.astype(np.int64)) <= 0)
    for b in back[:MAX_REPORTED]:
        rep.add(
            "index",
            f"{shown(f / INDEX)}: block {int(b)} has offsets {int(idx[b])}.."
            f"{int(idx[b + 1])} (empty or backwards)",
        )
    skip = set(back.tolist())
    for b in range(meta.num_blocks):
        if b in skip:
            continue
        try:
            ds._read_block(s, b)
        except LmdataError as e:
            rep.add("block", str(e))


def info(
    path: str | os.PathLike[str],
    *,
    scan: bool = True,
    progress: OnProgress | None = None,
    allow_unsafe_pickle: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A summary for ``lmdata info``: counts, strategies, block sizes, sizes on disk (from the
    metadata: ``scan`` is accepted, nothing here reads the data; ``progress`` gets the data
    bytes summarised, once they are known)."""
    ds = Atlas(path, allow_unsafe_pickle=allow_unsafe_pickle, storage_options=storage_options)
    strategies: dict[str, int] = {}
    block_sizes: dict[str, int] = {}
    for sh in ds.shards:
        name = sh.meta.compression_strategy.name.lower()
        strategies[name] = strategies.get(name, 0) + 1
        block_sizes[str(sh.meta.block_size)] = block_sizes.get(str(sh.meta.block_size), 0) + 1
    data_bytes = sum(data_sizes(ds))
    Ticker(progress, data_bytes, "info").finish()
    url = ds.store.url(str(ds.root))
    out: dict[str, Any] = {
        "format": "atlas",
        "path": url,
        "examples": len(ds),
        "shards": len(ds.shards),
        "blocks": sum(sh.meta.num_blocks for sh in ds.shards),
        "compression_strategy": (
            ds.meta.compression_strategy.name.lower() if ds.meta else "single shard"
        ),
        "shard_strategies": strategies,
        "block_sizes": block_sizes,
        "compression_level": ds.shards[0].meta.compression_level if ds.shards else None,
        "data_bytes": data_bytes,
    }
    used = usage(url)
    out["bytes_on_disk"], out["apparent_bytes"] = used.disk, used.apparent
    if ds.meta and _is_file(ds, ds.root / DICT):
        out["shared_dict_bytes"] = ds.store.size(str(ds.root / DICT))
    prov = _provenance.read_file(ds.store, str(ds.root / _provenance.FILE))
    if prov is not None:
        out["provenance"] = prov
    return out
