"""Reading streaming datasets (MDS, CSV/TSV/XSV, JSONL shards) as a records reader.

Shards are reached through a store. Local uncompressed shards are memory-mapped once and their
mappings reused (streaming opens the file again for every sample); remote ones are read by byte
ranges (the offset table once, then each sample's bytes); compressed shards are decompressed
once into the process-wide byte cache.
Nothing is ever written into the dataset directory (streaming writes decompressed copies
beside the originals). ``r[i]`` returns the dict streaming's ``StreamingDataset[i]`` returns.
"""

from __future__ import annotations

import os
import struct
import threading
import weakref
from bisect import bisect_right as _bisect
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, DatasetNotFoundError, LmdataError
from lmdata.formats.mds import compression as comp
from lmdata.formats.mds import fastpath
from lmdata.formats.mds.hashing import hexdigest, is_hash
from lmdata.formats.mds.index import FORMAT_NAMES, FileInfo, Index, Shard, find_index, load_index
from lmdata.formats.mds.mds import SampleDecoder
from lmdata.formats.mds.text_shards import XSVDecoder, decode_json_line
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import Store, basename, join, new_slot, parent, resolve
from lmdata.storage.cache import CACHE

DEFAULT_CACHE_BYTES = 512 << 20  # decompressed shards kept in memory
DEFAULT_MAX_MAPS = 1024  # memory-mapped shards kept open
_U32 = struct.Struct("<I")
# cheapest first: the reader checks one recorded hash of each compressed file it loads
_HASH_COST = {
    "xxh3_64": 0,
    "xxh3_128": 1,
    "xxh64": 2,
    "xxh128": 3,
    "xxh32": 4,
    "md5": 5,
    "sha1": 6,
    "blake2b": 7,
}
_PAIR = struct.Struct("<II")
# what a reader builds as it reads: never pickled (a new process builds its own)
_RUNTIME = (
    *("_lock", "_cache", "_slot", "_decoders", "_decoder_keys"),
    *("_fns", "_factories", "_costly", "_epoch", "_get"),
)


class _Loaded:
    """One shard's bytes: ``data`` (mmap or bytes) and ``table`` (the buffer with offsets)."""

    __slots__ = ("cost", "data", "data_path", "lo", "n", "size", "table", "table_path")

    def __init__(
        self, data: Any, table: Any, n: int, lo: int, cost: int, data_path: str, table_path: str
    ) -> None:
        self.data, self.table, self.n, self.lo, self.cost = data, table, n, lo, cost
        self.size = len(data)
        self.data_path, self.table_path = data_path, table_path


class _Ranged:
    """An object in a store that cannot map it, sliced like bytes: ``r[a:b]`` is one ranged
    read (so a sample costs its own bytes, never the whole shard)."""

    __slots__ = ("fetch", "key", "size", "store")

    def __init__(self, store: Store, key: str, size: int) -> None:
        self.store, self.key, self.size = store, key, size
        self.fetch = partial(store.read_range, key)  # fetch(begin, length): one ranged read

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        a, b, _ = s.indices(self.size)
        return self.store.read_range(self.key, a, b - a) if b > a else b""


def file_sizes(index: Index) -> dict[str, int]:
    """Bytes of every file beside the shards, by key: one listing per directory the index
    names (a dataset of thousands of shards opens with one request, not a HEAD per file)."""
    dirs = {
        parent(index.file(info))
        for s in index.shards
        for info in (s.raw_data, s.zip_data, s.raw_meta, s.zip_meta)
        if info is not None
    }
    out: dict[str, int] = {}
    for d in sorted(dirs):
        out.update((join(d, name), size) for name, size in index.store.sizes(d).items())
    return out


def _check_size(
    index: Index, key: str, info: FileInfo, what: str, shard: int, sizes: dict[str, int] | None
) -> None:
    try:
        size = index.store.size(key) if sizes is None else sizes[key]
    except (FileNotFoundError, KeyError):
        raise CorruptDataError(
            f"{what} file is missing", path=index.store.url(key), position=f"shard {shard}"
        ) from None
    if size != info.bytes:
        raise CorruptDataError(
            f"{what} is {size} bytes but index.json says {info.bytes}; the file is "
            "truncated or was replaced. Run `lmdata validate` on the dataset",
            path=index.store.url(key),
            position=f"shard {shard}",
        )


def _read_file(
    index: Index,
    info: FileInfo,
    what: str,
    shard: int,
    whole: bool = False,
    sizes: dict[str, int] | None = None,
) -> Any:
    """One file after checking its size against the index (``sizes`` from
    :func:`file_sizes`, else asked of the store): a memory map where the store can, else bytes
    (``whole``) or a :class:`_Ranged` view."""
    key = index.file(info)
    _check_size(index, key, info, what, shard, sizes)
    if info.bytes == 0:
        return b""
    store = index.store
    try:
        if store.can_mmap:
            return store.mmap(key)
        return store.read(key, info.bytes) if whole else _Ranged(store, key, info.bytes)
    except FileNotFoundError:
        raise CorruptDataError(
            f"{what} file is missing", path=store.url(key), position=f"shard {shard}"
        ) from None


def load_shard_file(
    index: Index,
    shard: Shard,
    raw: FileInfo,
    zipped: FileInfo | None,
    what: str,
    sizes: dict[str, int] | None = None,
) -> tuple[Any, str, int]:
    """(bytes, path, decompressed cost) of one shard file: the raw file if present, else the
    compressed one, decompressed and checked against the raw size the index declares."""
    raw_path = index.url(raw)
    raw_here = (
        index.file(raw) in sizes if sizes is not None else index.store.exists(index.file(raw))
    )
    if zipped is None or raw_here:
        return _read_file(index, raw, what, shard.number, sizes=sizes), raw_path, 0
    zpath = index.url(zipped)
    family = comp.family_of(shard.compression, path=index.path)
    if family is None:
        raise CorruptDataError(
            f"{what} has zip_data but no compression is named",
            path=index.path,
            position=f"shard {shard.number}",
        )
    blob = _read_file(index, zipped, f"compressed {what}", shard.number, True, sizes)
    if zipped.hashes:  # one hash per decompression is cheap: check it, as streaming can
        algo = min(zipped.hashes, key=lambda a: _HASH_COST.get(a, 9))
        if is_hash(algo) and hexdigest(algo, blob) != zipped.hashes[algo]:
            raise CorruptDataError(
                f"{algo} of the compressed file differs from index.json; "
                "the file changed or is corrupt",
                path=zpath,
                position=f"shard {shard.number}",
            )
    try:
        data = comp.decompress(family, bytes(blob), raw.bytes)
    except Exception as e:  # any decoder failure means a corrupt file
        raise CorruptDataError(
            f"cannot decompress ({family}): {e}", path=zpath, position=f"shard {shard.number}"
        ) from None
    finally:
        if hasattr(blob, "close"):
            blob.close()
    if len(data) != raw.bytes:
        raise CorruptDataError(
            f"decompresses to {len(data)} bytes but index.json says {raw.bytes}",
            path=zpath,
            position=f"shard {shard.number}",
        )
    return data, zpath, len(data)


def open_shard(index: Index, shard: Shard, sizes: dict[str, int] | None = None) -> _Loaded:
    """Load a shard and check its header against the index (and its files' ``sizes``)."""
    data, dpath, cost = load_shard_file(index, shard, shard.raw_data, shard.zip_data, "data", sizes)
    if shard.split:
        assert shard.raw_meta is not None
        table, tpath, c2 = load_shard_file(
            index, shard, shard.raw_meta, shard.zip_meta, "meta", sizes
        )
        cost += c2
    else:
        table, tpath = data, dpath
    n = shard.samples
    need = 4 + 4 * (n + 1)
    if isinstance(table, _Ranged) and len(table) >= need:
        table = table[0:need]  # the offsets, read once; samples are read by range
    if len(table) < need:
        raise CorruptDataError(
            f"file of {len(table)} bytes cannot hold the offsets of {n} samples",
            path=tpath,
            position=f"shard {shard.number}",
        )
    (found,) = _U32.unpack_from(table, 0)
    if found != n:
        raise CorruptDataError(
            f"header says {found} samples, index.json says {n}",
            path=tpath,
            position=f"shard {shard.number}",
        )
    lo = need if not shard.split else 0
    return _Loaded(data, table, n, lo, cost, dpath, tpath)


def make_decoder(
    shard: Shard, allow_unsafe_pickle: bool = False, select: tuple[str, ...] | None = None
) -> Callable[[bytes], dict[str, Any]]:
    if shard.format == "mds":
        return SampleDecoder(
            shard.column_names,
            shard.column_encodings,
            shard.column_sizes,
            allow_unsafe_pickle,
            select,
        ).compile()
    if shard.format == "json":
        return decode_json_line
    assert shard.separator is not None and shard.newline is not None
    return XSVDecoder(shard.column_names, shard.column_encodings, shard.separator, shard.newline)


class MDSReader:
    """A streaming dataset directory (or one split of it) as a random-access records reader.

    ``split`` picks a sub-directory, as StreamingDataset's ``split``. ``columns`` limits the
    decoded columns. ``allow_unsafe_pickle=True`` trusts ``pkl`` columns (otherwise only plain
    data unpickles). ``cache_bytes`` bounds the decompressed shards this reader keeps in the
    process-wide byte cache (0: none). ``path`` may be a URL (``memory://``, ``s3://`` ...),
    with ``storage_options`` for its filesystem.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        split: str | None = None,
        format: str | None = None,
        columns: Sequence[str] | None = None,
        allow_unsafe_pickle: bool = False,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_open_shards: int = DEFAULT_MAX_MAPS,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        store, key = resolve(path, storage_options)
        # what is read later is what is there now (one listing, which sizes every shard too)
        store.snapshot(parent(key) if basename(key) == "index.json" else key)
        if not store.exists(key):
            raise DatasetNotFoundError("no such file or directory", path=store.url(key))
        self.root = store.url(key)
        self.split = split
        self.index = load_index(store, find_index(store, key, split))
        shards = self.index.shards
        self.format = format or (FORMAT_NAMES[shards[0].format] if shards else "mds")
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.cache_bytes = cache_bytes  # checked by new_slot
        self.max_open_shards = max(1, int(max_open_shards))
        self.select = tuple(columns) if columns is not None else None
        if self.select is not None:
            known = {n for s in shards for n in s.column_names}
            missing = [c for c in self.select if c not in known]
            if missing:
                raise LmdataError(
                    f"no column(s) {', '.join(map(repr, missing))}; columns: "
                    f"{', '.join(sorted(known))}",
                    path=self.index.path,
                )
        counts = np.array([s.samples for s in shards], dtype=np.int64)
        self._starts = np.zeros(len(shards) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self._starts_list = self._starts[:-1].tolist()
        self._n = int(self._starts[-1])
        self._sizes = file_sizes(self.index)
        for s in shards:  # fail at open, not mid-epoch, when a shard file is gone
            files = [(s.raw_data, s.zip_data)] + ([(s.raw_meta, s.zip_meta)] if s.split else [])
            for raw, zipped in files:
                if raw is None:
                    continue
                if self.index.file(raw) not in self._sizes and (
                    zipped is None or self.index.file(zipped) not in self._sizes
                ):
                    name = raw.basename + (f" (or {zipped.basename})" if zipped else "")
                    raise CorruptDataError(
                        f"shard file {name} is missing",
                        path=self.root,
                        position=f"shard {s.number}",
                    )
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        # shards that cost no memory (maps, ranged views), LRU; decoded ones live in the slot
        self._cache: OrderedDict[int, _Loaded] = OrderedDict()
        self._slot = new_slot(self.cache_bytes)
        self._decoders: dict[int, Callable[[bytes], dict[str, Any]]] = {}
        self._decoder_keys: dict[tuple, Callable[[bytes], dict[str, Any]]] = {}
        # per shard: the generated read functions (fastpath.py), which hold the shard's bytes:
        # a mapped shard's are dropped when its mapping leaves the open-shard LRU, a
        # decompressed shard's ("costly") once the process-wide cache no longer holds it (the
        # cache's epoch counts its removals: checked on reads only while there are such shards)
        self._fns: dict[int, fastpath.Fns] = {}
        self._factories: dict[tuple, fastpath.Factory] = {}
        self._costly: set[int] = set()
        self._epoch = CACHE.epoch
        # r[i]: index -> shard -> its function, in one C call where the extension is built; it
        # reaches the reader through a weak reference (no cycle: a dropped reader is freed, its
        # maps and cache entries with it, at once and not at the next collection)
        c = fastpath._mdsread
        self._get: Callable[[Any], Any] | None = None
        if c is not None:
            me = weakref.ref(self)

            def functions(k: int) -> fastpath.Fns:
                reader = me()
                assert reader is not None  # the reader holds this function
                return reader._functions(k)

            self._get = c.Dispatch(
                self._starts.tolist(),
                self._fns,
                self._costly,
                CACHE,
                functions,
                partial(normalize_index, n=self._n),
            )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in _RUNTIME:
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        split = f", split={self.split!r}" if self.split else ""
        return f"MDSReader({self.root!r}{split})"

    @property
    def store(self) -> Store:
        """The store the dataset is read from (its listings serve the manifest check)."""
        return self.index.store

    def close(self) -> None:
        """Drop cached shards, mappings and open files (the reader opens them again if used)."""
        with self._lock:
            self._cache.clear()
            self._slot.clear()
            self._fns.clear()
            self._costly.clear()
        self.index.store.close()

    @property
    def _cached_bytes(self) -> int:
        """Decompressed bytes this reader holds in the shared cache."""
        return self._slot.nbytes

    def __enter__(self) -> MDSReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- shards ------------------------------------------------------------------------

    @property
    def shards(self) -> tuple[Shard, ...]:
        return self.index.shards

    def _shard(self, k: int) -> _Loaded:
        cache = self._cache
        with self._lock:
            got = cache.get(k)
            if got is not None:
                cache.move_to_end(k)
                return got
        got = self._slot.get(k)
        if got is not None:
            return got  # type: ignore[no-any-return]
        loaded = open_shard(self.index, self.index.shards[k], self._sizes)
        if loaded.cost:  # decompressed bytes: the shared, bounded cache (or nowhere)
            self._slot.put(k, loaded, loaded.cost)
            return loaded
        with self._lock:
            cache.setdefault(k, loaded)
            # evict least recently used; mappings close when no reader holds them any more
            while len(cache) > self.max_open_shards:
                gone, _ = cache.popitem(last=False)
                self._fns.pop(gone, None)
            return cache.get(k, loaded)

    def _decoder(self, k: int) -> Callable[[bytes], dict[str, Any]]:
        dec = self._decoders.get(k)
        if dec is None:
            s = self.index.shards[k]
            key = (
                s.format,
                s.column_names,
                s.column_encodings,
                s.column_sizes,
                s.separator,
                s.newline,
            )
            dec = self._decoder_keys.get(key)
            if dec is None:
                try:
                    dec = make_decoder(s, self.allow_unsafe_pickle, self.select)
                except ValueError as e:
                    raise CorruptDataError(
                        str(e), path=self.index.path, position=f"shard {k}"
                    ) from None
                self._decoder_keys[key] = dec
            self._decoders[k] = dec
        return dec

    def _forget_evicted(self) -> None:
        """Drop the functions of decompressed shards the shared cache no longer holds (they
        would keep the bytes alive beyond its budget); mapped shards' stay."""
        self._epoch = CACHE.epoch  # first: a removal during the scan means another scan
        with self._lock:
            for other in list(self._costly):
                if self._slot.peek(other) is None:
                    self._fns.pop(other, None)
                    self._costly.discard(other)

    def _functions(self, k: int) -> fastpath.Fns:
        """The read functions of shard ``k``, built on first use (and again after its bytes
        left the shared cache or its mapping left the LRU: the functions hold them)."""
        if self._epoch != CACHE.epoch:
            self._forget_evicted()
        fns = self._fns.get(k)
        if fns is not None:
            return fns
        dec = self._decoder(k)
        loaded = self._shard(k)
        s = self.index.shards[k]
        ranged = isinstance(loaded.data, _Ranged)  # one ranged read per sample, then decode
        key = (s.format, s.column_names, s.column_encodings, s.column_sizes, s.separator, s.newline)
        make = self._factories.get((*key, ranged))
        if make is None:
            if s.format == "mds":
                plan = SampleDecoder(
                    s.column_names,
                    s.column_encodings,
                    s.column_sizes,
                    self.allow_unsafe_pickle,
                    self.select,
                )
                if ranged:  # one fetch per sample, then the C decode where it is built
                    make = fastpath.ranged(plan, s.column_encodings, dec)
                else:
                    make = fastpath.compile_layout(plan, s.column_encodings)
            else:
                make = fastpath.generic(dec)
            self._factories[(*key, ranged)] = make
        slow = partial(fastpath.slow, dec, loaded, k)
        fns = make(loaded.table, loaded.data, loaded.lo, loaded.size, slow)
        if loaded.cost:
            # kept while the shared cache holds this shard (or the slot's last entry is it),
            # so the functions never hold more than the budget: loading this one may have
            # displaced the slot's last entry without any removal from the cache (cap 0)
            self._forget_evicted()
            with self._lock:
                self._costly.add(k)
        self._fns[k] = fns
        return fns

    def _raw(self, loaded: _Loaded, k: int, j: int) -> bytes:
        return fastpath.raw(loaded, k, j)

    def _decode(
        self, dec: Callable[[bytes], Any], data: bytes, loaded: _Loaded, k: int, j: int
    ) -> Any:
        return fastpath.decode(dec, data, loaded, k, j)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, sample within the shard) of global sample ``index``."""
        i = normalize_index(index, self._n)
        k = _bisect(self._starts_list, i) - 1
        return k, i - self._starts_list[k]

    def raw_sample(self, index: int) -> bytes:
        """The stored bytes of one sample (an MDS record, a CSV line, a JSON line)."""
        k, j = self.locate(index)
        return self._raw(self._shard(k), k, j)

    # ---- the Records protocol ----------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> dict[str, Any]:
        get = self._get
        return self._read(index) if get is None else get(index)  # type: ignore[no-any-return]

    def _read(self, index: int) -> dict[str, Any]:
        """``r[i]`` in Python (the C Dispatch does the same): locate, then the shard's function."""
        if index.__class__ is int and 0 <= index < self._n:
            i = index
        else:
            i = normalize_index(index, self._n)
        starts = self._starts_list
        k = _bisect(starts, i) - 1
        fns = self._fns.get(k)
        if fns is None or (self._costly and self._epoch != CACHE.epoch):
            fns = self._functions(k)
        return fns[0](i - starts[k])

    def _groups(self, idx: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(shard, local sample numbers, output positions) per shard touched, shard order."""
        if len(idx) == 0:
            return
        sids = np.searchsorted(self._starts[:-1], idx, side="right") - 1
        if sids[0] == sids[-1] and (sids == sids[0]).all():  # one shard: no sorting
            k = int(sids[0])
            yield k, idx - self._starts[k], np.arange(len(idx))
            return
        order = np.argsort(sids, kind="stable")
        sorted_sids = sids[order]
        cuts = np.flatnonzero(np.diff(sorted_sids)) + 1
        for pos in np.split(order, cuts):
            k = int(sids[pos[0]])
            yield k, idx[pos] - self._starts[k], pos

    def take(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Samples at ``indices`` in that order; each shard is loaded once."""
        idx = normalize_indices(indices, self._n)
        groups = list(self._groups(idx))
        if len(groups) == 1:
            k, local, _ = groups[0]
            return self._functions(k)[1](local.tolist())
        out: list[Any] = [None] * len(idx)
        for k, local, pos in groups:
            values = self._functions(k)[1](local.tolist())
            for p, value in zip(pos.tolist(), values, strict=True):
                out[p] = value
        return out

    def __iter__(self) -> Iterator[Any]:
        block = 4096  # samples decoded per step: bounded memory, few Python-level calls
        for k, s in enumerate(self.index.shards):
            for lo in range(0, s.samples, block):
                yield from self._functions(k)[2](lo, min(lo + block, s.samples))

    # ---- summary -----------------------------------------------------------------------

    def columns(self) -> dict[str, str]:
        """Column name -> encoding, over all shards (the first shard's wins on a clash)."""
        out: dict[str, str] = {}
        for s in self.index.shards:
            for n, e in zip(s.column_names, s.column_encodings, strict=False):
                out.setdefault(n, e)
        return out

    def info(self) -> dict[str, Any]:
        shards = self.index.shards
        return {
            "samples": self._n,
            "shards": len(shards),
            "shard_formats": sorted({s.format for s in shards}),
            "columns": self.columns(),
            "compression": sorted({s.compression or "none" for s in shards}),
            "hashes": sorted({h for s in shards for h in s.hashes}),
            "size_limit": sorted({s.size_limit for s in shards if s.size_limit is not None}),
            "raw_bytes": sum(
                s.raw_data.bytes + (s.raw_meta.bytes if s.raw_meta else 0) for s in shards
            ),
        }
