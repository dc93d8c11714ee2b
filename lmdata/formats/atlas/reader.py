"""Reading Atlas datasets (torch-atlas-ds) as a records reader.

Fixes over the origin's reader: positional reads through the store (``pread`` locally), so
workers forked after the parent has read get correct examples; an allow-list unpickler unless
the file is trusted; a bound on the decompressed size of a block; a bounded block cache that
never hands the same object out twice; correct negative indices; ``take`` that decodes each
needed block once.
"""

from __future__ import annotations

import copy
import io
import os
import threading
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import numpy as np
import zstandard

from lmdata.errors import CorruptDataError, DatasetNotFoundError, FormatError
from lmdata.formats.atlas import codec
from lmdata.formats.atlas.meta import (
    DATA,
    DICT,
    INDEX,
    DatasetMeta,
    ShardMeta,
    Strategy,
    is_shard_name,
    read_json,
    shard_dirs,
)
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import LocalStore, Store, new_slot, resolve

DEFAULT_CACHE_BYTES = 64 << 20  # decompressed bytes of blocks kept for later reads
MAX_OPEN_FILES = 64
_READ_AHEAD = 8 << 20  # sequential iteration reads this many bytes of blocks per pread
_TAKEN = object()  # a cache slot whose example was already handed to a caller


@dataclass(frozen=True)
class ShardInfo:
    """One shard folder as found at open: its number, folder and parsed meta."""

    number: int
    folder: PurePath  # a local Path, or a key of an object store
    meta: ShardMeta


class _Entry:
    """A decoded block in the cache; each example is handed out once, then re-decoded."""

    __slots__ = ("items", "nbytes", "remaining")

    def __init__(self, items: list[Any], nbytes: int) -> None:
        self.items = items
        self.remaining = len(items)
        self.nbytes = nbytes

    def pop(self, j: int) -> Any:
        item = self.items[j]
        self.items[j] = _TAKEN
        self.remaining -= 1
        return item


def find_shards(
    root: PurePath, store: Store | None = None
) -> tuple[DatasetMeta | None, list[ShardInfo], PurePath | None]:
    """(root meta, shards, folder holding the shared dictionary) for a dataset root or for a
    single shard folder (whose shared dictionary, if any, is its parent's)."""
    store = store or LocalStore()
    d = read_json(root / "meta.json", store)
    if "stored_examples" in d:  # a shard folder opened on its own
        meta = ShardMeta.from_dict(d, root / "meta.json")
        return None, [ShardInfo(0, root, meta)], root.parent
    dmeta = DatasetMeta.from_dict(d, root / "meta.json")
    found = shard_dirs(root, store)
    _check_shard_list(root, dmeta, [n for n, _ in found], store)
    shards = [ShardInfo(n, f, ShardMeta.read(f, store)) for n, f in found]
    for sh, listed in zip(shards, dmeta.shard_sizes, strict=True):
        if sh.meta.stored_examples != listed:
            raise CorruptDataError(
                f"stored_examples is {sh.meta.stored_examples} but the root meta.json's "
                f"shard_sizes lists {listed} for this shard; the shard or the root meta.json "
                "is damaged (restore the shard, or rewrite the dataset)",
                path=sh.folder / "meta.json",
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
            path=not_dirs[0] if not_dirs else root / str(n),
            position=f"shard {n}",
        )
    extra = [n for n in numbers if n >= listed]
    raise CorruptDataError(
        f"unlisted shard: the root meta.json lists {listed} shards "
        f"(shard_sizes {_short(dmeta.shard_sizes)}) but shard folder {extra[0]} exists too; "
        "remove the stale folder or rewrite the dataset",
        path=root / str(extra[0]),
        position=f"shard {extra[0]}",
    )


def _short(sizes: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in sizes[:8])
    return f"[{shown}{', ...' if len(sizes) > 8 else ''}]"


class Atlas:
    """An Atlas dataset as records: ``len``, ``r[i]``, ``r.take(indices)``, iteration.

    Each example is returned exactly as it was pickled (dicts for JSON-like data), and a fresh
    object every time, so changing it never changes later reads. ``allow_unsafe_pickle=True``
    trusts the file (any pickle); ``max_block_bytes`` bounds one decompressed block;
    ``cache_bytes`` bounds the decoded blocks kept between reads. ``compression_dict`` gives
    the shared dictionary's bytes (a shard opened on its own, away from its dataset root).
    """

    format = "atlas"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        allow_unsafe_pickle: bool = False,
        max_block_bytes: int = codec.MAX_BLOCK_BYTES,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        compression_dict: bytes | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.store, key = resolve(path, storage_options)
        self.root: PurePath = (
            Path(key) if isinstance(self.store, LocalStore) else PurePosixPath(key)
        )
        if not self.store.exists(key):
            raise DatasetNotFoundError("no such file or directory", path=self.store.url(key))
        self.compression_dict = None if compression_dict is None else bytes(compression_dict)
        if not self.store.is_dir(key):
            raise FormatError(
                "an Atlas dataset is a folder with meta.json", path=self.store.url(key)
            )
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.max_block_bytes = max_block_bytes
        self.cache_bytes = cache_bytes
        self.meta, self.shards, self._dict_dir = find_shards(self.root, self.store)
        sizes = np.array([s.meta.stored_examples for s in self.shards], dtype=np.int64)
        # The origin's rule: shard sizes come from each shard's meta, not the root's list.
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - sizes
        self._len = int(self._ends[-1]) if len(sizes) else 0
        self._derive()
        self._reset()

    def _derive(self) -> None:
        """Plain-Python per-shard tables for the per-example hot path."""
        self._ends_list: list[int] = self._ends.tolist()
        self._starts_list: list[int] = self._starts.tolist()
        self._block_sizes = [sh.meta.block_size for sh in self.shards]
        self._names = [sh.folder.name for sh in self.shards]
        self._data_paths = [str(sh.folder / DATA) for sh in self.shards]

    # ---- per-process state (dropped when pickled, rebuilt after fork) ----------------------

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sizes: dict[int, int] = {}  # shard -> bytes in data.bin
        self._index: dict[int, np.ndarray] = {}
        self._dicts: dict[Any, zstandard.ZstdCompressionDict] = {}
        # decoded blocks (_Entry) in the process-wide byte cache, at most cache_bytes of them
        self._slot = new_slot(self.cache_bytes)

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            # Locks held by another thread at fork time would stay held: rebuild everything
            # (the store opens its own files in this process).
            self._reset()

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "store",
            "root",
            "allow_unsafe_pickle",
            "max_block_bytes",
            "cache_bytes",
            "compression_dict",
            "meta",
            "shards",
            "_dict_dir",
            "_ends",
            "_starts",
            "_len",
        )
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derive()
        self._reset()

    def info(self) -> dict[str, Any]:
        """Examples and shards of this reader (the dataset's full summary: ``lmdata.info``)."""
        return {"examples": len(self), "shards": len(self.shards)}

    def close(self) -> None:
        """Close open files and drop caches; the reader reopens them if used again."""
        with self._lock:
            self._sizes.clear()
            self._slot.clear()
            self._index.clear()

    @property
    def _cached_bytes(self) -> int:
        """Decoded bytes this reader holds in the shared cache."""
        return self._slot.nbytes

    def __enter__(self) -> Atlas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Atlas({str(self.root)!r}, examples={self._len}, shards={len(self.shards)})"

    # ---- low-level access ------------------------------------------------------------------

    def _where(self, s: int, b: int | None = None) -> str:
        name = self._names[s]
        return f"shard {name}" if b is None else f"shard {name} block {b}"

    def _shard_index(self, s: int) -> np.ndarray:
        idx = self._index.get(s)
        if idx is not None:
            return idx
        sh = self.shards[s]
        p = sh.folder / INDEX
        try:
            idx = np.load(io.BytesIO(self.store.read(str(p))), allow_pickle=False)
        except (FileNotFoundError, IsADirectoryError):
            raise CorruptDataError("missing index.npy", path=p, position=self._where(s)) from None
        except Exception as e:  # numpy's header parser raises many kinds (even TokenError)
            raise CorruptDataError(
                f"cannot load index.npy: {type(e).__name__}: {e}", path=p, position=self._where(s)
            ) from None
        if idx.ndim != 1 or idx.dtype.kind not in "ui":
            raise CorruptDataError(
                f"index.npy must be a 1-D integer array, got {idx.dtype} of shape {idx.shape}",
                path=p,
                position=self._where(s),
            )
        if len(idx) != sh.meta.num_blocks + 1:
            raise CorruptDataError(
                f"index.npy has {len(idx)} offsets; {sh.meta.stored_examples} examples in "
                f"blocks of {sh.meta.block_size} need {sh.meta.num_blocks + 1}",
                path=p,
                position=self._where(s),
            )
        self._index[s] = idx
        return idx

    def _size(self, s: int) -> int:
        """Bytes in shard ``s``'s data.bin (looked up once)."""
        size = self._sizes.get(s)
        if size is None:
            try:
                size = self._sizes[s] = self.store.size(self._data_paths[s])
            except (FileNotFoundError, IsADirectoryError):
                raise CorruptDataError(
                    "missing data.bin", path=self._data_paths[s], position=self._where(s)
                ) from None
        return size

    def _dict_path(self, s: int) -> PurePath:
        shared = self.shards[s].meta.compression_strategy == Strategy.SHARED_DICTIONARY_COMPRESSION
        return ((self._dict_dir or self.root) if shared else self.shards[s].folder) / DICT

    def _dict_for(self, s: int) -> zstandard.ZstdCompressionDict | None:
        strategy = self.shards[s].meta.compression_strategy
        if strategy == Strategy.SHARED_DICTIONARY_COMPRESSION:
            key: Any = "shared"
            p = (self._dict_dir or self.root) / DICT
        elif strategy == Strategy.DICTIONARY_COMPRESSION:
            key = s
            p = self.shards[s].folder / DICT
        else:
            return None
        d = self._dicts.get(key)
        if d is None and key == "shared" and self.compression_dict is not None:
            d = self._dicts[key] = codec.load_dict(self.compression_dict, "compression_dict")
        if d is None:
            try:
                data = self.store.read(str(p))
            except (FileNotFoundError, IsADirectoryError):
                raise CorruptDataError(
                    f"missing zstd_dict.bin, which compression strategy {int(strategy)} needs",
                    path=p,
                    position=self._where(s),
                ) from None
            d = codec.load_dict(data, self._where(s))
            self._dicts[key] = d
        return d

    def _decompressor(self, s: int) -> zstandard.ZstdDecompressor:
        """This thread's decompressor for shard ``s`` (instances are not thread-safe)."""
        by_shard = getattr(self._local, "by_shard", None)
        if by_shard is None:
            by_shard = self._local.by_shard = {}
        dctx = by_shard.get(s)
        if dctx is None:
            with self._lock:
                dctx = by_shard[s] = self._new_decompressor(s)
        return dctx

    def _new_decompressor(self, s: int) -> zstandard.ZstdDecompressor:
        # One per thread and dictionary, shared by the shards using that dictionary.
        d = self._dict_for(s)
        key = None if d is None else id(d)
        per_thread = getattr(self._local, "dctx", None)
        if per_thread is None:
            per_thread = self._local.dctx = {}
        dctx = per_thread.get(key)
        if dctx is None:
            try:
                dctx = zstandard.ZstdDecompressor(dict_data=d)
            except zstandard.ZstdError as e:
                shared = self.shards[s].meta.compression_strategy == 2
                folder = (self._dict_dir or self.root) if shared else self.shards[s].folder
                raise CorruptDataError(
                    f"cannot use the zstd dictionary: {e}",
                    path=folder / DICT,
                    position=self._where(s),
                ) from None
            per_thread[key] = dctx
        return dctx

    def _block_range(self, s: int, b: int) -> tuple[int, int]:
        """(start, stop) of block ``b`` of shard ``s``, checked against data.bin (caller
        holds the lock)."""
        idx = self._shard_index(s)
        size = self._size(s)
        start, stop = int(idx[b]), int(idx[b + 1])
        if not 0 <= start <= stop:
            raise CorruptDataError(
                f"index.npy offsets {start}..{stop} go backwards",
                path=self.shards[s].folder / INDEX,
                position=self._where(s, b),
            )
        if stop > size:
            raise CorruptDataError(
                f"block ends at byte {stop} but data.bin has {size} bytes (cut short)",
                path=self._data_paths[s],
                position=self._where(s, b),
            )
        if stop - start > self.max_block_bytes:
            raise CorruptDataError(
                f"block is {stop - start} bytes, more than max_block_bytes="
                f"{self.max_block_bytes}; open with a larger bound if it is genuine",
                path=self._data_paths[s],
                position=self._where(s, b),
            )
        return start, stop

    def _read_raw(self, s: int, b: int) -> bytes:
        """The stored bytes of block ``b`` of shard ``s`` (one ranged read)."""
        with self._lock:
            start, stop = self._block_range(s, b)
        raw = self.store.read_range(self._data_paths[s], start, stop - start)
        if len(raw) != stop - start:
            raise CorruptDataError(
                f"read {len(raw)} of the block's {stop - start} bytes",
                path=self._data_paths[s],
                position=self._where(s, b),
            )
        return raw

    def _decode_raw(self, s: int, b: int, raw: bytes) -> tuple[list[Any], int]:
        """(examples, pickled size) of block ``b`` of shard ``s`` from its stored bytes."""
        sh = self.shards[s]
        where = self._where(s, b)
        path = self._data_paths[s]
        if sh.meta.compression_strategy != Strategy.NO_COMPRESSION:
            d = self._dict_for(s)
            raw = codec.decompress_block(
                raw,
                self._decompressor(s),
                self.max_block_bytes,
                where,
                path,
                dict_id=d.dict_id() if d is not None else 0,
                dict_path=str(self._dict_path(s)) if d is not None else None,
            )
        items = codec.unpickle_block(
            raw, sh.meta.block_len(b), where, path, self.allow_unsafe_pickle
        )
        return items, len(raw)

    def _read_block(self, s: int, b: int) -> tuple[list[Any], int]:
        """(examples, pickled size) of block ``b`` of shard ``s``."""
        return self._decode_raw(s, b, self._read_raw(s, b))

    def _locate(self, i: int) -> tuple[int, int, int]:
        s = bisect_right(self._ends_list, i)
        b, j = divmod(i - self._starts_list[s], self._block_sizes[s])
        return s, b, j

    def _cache_put(self, key: tuple[int, int], entry: _Entry) -> None:
        """Keep the untaken rest of a block (caller holds the lock); evict least recent."""
        self._slot.pop(key)
        if entry.remaining:
            self._slot.put(key, entry, entry.nbytes)

    def _cache_pop(self, key: tuple[int, int], j: int) -> Any:
        """Example ``j`` of a cached block, or _TAKEN (caller holds the lock)."""
        entry = self._slot.peek(key)  # no age refresh: blocks are consumed, not re-read
        if entry is None or entry.items[j] is _TAKEN:
            return _TAKEN
        item = entry.pop(j)
        if entry.remaining == 0:
            self._slot.pop(key)
        return item

    # ---- the Records protocol --------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        self._check_pid()
        i = normalize_index(index, self._len)
        s, b, j = self._locate(i)
        with self._lock:
            item = self._cache_pop((s, b), j)
        if item is not _TAKEN:
            return item
        items, nbytes = self._read_block(s, b)
        entry = _Entry(items, nbytes)
        item = entry.pop(j)
        with self._lock:
            self._cache_put((s, b), entry)
        return item

    def take(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The examples at ``indices`` in that order, decoding each needed block once."""
        self._check_pid()
        idx = normalize_indices(indices, self._len)
        out: list[Any] = [None] * len(idx)
        if not len(idx):
            return out
        shard = np.searchsorted(self._ends, idx, side="right")
        local = idx - self._starts[shard]
        bsz = np.asarray(self._block_sizes, dtype=np.int64)[shard]
        block, pos = np.divmod(local, bsz)
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for k, (s, b, j) in enumerate(
            zip(shard.tolist(), block.tolist(), pos.tolist(), strict=True)
        ):
            groups.setdefault((s, b), []).append((k, j))
        for key, members in sorted(groups.items()):
            with self._lock:
                entry = self._slot.get(key)
                usable = entry is not None and all(entry.items[j] is not _TAKEN for _, j in members)
                if usable:
                    self._slot.pop(key)
            if not usable:
                items, nbytes = self._read_block(*key)
                entry = _Entry(items, nbytes)
            first: dict[int, int] = {}
            for k, j in members:
                if j in first:  # the same example twice in one call: a separate copy
                    out[k] = copy.deepcopy(out[first[j]])
                else:
                    first[j] = k
                    out[k] = entry.pop(j)
            with self._lock:
                self._cache_put(key, entry)
        return out

    def __iter__(self) -> Iterator[Any]:
        """Every example in order, reading several blocks per system call."""
        self._check_pid()
        for s, sh in enumerate(self.shards):
            if sh.meta.num_blocks == 0:
                continue
            with self._lock:
                idx = np.asarray(self._shard_index(s), dtype=np.int64)
                size = self._size(s)
            yield from self._iter_shard(s, size, idx)

    def _iter_shard(self, s: int, size: int, idx: np.ndarray) -> Iterator[Any]:
        n = self.shards[s].meta.num_blocks
        b = 0
        while b < n:
            e = b + 1
            while e < n and idx[e + 1] - idx[b] <= _READ_AHEAD:
                e += 1
            start, stop = int(idx[b]), int(idx[e])
            steps = np.diff(idx[b : e + 1])
            buf = b""
            if (
                0 <= start
                and stop <= size
                and steps.min() >= 0
                and (steps.max() <= self.max_block_bytes)
            ):
                buf = self.store.read_range(self._data_paths[s], start, stop - start)
            if len(buf) != stop - start or stop < start:
                for k in range(b, e):  # slow path: raises the precise error
                    yield from self._read_block(s, k)[0]
            else:
                for k in range(b, e):
                    raw = buf[int(idx[k]) - start : int(idx[k + 1]) - start]
                    yield from self._decode_raw(s, k, raw)[0]
            b = e

    # ---- extras ----------------------------------------------------------------------------

    def shard_of(self, index: int) -> tuple[str, int]:
        """(shard folder name, index within that shard) of example ``index``."""
        i = normalize_index(index, self._len)
        s = bisect_right(self._ends_list, i)
        return self._names[s], i - self._starts_list[s]

    def block_bytes(self, s: int, b: int) -> bytes:
        """The stored bytes of block ``b`` of the ``s``-th shard (for tools and validation)."""
        return self._read_raw(s, b)
