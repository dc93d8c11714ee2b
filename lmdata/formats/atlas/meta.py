"""Atlas metadata: the root and shard ``meta.json`` files, parsed and checked in one place, and
finding the shard folders of a dataset.

The origin (torch-atlas-ds) builds ``NamedTuple``s from these files with ``Cls(**json)``, so it
rejects any extra key; we read extra keys (and report them in ``validate``) but never write any.
It writes them with ``json.dump(obj, f, indent=4)``: 4-space indents and no trailing newline.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import numpy as np

from lmdata import _json
from lmdata.errors import CorruptDataError, FormatError, InvalidInputError, StorageError
from lmdata.storage import LocalStore, Store

VERSION = 1
META = "meta.json"
DATA = "data.bin"
INDEX = "index.npy"
DICT = "zstd_dict.bin"
MAX_META_BYTES = 64 << 20  # a root meta of a million shards is ~8 MB; refuse absurd files
MAX_COUNT = 1 << 48  # no shard holds more examples (or a larger block) than this

ROOT_KEYS = ("version", "shard_sizes", "compression_strategy")
SHARD_KEYS = (
    "version",
    "block_size",
    "stored_examples",
    "compression_strategy",
    "compression_level",
    "compression_dict_size",
)
_DIGITS = re.compile(r"[0-9]+")


class Strategy(enum.IntEnum):
    """The origin's ``CompressionStrategy``; stored in JSON as the plain int."""

    NO_COMPRESSION = 0
    STANDARD_COMPRESSION = 1
    SHARED_DICTIONARY_COMPRESSION = 2
    DICTIONARY_COMPRESSION = 3


_STRATEGY_NAMES = {
    "none": Strategy.NO_COMPRESSION,
    "no_compression": Strategy.NO_COMPRESSION,
    "standard": Strategy.STANDARD_COMPRESSION,
    "zstd": Strategy.STANDARD_COMPRESSION,
    "standard_compression": Strategy.STANDARD_COMPRESSION,
    "shared": Strategy.SHARED_DICTIONARY_COMPRESSION,
    "shared_dictionary": Strategy.SHARED_DICTIONARY_COMPRESSION,
    "shared_dictionary_compression": Strategy.SHARED_DICTIONARY_COMPRESSION,
    "dictionary": Strategy.DICTIONARY_COMPRESSION,
    "per_shard": Strategy.DICTIONARY_COMPRESSION,
    "dictionary_compression": Strategy.DICTIONARY_COMPRESSION,
}


def parse_strategy(value: int | str | Strategy) -> Strategy:
    """A strategy from its int (0-3), enum, or name (none, standard, shared, dictionary)."""
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        if key.isdigit():
            value = int(key)
        elif key in _STRATEGY_NAMES:
            return _STRATEGY_NAMES[key]
        else:
            raise InvalidInputError(
                f"unknown compression strategy {value!r}; use 0/none, 1/standard, "
                "2/shared or 3/dictionary"
            )
    if isinstance(value, bool) or not isinstance(value, int) or value not in range(4):
        raise InvalidInputError(
            f"compression strategy must be 0, 1, 2 or 3 (none, standard, shared, dictionary), "
            f"got {value!r}"
        )
    return Strategy(value)


def _show(v: Any) -> str:
    """A short repr of a meta value for messages (huge ints and long lists cut)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _int(
    d: dict[str, Any], key: str, path: PurePath, minimum: int = 0, maximum: int = MAX_COUNT
) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
        raise CorruptDataError(
            f"{key} must be an integer in {minimum}..{maximum}, got {_show(v)}; the file is "
            "damaged or not written by an Atlas writer",
            path=path,
        )
    return v


def _version(d: dict[str, Any], path: PurePath) -> int:
    v = d.get("version")
    if v != VERSION or isinstance(v, bool):
        raise FormatError(
            f"Atlas version {_show(v)} is not supported (only version 1 exists); "
            "was this written by a newer tool?",
            path=path,
        )
    return VERSION


def _strategy(d: dict[str, Any], path: PurePath) -> Strategy:
    v = d.get("compression_strategy")
    if isinstance(v, bool) or not isinstance(v, int) or v not in range(4):
        raise CorruptDataError(
            f"compression_strategy must be 0, 1, 2 or 3, got {_show(v)}", path=path
        )
    return Strategy(v)


def shown(store: Store | None, p: PurePath | str) -> PurePath | str:
    """How key ``p`` of ``store`` is named in messages: the local path, or its full URL."""
    return p if store is None or store.local_path(str(p)) is not None else store.url(str(p))


def read_json(path: PurePath, store: Store | None = None) -> dict[str, Any]:
    """A ``meta.json`` as a dict, or FormatError/CorruptDataError saying what is wrong.
    ``path`` is a key of ``store`` (local disk when None)."""
    store = store or LocalStore()
    key = str(path)
    path = shown(store, path)  # type: ignore[assignment]
    try:
        size = store.size(key)
        if size > MAX_META_BYTES:
            raise CorruptDataError(
                f"meta.json is {size} bytes, far more than any Atlas meta needs", path=path
            )
        data = store.read(key, MAX_META_BYTES)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise FormatError(
            "missing meta.json; this is not an Atlas dataset or shard", path=path
        ) from None
    except StorageError:
        raise
    except OSError as e:
        raise CorruptDataError(f"cannot read meta.json: {e}", path=path) from None
    return _json.from_bytes(data, path=path, what="meta.json", max_bytes=MAX_META_BYTES)


def dumps(obj: dict[str, Any]) -> bytes:
    """JSON exactly as the origin writes its metas (``json.dump(..., indent=4)``)."""
    return json.dumps(obj, indent=4).encode()


@dataclass(frozen=True)
class ShardMeta:
    """``<shard>/meta.json``. Only version, block_size, stored_examples and strategy are read."""

    block_size: int
    stored_examples: int
    compression_strategy: Strategy
    compression_level: Any = 3
    compression_dict_size: Any = 0.01
    version: int = VERSION
    extra_keys: tuple[str, ...] = field(default=(), compare=False)

    @property
    def num_blocks(self) -> int:
        return -(-self.stored_examples // self.block_size)

    def block_len(self, block: int) -> int:
        """Examples in ``block``: ``block_size`` except in the last block."""
        return min(self.block_size, self.stored_examples - block * self.block_size)

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: PurePath) -> ShardMeta:
        return cls(
            version=_version(d, path),
            block_size=_int(d, "block_size", path, 1),
            stored_examples=_int(d, "stored_examples", path),
            compression_strategy=_strategy(d, path),
            compression_level=d.get("compression_level"),
            compression_dict_size=d.get("compression_dict_size"),
            extra_keys=tuple(k for k in d if k not in SHARD_KEYS),
        )

    @classmethod
    def read(cls, shard_dir: PurePath, store: Store | None = None) -> ShardMeta:
        p = shard_dir / META
        return cls.from_dict(read_json(p, store), shown(store, p))  # type: ignore[arg-type]

    def to_json(self) -> bytes:
        return dumps(
            {
                "version": self.version,
                "block_size": self.block_size,
                "stored_examples": self.stored_examples,
                "compression_strategy": int(self.compression_strategy),
                "compression_level": self.compression_level,
                "compression_dict_size": self.compression_dict_size,
            }
        )


@dataclass(frozen=True)
class DatasetMeta:
    """The root ``meta.json``. The origin's reader ignores ``shard_sizes`` (its FORMAT.md says
    so) and trusts each shard's ``stored_examples``; so do we, and ``validate`` compares them."""

    shard_sizes: tuple[int, ...]
    compression_strategy: Strategy
    version: int = VERSION
    extra_keys: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: PurePath) -> DatasetMeta:
        sizes = d.get("shard_sizes")
        if not isinstance(sizes, list):
            raise CorruptDataError(
                f"shard_sizes must be a list of integers, got {_show(sizes)}",
                path=path,
            )
        for i, s in enumerate(sizes):
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_COUNT:
                raise CorruptDataError(
                    f"shard_sizes[{i}] must be an integer in 0..{MAX_COUNT}, got {_show(s)}; "
                    "the file is damaged or not written by an Atlas writer",
                    path=path,
                )
        if sum(sizes) > MAX_COUNT:
            raise CorruptDataError(
                f"shard_sizes add up to {sum(sizes)} examples, more than {MAX_COUNT}",
                path=path,
            )
        return cls(
            version=_version(d, path),
            shard_sizes=tuple(sizes),
            compression_strategy=_strategy(d, path),
            extra_keys=tuple(k for k in d if k not in ROOT_KEYS),
        )

    @classmethod
    def read(cls, root: PurePath, store: Store | None = None) -> DatasetMeta:
        p = root / META
        return cls.from_dict(read_json(p, store), p)

    def to_json(self) -> bytes:
        return dumps(
            {
                "version": self.version,
                "shard_sizes": list(self.shard_sizes),
                "compression_strategy": int(self.compression_strategy),
            }
        )


def index_dtype(total: int) -> np.dtype:
    """The smallest unsigned dtype whose maximum is >= ``total`` (the origin's rule)."""
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if total <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise InvalidInputError(f"a shard of {total} bytes does not fit a uint64 index")


def is_shard_name(name: str) -> bool:
    return _DIGITS.fullmatch(name) is not None


def shard_dirs(root: PurePath, store: Store | None = None) -> list[tuple[int, PurePath]]:
    """(number, folder) of every all-digit subfolder, in numeric order.

    The origin sorts every subfolder lexicographically, which is numeric order only once the
    writer has zero-padded the names; other folders (``.ipynb_checkpoints``) break it. We skip
    non-digit folders and sort by number; ``validate`` reports both situations.
    """
    store = store or LocalStore()
    found: dict[int, PurePath] = {}
    try:
        names = store.list(str(root))
    except StorageError:
        raise
    except OSError as e:
        raise FormatError(f"cannot list the dataset folder: {e}", path=shown(store, root)) from None
    for name in names:
        if is_shard_name(name) and store.is_dir(str(root / name)):
            n = int(name)
            if n in found:
                raise CorruptDataError(
                    f"shard folders {found[n].name!r} and {name!r} both number {n}; "
                    "remove the stale one",
                    path=shown(store, root),
                )
            found[n] = root / name
    return sorted(found.items())


def padded_name(number: int, num_shards: int) -> str:
    """Folder name of shard ``number`` once the writer closes: zero-padded to the digits of
    ``num_shards - 1`` (11 shards: 00..10; 101 shards: 000..100; 1 shard: 0)."""
    width = len(str(max(num_shards - 1, 0)))
    return str(number).rjust(width, "0")


def replace_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` as a new file (never in place: the old inode may be a hard link into an
    existing dataset that an append is extending)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ShardInfo:
    """One shard folder as found at open: its number, folder and parsed meta."""

    number: int
    folder: PurePath  # a local Path, or a key of an object store
    meta: ShardMeta


def find_shards(
    root: PurePath, store: Store | None = None
) -> tuple[DatasetMeta | None, list[ShardInfo], PurePath | None]:
    """(root meta, shards, folder holding the shared dictionary) for a dataset root or for a
    single shard folder (whose shared dictionary, if any, is its parent's)."""
    store = store or LocalStore()
    d = read_json(root / "meta.json", store)
    where: Any = shown(store, root / "meta.json")
    if "stored_examples" in d:  # a shard folder opened on its own
        meta = ShardMeta.from_dict(d, where)
        return None, [ShardInfo(0, root, meta)], root.parent
    dmeta = DatasetMeta.from_dict(d, where)
    found = shard_dirs(root, store)
    _check_shard_list(root, dmeta, [n for n, _ in found], store)
    shards = [ShardInfo(n, f, ShardMeta.read(f, store)) for n, f in found]
    for sh, listed in zip(shards, dmeta.shard_sizes, strict=True):
        if sh.meta.stored_examples != listed:
            raise CorruptDataError(
                f"stored_examples is {sh.meta.stored_examples} but the root meta.json's "
                f"shard_sizes lists {listed} for this shard; the shard or the root meta.json "
                "is damaged (restore the shard, or rewrite the dataset)",
                path=shown(store, sh.folder / "meta.json"),
                position=f"shard {sh.folder.name}",
            )
    return dmeta, shards, root


def _check_shard_list(root: PurePath, dmeta: DatasetMeta, numbers: list[int], store: Store) -> None:
    """The shard folders found must be exactly 0..n-1 for the n shards the root meta lists;
    a missing one would silently drop its examples."""
    listed = len(dmeta.shard_sizes)
    if numbers == list(range(listed)):
        return
    have = set(numbers)
    missing = [n for n in range(listed) if n not in have]
    if missing:
        n = missing[0]
        others = f" ({len(missing) - 1} more shards are missing)" if len(missing) > 1 else ""
        not_dirs = [root / e for e in store.list(str(root)) if is_shard_name(e) and int(e) == n]
        what = (
            f"{not_dirs[0].name} is not a folder"
            if not_dirs
            else f"there is no shard folder numbered {n}"
        )
        raise CorruptDataError(
            f"missing shard: the root meta.json lists {listed} shards (shard_sizes "
            f"{_short(dmeta.shard_sizes)}) but {what}{others}; restore the shard or rewrite "
            "the dataset",
            path=shown(store, not_dirs[0] if not_dirs else root / str(n)),
            position=f"shard {n}",
        )
    extra = [n for n in numbers if n >= listed]
    raise CorruptDataError(
        f"unlisted shard: the root meta.json lists {listed} shards "
        f"(shard_sizes {_short(dmeta.shard_sizes)}) but shard folder {extra[0]} exists too; "
        "remove the stale folder or rewrite the dataset",
        path=shown(store, root / str(extra[0])),
        position=f"shard {extra[0]}",
    )


def _short(sizes: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in sizes[:8])
    return f"[{shown}{', ...' if len(sizes) > 8 else ''}]"
