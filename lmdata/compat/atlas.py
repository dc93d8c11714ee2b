"""Drop-in for torch-atlas-ds 0.1: ``AtlasDataset``, its writers and metadata, over lmdata.

Change ``from torch_atlas_ds import ...`` to ``from lmdata.compat.atlas import ...``. The
names, arguments, defaults and files written are the origin's (metas, index dtypes, padded
shard folders, pickled blocks, zstd frames, dictionary fallbacks). What you gain: reads that
stay correct in forked DataLoader workers, a bounded cache that returns private copies,
``take``-free fast iteration, and writes that appear only when complete.

Stricter than the origin, on purpose:

- **No pickle runs code.** Blocks are unpickled with lmdata's allow-list (plain data and numpy
  arrays); a block naming anything else raises ``lmdata.errors.UnsafeDataError``, where the
  origin would run it. The writers refuse such examples up front. Pass
  ``allow_unsafe_pickle=True`` (an extra keyword) to trust a dataset you made yourself.
- A writer whose ``with`` block raises leaves nothing behind (the origin finishes the shard).
- Errors are ``lmdata.errors`` exceptions (subclasses of the builtins the origin raises:
  ``FileExistsError`` for an existing output, ``IndexError`` out of range).
"""

from __future__ import annotations

import enum
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from lmdata.compat._torch import torch_class
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats.atlas import Atlas, Writer

__all__ = [
    "AtlasDataset",  # noqa: F822 (built on first use by __getattr__)
    "AtlasDatasetMetadata",
    "AtlasDatasetShard",  # noqa: F822
    "AtlasDatasetShardMetadata",
    "AtlasDatasetShardWriter",
    "AtlasDatasetWriter",
    "CompressionStrategy",
]


class CompressionStrategy(enum.IntEnum):
    """The origin's strategies (stored in JSON as the plain int)."""

    NO_COMPRESSION = 0
    STANDARD_COMPRESSION = 1
    SHARED_DICTIONARY_COMPRESSION = 2
    DICTIONARY_COMPRESSION = 3


_SHARED = CompressionStrategy.SHARED_DICTIONARY_COMPRESSION


class AtlasDatasetShardMetadata(NamedTuple):
    """A shard's ``meta.json``."""

    version: int
    block_size: int
    stored_examples: int
    compression_strategy: CompressionStrategy
    compression_level: int
    compression_dict_size: float


class AtlasDatasetMetadata(NamedTuple):
    """The dataset root's ``meta.json``."""

    version: int
    shard_sizes: list[int]
    compression_strategy: CompressionStrategy


def _dict_bytes(d: Any) -> bytes | None:
    """A dictionary given as bytes or as a ``zstandard.ZstdCompressionDict``."""
    if d is None or isinstance(d, (bytes, bytearray, memoryview)):
        return None if d is None else bytes(d)
    as_bytes = getattr(d, "as_bytes", None)
    if as_bytes is None:
        raise InvalidInputError("compression_dict must be bytes or a zstandard dictionary")
    return bytes(as_bytes())


# ---- reading ---------------------------------------------------------------------------------


class _Reading:
    """Map-style access shared by the dataset and a single shard."""

    _reader: Atlas

    def __len__(self) -> int:
        return len(self._reader)

    def __getitem__(self, index: int) -> Any:
        return self._reader[index]

    def __iter__(self) -> Any:
        return iter(self._reader)


class _AtlasDataset(_Reading):
    """torch-atlas-ds ``AtlasDataset(root, mmap_index=True)``: every example of every shard.

    A ``torch.utils.data.Dataset`` when torch is installed. ``mmap_index`` is accepted for
    compatibility (indexes are always read with positional I/O). ``allow_unsafe_pickle``
    (lmdata's addition) trusts the file's pickles.
    """

    VERSION = 1

    def __init__(
        self, root: str | os.PathLike[str], mmap_index: bool = True, **options: Any
    ) -> None:
        self.root = Path(root)
        self.mmap_index = mmap_index
        self._reader = Atlas(self.root, **options)
        meta = self._reader.meta
        if meta is None:
            raise InvalidInputError(
                "this is a shard folder, not a dataset root; open it with AtlasDatasetShard",
                path=self.root,
            )
        self.metadata = AtlasDatasetMetadata(
            meta.version, list(meta.shard_sizes), CompressionStrategy(meta.compression_strategy)
        )


class _AtlasDatasetShard(_Reading):
    """torch-atlas-ds ``AtlasDatasetShard(root, mmap_index=True, compression_dict_bytes=None)``:
    one shard folder. A strategy-2 shard uses ``compression_dict_bytes``, else the dictionary
    in its parent folder."""

    VERSION = 1

    def __init__(
        self,
        root: str | os.PathLike[str],
        mmap_index: bool = True,
        compression_dict_bytes: bytes | None = None,
        **options: Any,
    ) -> None:
        self.root = Path(root)
        self.mmap_index = mmap_index
        self._reader = Atlas(
            self.root, compression_dict=_dict_bytes(compression_dict_bytes), **options
        )
        if self._reader.meta is not None:
            raise InvalidInputError(
                "this is a dataset root, not a shard folder; open it with AtlasDataset",
                path=self.root,
            )
        m = self._reader.shards[0].meta
        self.metadata = AtlasDatasetShardMetadata(
            m.version,
            m.block_size,
            m.stored_examples,
            CompressionStrategy(m.compression_strategy),
            m.compression_level,
            m.compression_dict_size,
        )


def __getattr__(name: str) -> Any:
    impl = {"AtlasDataset": _AtlasDataset, "AtlasDatasetShard": _AtlasDatasetShard}.get(name)
    if impl is not None:  # a torch Dataset when torch is installed
        return torch_class(__name__, name, impl, "Dataset")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- writing ---------------------------------------------------------------------------------


class _Writing:
    """``add_example``, ``close``, ``len`` and the context manager (abort on an exception)."""

    _w: Writer

    def add_example(self, example: Any) -> None:
        self._w.write(example)

    def __len__(self) -> int:
        return self._w.count

    def close(self) -> None:
        self._w.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._w.abort()


class AtlasDatasetWriter(_Writing):
    """torch-atlas-ds ``AtlasDatasetWriter``: examples into shards of ``shard_size``, blocks of
    ``block_size``, with the origin's default strategy (a dictionary trained on shard 0 and
    shared by all). ``path`` must not exist. The origin's file set: ``lmdata_manifest=True``
    adds lmdata's integrity manifest (``lmdata-manifest``, a file the origin ignores)."""

    VERSION = 1

    def __init__(
        self,
        path: str | os.PathLike[str],
        shard_size: int,
        block_size: int,
        compression_strategy: CompressionStrategy = _SHARED,
        compression_level: int = 3,
        compression_dict_size: float = 0.01,
        *,
        allow_unsafe_pickle: bool = False,
        lmdata_manifest: bool = False,
    ) -> None:
        self.path = Path(path)
        self.shard_size = shard_size
        self.block_size = block_size
        self.compression_strategy = CompressionStrategy(compression_strategy)
        self.compression_level = compression_level
        self.compression_dict_size = compression_dict_size
        self._w = Writer(
            self.path,
            shard_size=shard_size,
            block_size=block_size,
            compression_strategy=int(self.compression_strategy),
            compression_level=compression_level,
            compression_dict_size=compression_dict_size,
            allow_unsafe_pickle=allow_unsafe_pickle,
            manifest=lmdata_manifest,
        )

    @property
    def shard_sizes(self) -> list[int]:
        return list(self._w.shard_sizes)


class AtlasDatasetShardWriter(_Writing):
    """torch-atlas-ds ``AtlasDatasetShardWriter``: one shard folder at ``path`` (its parent must
    exist). Strategy 2 needs ``compression_dict`` (bytes or a ``ZstdCompressionDict``); strategy
    3 trains the shard's own dictionary, falling back to 1 below 7 blocks, as the origin does."""

    VERSION = 1

    def __init__(
        self,
        path: str | os.PathLike[str],
        block_size: int,
        compression_strategy: CompressionStrategy = CompressionStrategy.DICTIONARY_COMPRESSION,
        compression_level: int = 3,
        compression_dict: Any = None,
        compression_dict_size: float = 0.01,
        *,
        allow_unsafe_pickle: bool = False,
    ) -> None:
        self.path = Path(path)
        strategy = CompressionStrategy(compression_strategy)
        shared = _dict_bytes(compression_dict)
        if strategy == CompressionStrategy.SHARED_DICTIONARY_COMPRESSION and shared is None:
            raise InvalidInputError(
                "When using SHARED_DICTIONARY_COMPRESSION strategy you must provide a "
                "compression_dict"
            )
        if self.path.exists() or self.path.is_symlink():
            raise OutputExistsError("the shard folder already exists", path=self.path)
        if not self.path.parent.is_dir():
            raise InvalidInputError("the parent folder does not exist", path=self.path.parent)
        # An lmdata dataset of one shard, written beside the target; its shard 0 is moved
        # into place on close.
        self._staging = self.path.parent / f".{self.path.name}.lmdata-shard-{uuid.uuid4().hex}"
        self._w = Writer(
            self._staging,
            shard_size=(1 << 62),
            block_size=block_size,
            compression_strategy=int(strategy),
            compression_level=compression_level,
            compression_dict_size=compression_dict_size,
            compression_dict=shared if strategy == 2 else None,
            allow_unsafe_pickle=allow_unsafe_pickle,
            manifest=False,  # one shard folder: moved into the caller's dataset
        )
        self.metadata = AtlasDatasetShardMetadata(
            self.VERSION, block_size, 0, strategy, compression_level, compression_dict_size
        )

    @property
    def stored_examples(self) -> int:
        return self._w.count

    def close(self) -> None:
        """Finish the shard: data.bin, index.npy, the dictionary if trained, meta.json."""
        try:
            self._w.close()
            if self.path.exists():
                raise OutputExistsError("the shard folder appeared while writing", path=self.path)
            os.rename(self._staging / "0", self.path)
        finally:
            shutil.rmtree(self._staging, ignore_errors=True)
        m = Atlas(self.path).shards[0].meta
        self.metadata = self.metadata._replace(
            stored_examples=m.stored_examples,
            compression_strategy=CompressionStrategy(m.compression_strategy),
        )
