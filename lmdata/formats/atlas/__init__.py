"""atlas (torch-atlas-ds): examples pickled in blocks, blocks in shards, optional zstd.

Exports :data:`SPEC` (the registry's entry) and the verbs behind it: :func:`detect`,
:func:`open`, :class:`Writer`, :func:`validate`, :func:`info`, :func:`merge`.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from lmdata import _json
from lmdata._lazy import lazy_exports
from lmdata._progress import OnProgress, Ticker
from lmdata.errors import InvalidInputError, LmdataError, StorageError
from lmdata.formats._spec import (
    FormatSpec,
    MergeSummary,
    TokenTarget,
    column_sink,
    detector,
    lazy,
)
from lmdata.formats.atlas.meta import MAX_META_BYTES, Strategy
from lmdata.storage import join, resolve

if TYPE_CHECKING:
    from lmdata.formats.atlas.reader import Atlas

# The reader, writer and checks load on first use (the writer and validate with what they
# import, 0.15 s): detecting the format, or opening a dataset to read it, needs none of them.
__getattr__ = lazy_exports(
    __name__, {"Atlas": "lmdata.formats.atlas.reader", "Writer": "lmdata.formats.atlas.writer"}
)
validate = lazy("lmdata.formats.atlas.validate:validate")
info = lazy("lmdata.formats.atlas.validate:info")

__all__ = [
    "SPEC",
    "Atlas",
    "Strategy",
    "Writer",
    "detect",
    "info",
    "merge",
    "open",
    "validate",
]


def detect(path: str | os.PathLike[str]) -> bool:
    """A folder whose meta.json is an Atlas root meta (version, shard_sizes, strategy)."""
    try:
        store, key = resolve(path)
        p = join(key, "meta.json")
        if not store.exists(p) or store.is_dir(p) or store.size(p) > MAX_META_BYTES:
            return False
        d = _json.parse(store.read(p, MAX_META_BYTES), _json.MAX_METADATA_DEPTH)
    except StorageError:  # the store failed: say so, not "not this format"
        raise
    except (OSError, ValueError, UnicodeError, LmdataError):
        return False
    return isinstance(d, dict) and {"version", "shard_sizes", "compression_strategy"} <= d.keys()


# open(path, *, allow_unsafe_pickle, max_block_bytes, cache_bytes, ahead_bytes, ...): the
# records reader of the Atlas dataset (or single shard folder) at ``path``
open = lazy("lmdata.formats.atlas.reader:Atlas")


def merge(
    inputs: list[str], output: str, overwrite: bool = False, progress: OnProgress | None = None
) -> MergeSummary:
    """Join Atlas datasets into one at ``output``, examples in input order.

    The result takes the first input's strategy, dictionary, block and shard sizes. Shards that
    decode on their own or share that dictionary are taken as they are: hard-linked on local
    disk (copied across filesystems), fetched in ranged reads from an object store; shards tied
    to another shared dictionary are re-encoded. Inputs and output may be paths or URLs (the
    output on a store is uploaded at close, its root meta.json last). ``progress`` counts the
    inputs' data.bin bytes, input by input. The inputs' tokenizer record is kept
    (:func:`lmdata._provenance.joined`).
    """
    from lmdata import _provenance
    from lmdata.formats.atlas.meta import DICT, DatasetMeta, ShardMeta, shard_dirs
    from lmdata.formats.atlas.writer import Writer

    if not inputs:
        raise InvalidInputError("merge needs at least one input")
    store, key = resolve(inputs[0])
    first = Path(key) if store.local_path(key) is not None else PurePosixPath(key)
    meta = DatasetMeta.read(first, store)
    shards = shard_dirs(first, store)
    sm = ShardMeta.read(shards[0][1], store) if shards else None
    shared = None
    if meta.compression_strategy == Strategy.SHARED_DICTIONARY_COMPRESSION:
        shared = store.read(str(first / DICT))
    level = sm.compression_level if sm and isinstance(sm.compression_level, int) else 3
    fraction = (
        sm.compression_dict_size
        if sm and isinstance(sm.compression_dict_size, (int, float))
        else 0.01
    )
    found = []
    for p in inputs:
        s, k = resolve(p)
        root = Path(k) if s.local_path(k) is not None else PurePosixPath(k)
        found.append(_read_provenance(s, str(root / _provenance.FILE)))
    with Writer(
        output,
        provenance=_provenance.joined(found, [str(p) for p in inputs]),
        shard_size=max(meta.shard_sizes, default=0) or None,
        block_size=sm.block_size if sm else None,
        compression_strategy=meta.compression_strategy,
        compression_level=level,
        compression_dict_size=fraction,
        compression_dict=shared,
        overwrite=overwrite,
    ) as w:
        sizes = [_data_bytes(p) if progress is not None else 0 for p in inputs]
        tick = Ticker(progress, sum(sizes), "merge")
        for p, size in zip(inputs, sizes, strict=True):
            w.add_dataset(p)
            tick.add(size)
        total = w.count
    return MergeSummary("atlas", len(inputs), str(output), total)


def _data_bytes(path: str) -> int:
    """The bytes of the data.bin files of the Atlas dataset at ``path``."""
    from lmdata.formats.atlas.reader import Atlas
    from lmdata.formats.atlas.validate import data_sizes

    return sum(data_sizes(Atlas(path)))


def _read_provenance(store: Any, key: str) -> dict[str, Any] | None:
    from lmdata import _provenance

    return _provenance.read_file(store, key)


SPEC = FormatSpec(
    name="atlas",
    kind="records",
    summary="pickled examples in zstd blocks and shards (torch-atlas-ds)",
    detect=detector(detect, "atlas"),
    open=open,
    writer=lazy("lmdata.formats.atlas.writer:Writer"),
    validate=validate,
    info=info,
    merge=merge,
    # tokenize writes examples {"tokens": ids}; read them back with token_column="tokens"
    tokens=TokenTarget(open=column_sink(lazy("lmdata.formats.atlas.writer:Writer"))),
    provenance=lambda reader: _read_provenance(reader.store, str(reader.root / "lmdata.json")),
)
