"""A small, direct reader of 1-D zarr arrays (zarr format v2 and v3) for the hot path.

zarr-python costs tens of microseconds per call and decodes whole chunks; here chunk objects
are read directly through a store: local uncompressed chunks are memory-mapped, remote ones
read by byte ranges, compressed ones decoded once into the process-wide byte cache. Only what
flat-tokens needs is supported: 1-D integer arrays, regular chunks,
the v2 compressors/filters of numcodecs, the v3 codecs ``bytes``, ``transpose``, ``zstd``,
``gzip``, ``blosc``, ``crc32c``, ``numcodecs.*`` and ``sharding_indexed``. The metadata is
parsed and checked by :mod:`._zarr_meta`.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, UnsafeDataError
from lmdata.formats.flat_tokens._blosc import BadChunk, Partial
from lmdata.formats.flat_tokens._codecs import crc32c_strip
from lmdata.formats.flat_tokens._zarr_meta import (
    MAX_CHUNK_BYTES,
    ArrayMeta,
    node_attrs,
    node_kind,
    parse_array,
    read_json,
)
from lmdata.storage import Store, join, new_slot

DEFAULT_CACHE_BYTES = 256 << 20
_MISSING = 2**64 - 1

__all__ = ["ArrayMeta", "ZArray", "node_attrs", "node_kind", "read_json"]


class ZArray:
    """Random reads of a 1-D zarr array straight from its chunk objects in a store.

    Decoded chunks live in the process-wide byte cache (at most ``cache_bytes`` of them for this
    array; 0 keeps none); local uncompressed chunks are memory maps, kept per array.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        block_bytes: int = 0,
    ) -> None:
        self.store = store
        self.key = key
        self.path = store.url(key)
        self._cache_bytes = cache_bytes
        # > 0: remote uncompressed reads fetch aligned blocks of this size into the byte cache
        # (small arrays read a few items at a time, such as seq_starts), else exact ranges
        self._block_bytes = block_bytes
        self._parse()
        self._init_cache()

    # pickling ships only the store and key: each process builds its own caches and maps
    def __getstate__(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "key": self.key,
            "cache_bytes": self._cache_bytes,
            "block_bytes": self._block_bytes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["store"], state["key"], state["cache_bytes"], state.get("block_bytes", 0)
        )

    def _init_cache(self) -> None:
        self._lock = threading.Lock()
        self._slot = new_slot(self._cache_bytes)  # decoded units and shard indexes
        # memory maps (no copies, so outside the byte budget); FIFO, cheap lookups
        self._maps: dict[int, np.ndarray] = {}
        self._views: dict[int, memoryview] = {}
        self._epoch = -1
        self._mappable = self.raw and self.store.can_mmap  # else read by byte ranges
        self._sizes: dict[int, int] | None = None  # chunk object sizes, listed once (remote)
        self._sized: dict[int, str] = {}  # key of each raw chunk whose size was checked
        self._fill_unit: np.ndarray | None = None  # what every missing unit reads as, shared
        self._partial = None  # Blosc chunks on a local store: rows read from their blocks
        if (  # (the items' bytes as stored in one Blosc frame: v3 names a big-endian "bytes")
            self.meta.codecs == "blosc"
            and not self.meta.shard_inner
            and self.store.can_mmap
            and self._storage_dtype == self.dtype
            and self.dtype.itemsize == 4
            and np.little_endian
        ):
            self._partial = Partial(self.store, 4, self._unit * 4)

    def close(self) -> None:
        """Drop cached chunks and maps (they are read again if the array is used again)."""
        with self._lock:
            self._slot.clear()
            self._maps.clear()
            self._views.clear()
            self._sized.clear()
            self._fill_unit = None
            if self._partial is not None:
                self._partial.clear()

    def _parse(self) -> None:
        self.meta, dec = parse_array(self.store, self.key)
        self._decode = dec.decode
        self._storage_dtype = dec.storage_dtype
        self._index_crc, self._index_end = dec.index_crc, dec.index_end
        dtype = self.meta.dtype
        self.dtype = dtype.newbyteorder("=")
        self._unit = self.meta.shard_inner or self.meta.chunk_len  # the decodable unit
        self.raw = (
            dec.decode is None
            and dtype.byteorder in ("<", "=", "|")
            and (np.little_endian or dtype.itemsize == 1)
        )

    # ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.meta.length

    def present_units(self) -> list[int]:
        """The units (chunks, or inner chunks of existing shards) backed by a file."""
        chunks = self.present_chunks()
        if not self.meta.shard_inner:
            return chunks
        per = self.meta.chunk_len // self.meta.shard_inner
        n_units = -(-self.meta.length // self._unit)
        return [u for k in chunks for u in range(k * per, (k + 1) * per) if u < n_units]

    def _chunk_listing(self) -> tuple[str, str]:
        """(folder, name prefix) of the chunk objects."""
        prefix = self.meta.key_prefix
        folder = join(self.key, prefix[:-1]) if prefix.endswith("/") else self.key
        return folder, "" if prefix.endswith("/") else prefix

    def chunk_size(self, k: int) -> int:
        """Bytes of chunk (or shard) object ``k``; FileNotFoundError if it was never written.
        On stores that cannot map, every size comes from one listing of the chunk folder (a
        HEAD per read would double the requests of small random reads)."""
        if self.store.can_mmap:
            return self.store.size(self.chunk_key(k))
        sizes = self._sizes
        if sizes is None:
            folder, head = self._chunk_listing()
            sizes = {}
            for name, size in self.store.sizes(folder).items():
                if name.startswith(head) and name[len(head) :].isdigit():
                    sizes[int(name[len(head) :])] = size
            self._sizes = sizes
        got = sizes.get(k)
        if got is None:
            raise FileNotFoundError(self.store.url(self.chunk_key(k)))
        return got

    def present_chunks(self) -> list[int]:
        """Indices of the chunk (or shard) files that exist, sorted (one directory listing)."""
        prefix = self.meta.key_prefix
        folder = join(self.key, prefix[:-1]) if prefix.endswith("/") else self.key
        head = "" if prefix.endswith("/") else prefix
        names = self.store.list(folder)
        out = []
        for name in names:
            if name.startswith(head) and name[len(head) :].isdigit():
                k = int(name[len(head) :])
                if k < self.nchunks:
                    out.append(k)
        return sorted(out)

    @property
    def nchunks(self) -> int:
        c = self.meta.chunk_len
        return -(-self.meta.length // c) if c else 0

    @property
    def unit(self) -> int:
        """Length of the unit read and cached at once (a chunk, or an inner chunk of a shard)."""
        return self._unit

    def chunk_key(self, k: int) -> str:
        return join(self.key, f"{self.meta.key_prefix}{k}")

    def _needed(self, u: int) -> int:
        """Items of unit ``u`` that lie inside the array."""
        return min(self._unit, self.meta.length - u * self._unit)

    def unit_array(self, u: int) -> np.ndarray:
        """Unit ``u`` as an array of ``dtype`` (a memory map, a cached decoded copy, or for a
        unit never written the array's shared fill unit, see :meth:`_fill_unit_array`).

        The result may be longer than the part inside the array (zarr pads the last chunk).
        Lookups take no lock (dict reads are atomic); only inserts and evictions do.
        """
        got = self._maps.get(u)
        if got is not None:
            return got
        got = self._slot.peek(u)
        if got is not None:
            return got  # type: ignore[no-any-return]
        arr, mapped = self._load_unit(u)
        if mapped:
            with self._lock:
                self._maps[u] = arr
                while len(self._maps) > 256:
                    self._maps.pop(next(iter(self._maps)))
                    # a new dict, not .clear(): a lookup adding units to the old one (a batch
                    # over more units than are kept) keeps the views it made for its call
                    self._views = {}
        else:
            self._slot.put(u, arr, arr.nbytes)
        return arr

    def units(
        self,
        wanted: Sequence[int],
        into: dict[int, Any] | None = None,
        ranges: dict[int, list[tuple[int, int]]] | None = None,
    ) -> dict[int, Any]:
        """Units ``wanted`` as arrays (or, with ``into``, as byte views added to it), each made
        at most once: first those the cache holds (refreshing their age, so that this call's
        decodes evict other units), then the others decoded. The caller keeps them for one call
        even if the byte cache evicts them meanwhile. With ``ranges`` (the item ranges of
        each unit the call reads), a unit may come back holding only those (a partial decode,
        not cached): ``into`` must then be the call's own dict."""
        got: dict[int, Any] = {} if into is None else into
        todo = []
        for u in wanted:
            if u in got:
                continue
            if self._maps.get(u) is not None or self._slot.get(u) is not None:
                got[u] = self._bytes_view(u) if into is not None else self.unit_array(u)
            else:
                todo.append(u)
        for u in todo:
            if u in got:
                continue
            part = None
            if ranges is not None and self._partial is not None and u in ranges:
                part = self._read_partial(u, ranges[u])
            if part is not None:
                got[u] = memoryview(part) if into is not None else part.view(self.dtype)
            else:
                got[u] = self._bytes_view(u) if into is not None else self.unit_array(u)
        return got

    def _read_partial(self, u: int, ranges: list[tuple[int, int]]) -> np.ndarray | None:
        """Chunk ``u`` as bytes holding only items of ``ranges``, or None (a full decode)."""
        assert self._partial is not None
        key = self.chunk_key(u)
        try:
            return self._partial.read(key, ranges, self._needed(u))
        except OSError:  # a chunk never written, or unreadable: the full read fills or reports
            return None
        except BadChunk as e:  # (only bad bytes: memory running out, or a bug, goes through)
            raise CorruptDataError(
                f"cannot decode chunk ({self.meta.codecs}): {e}",
                path=self.store.url(key),
                position=f"chunk {u}",
            ) from None

    def _bytes_view(self, u: int) -> memoryview:
        """Unit ``u`` as a flat byte memoryview, kept while the unit is (views of decoded units
        are dropped by :meth:`_check_views` once the byte cache evicts)."""
        v = self._views.get(u)
        if v is None:
            v = memoryview(np.ascontiguousarray(self.unit_array(u)).view(np.uint8))
            self._views[u] = v
        return v

    def _check_views(self) -> None:
        """Forget row views (which keep their units alive) when the byte cache has removed
        anything since they were made: a view never holds an evicted unit past one call."""
        cache = self._slot.cache
        if cache.epoch != self._epoch:
            self._views = {}
            self._epoch = cache.epoch

    def _fill(self, n: int) -> np.ndarray:
        return np.full(n, self.meta.fill_value, dtype=self.dtype)

    def _fill_unit_array(self) -> np.ndarray:
        """What every unit never written reads as: one read-only unit of the fill value, shared
        by all of them and kept with the memory maps (a sparse store of 10^12 tokens read at
        random would otherwise make a whole chunk of fill values per unit a batch touches).
        A fill of 0 (what every writer declares) is an anonymous mapping no page of which is
        ever written: reading it costs no memory, only the windows copied out of it count. Any
        other fill value costs one unit of memory, once per array."""
        got = self._fill_unit
        if got is not None:
            return got
        nbytes = self._unit * self.dtype.itemsize
        fill = self.meta.fill_value
        try:
            mm = mmap.mmap(
                -1,
                max(nbytes, 1),
                flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                prot=mmap.PROT_READ | (mmap.PROT_WRITE if fill else 0),
            )
        except (AttributeError, OSError, ValueError):  # no POSIX mmap, or no address space left
            got = self._fill(self._unit)
        else:
            got = np.frombuffer(mm, dtype=self.dtype, count=self._unit)
            if fill:
                got[:] = fill
        got.flags.writeable = False
        with self._lock:
            if self._fill_unit is None:
                self._fill_unit = got
            return self._fill_unit

    def _load_unit(self, u: int) -> tuple[np.ndarray, bool]:
        """(unit ``u``, whether it is kept with the maps rather than in the byte cache)."""
        need = self._needed(u)
        if self.meta.shard_inner:
            got = self._load_inner(u, need)
            return (self._fill_unit_array(), True) if got is None else (got, False)
        key = self.chunk_key(u)
        f = self.store.url(key)
        try:
            if self.raw:
                size = self._raw_size(u)
                if size == 0:
                    return self._fill(0), False
                mm = self.store.mmap(key)
                n = min(size // self.dtype.itemsize, self._unit)
                if mm is not None:
                    return np.frombuffer(mm, dtype=self.dtype, count=n), True
                buf = self.store.read_range(key, 0, n * self.dtype.itemsize)
                return np.frombuffer(buf, dtype=self.dtype, count=n), False
            if self.store.can_mmap:
                buf = self.store.read(key, MAX_CHUNK_BYTES)
            else:  # one GET: the size is known from the listing
                size = self.chunk_size(u)
                if size > MAX_CHUNK_BYTES:
                    raise UnsafeDataError(
                        f"chunk object of {size} bytes is larger than {MAX_CHUNK_BYTES}",
                        path=f,
                        position=f"chunk {u}",
                    )
                buf = self.store.read_range(key, 0, size)
        except FileNotFoundError:
            return self._fill_unit_array(), True
        except OSError as e:
            raise CorruptDataError(
                f"cannot read chunk: {e}", path=f, position=f"chunk {u}"
            ) from None
        return self._decode_buf(buf, need, f, f"chunk {u}"), False

    def _raw_size(self, u: int) -> int:
        """Bytes of uncompressed chunk ``u`` (FileNotFoundError if it was never written)."""
        key = self.chunk_key(u)
        size = self.chunk_size(u)
        need = self._needed(u)
        if size < need * self.dtype.itemsize:
            raise CorruptDataError(
                f"chunk file has {size} bytes, needs {need * self.dtype.itemsize}",
                path=self.store.url(key),
                position=f"chunk {u}",
            )
        return size

    def _read_ranges_raw(self, pieces: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """Item ranges ``(start, stop)`` of an uncompressed array on a store that cannot map,
        fetched as byte ranges (merged per chunk object), never as whole chunks."""
        unit, isz = self._unit, self.dtype.itemsize
        out: list[np.ndarray | None] = [None] * len(pieces)
        by_unit: dict[int, list[tuple[int, int, int, int]]] = {}  # u -> (piece, part, lo, hi)
        parts: list[list[np.ndarray]] = [[] for _ in pieces]
        for i, (a, b) in enumerate(pieces):
            if b <= a:
                out[i] = np.zeros(0, dtype=self.dtype)
                continue
            for u in range(a // unit, (b - 1) // unit + 1):
                lo, hi = max(a, u * unit) - u * unit, min(b, (u + 1) * unit) - u * unit
                by_unit.setdefault(u, []).append((i, len(parts[i]), lo, hi))
                parts[i].append(np.zeros(0, dtype=self.dtype))
        for u, want in by_unit.items():
            key = self.chunk_key(u)
            try:
                self._raw_size(u)
                if self._block_bytes:
                    blobs = [self._blocked(u, lo, hi) for _, _, lo, hi in want]
                else:
                    blobs = self.store.read_ranges(
                        key, [(lo * isz, (hi - lo) * isz) for _, _, lo, hi in want]
                    )
            except FileNotFoundError:
                blobs = [self._fill(hi - lo).tobytes() for _, _, lo, hi in want]
            except OSError as e:
                raise CorruptDataError(
                    f"cannot read chunk: {e}", path=self.store.url(key), position=f"chunk {u}"
                ) from None
            for (i, j, _lo, _hi), blob in zip(want, blobs, strict=True):
                parts[i][j] = np.frombuffer(blob, dtype=self.dtype)
        for i, ps in enumerate(parts):
            if out[i] is None:
                out[i] = ps[0].copy() if len(ps) == 1 else np.concatenate(ps)
        return out  # type: ignore[return-value]

    def _read_one_range(self, start: int, stop: int) -> np.ndarray | None:
        """Items ``start:stop`` of an uncompressed array on a store that cannot map, when they
        lie in one chunk whose size was checked before: one ranged read (a range-cache hit when
        warm), or a slice of a cached block; None sends the read down the general path (a first
        read of a chunk or block, a chunk never written, a read across chunks or blocks)."""
        unit = self._unit
        u = start // unit
        lo, hi = start - u * unit, stop - u * unit
        key = self._sized.get(u)
        if hi > unit or key is None:
            if hi <= unit:
                self._check_size(u)
            return None
        isz = self.dtype.itemsize
        if self._block_bytes:
            per = max(1, self._block_bytes // isz)
            j = lo // per
            blk = self._slot.peek(("block", u, j))
            if blk is None or (hi - 1) // per != j:
                return None
            at = (lo - j * per) * isz
        else:
            try:
                blk = self.store.read_range(key, lo * isz, (hi - lo) * isz)
            except OSError as e:
                raise CorruptDataError(
                    f"cannot read chunk: {e}", path=self.store.url(key), position=f"chunk {u}"
                ) from None
            at = 0
        if len(blk) < at + (hi - lo) * isz:
            return None  # the object changed under the reader: the general path reports it
        return np.frombuffer(blk, self.dtype, hi - lo, at).copy()

    def _check_size(self, u: int) -> None:
        """Remember chunk ``u``'s key once its size is known to hold its items (errors and
        missing chunks are left to the general path, which reports or fills them)."""
        try:
            self._raw_size(u)
        except (OSError, CorruptDataError):
            return
        self._sized[u] = self.chunk_key(u)

    def _blocked(self, u: int, lo: int, hi: int) -> bytes:
        """Items ``lo:hi`` of uncompressed chunk ``u`` from aligned blocks kept in the byte
        cache: one request per block the first time, none after."""
        isz = self.dtype.itemsize
        per = max(1, self._block_bytes // isz)
        end = self._needed(u)
        parts = []
        for j in range(lo // per, (hi - 1) // per + 1):
            blk = self._slot.get(("block", u, j))
            a = j * per
            if blk is None:
                n = (min(a + per, end) - a) * isz
                blk = self.store.read_range(self.chunk_key(u), a * isz, n)
                self._slot.put(("block", u, j), blk, len(blk))
            parts.append(blk[(max(lo, a) - a) * isz : (min(hi, a + per) - a) * isz])
        return b"".join(parts)

    def _decode_buf(self, buf: bytes, need: int, f: str, pos: str) -> np.ndarray:
        try:
            raw = np.frombuffer(buf, np.uint8) if self._decode is None else self._decode(buf)
        except BadChunk as e:  # (only bad bytes: memory running out, or a bug, goes through)
            raise CorruptDataError(
                f"cannot decode chunk ({self.meta.codecs}): {e}", path=f, position=pos
            ) from None
        nbytes = raw.nbytes
        if nbytes % self._storage_dtype.itemsize or nbytes < need * self.dtype.itemsize:
            raise CorruptDataError(
                f"chunk decodes to {nbytes} bytes, needs {need * self.dtype.itemsize}",
                path=f,
                position=pos,
            )
        arr = raw.view(self._storage_dtype)[: self._unit]
        if arr.dtype != self.dtype:
            arr = arr.astype(self.dtype)
        return arr

    def _load_inner(self, u: int, need: int) -> np.ndarray | None:
        """Inner chunk ``u`` of its shard decoded, or None where it was never written."""
        per = self.meta.chunk_len // self.meta.shard_inner
        k, j = divmod(u, per)
        key = self.chunk_key(k)
        f = self.store.url(key)
        pos = f"shard {k}, inner chunk {j}"
        try:
            got = self._slot.get(("index", k))
            if got is None:
                size = self.chunk_size(k)
                crc = self._index_crc
                isize = per * 16 + (4 if crc else 0)
                if size < isize:
                    raise CorruptDataError(
                        f"shard file of {size} bytes has no full index", path=f, position=pos
                    )
                at = size - isize if self._index_end else 0
                index_raw = self.store.read_range(key, at, isize)
                if len(index_raw) != isize:  # the file shrank since its size was read
                    raise CorruptDataError(
                        f"shard index cut short ({len(index_raw)} of {isize} bytes)",
                        path=f,
                        position=pos,
                    )
                if crc:
                    index_raw = crc32c_strip(index_raw)
                got = (np.frombuffer(index_raw, "<u8").reshape(per, 2), size)
                self._slot.put(("index", k), got, isize)
            index, size = got
            off, nb = int(index[j, 0]), int(index[j, 1])
            if off == _MISSING and nb == _MISSING:
                return None
            if off + nb > size or nb > MAX_CHUNK_BYTES:
                raise CorruptDataError(
                    f"index points past the shard ({off}+{nb} > {size})", path=f, position=pos
                )
            buf = self.store.read_range(key, off, nb)
        except FileNotFoundError:
            return None
        except BadChunk as e:  # (a ValueError here was any of ours: said twice, or a bug)
            raise CorruptDataError(f"bad shard index: {e}", path=f, position=pos) from None
        return self._decode_buf(buf, need, f, pos)

    # ----------------------------------------------------------------------------------------

    def read(self, start: int, stop: int, held: dict[int, Any] | None = None) -> np.ndarray:
        """Items ``start:stop`` (clipped to the array) as a new array (units from ``held``
        where there, a dict of :meth:`units`)."""
        n = self.meta.length
        start, stop = max(0, min(start, n)), max(0, min(stop, n))
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        if not self._mappable and self.raw:
            got = self._read_one_range(start, stop)
            return got if got is not None else self._read_ranges_raw([(start, stop)])[0]
        unit = self._unit
        first, last = start // unit, (stop - 1) // unit
        held = held or {}
        if first == last:
            a = held.get(first)
            a = self.unit_array(first) if a is None else a
            return np.array(a[start - first * unit : stop - first * unit])
        out = np.empty(stop - start, dtype=self.dtype)
        pos = 0
        for u in range(first, last + 1):
            a = held.get(u)
            a = self.unit_array(u) if a is None else a
            lo = max(start, u * unit) - u * unit
            hi = min(stop, (u + 1) * unit) - u * unit
            out[pos : pos + hi - lo] = a[lo:hi]
            pos += hi - lo
        return out

    def gather(self, starts: np.ndarray, length: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``out[i] = self[starts[i] : starts[i] + length]`` (all inside the array), into
        ``out`` (C-contiguous, of this array's dtype) when given."""
        starts = np.asarray(starts, dtype=np.int64)
        shape = (len(starts), length)
        if out is None:
            out = np.empty(shape, dtype=self.dtype)
        elif out.shape != shape or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape {shape}")
        if length == 0 or len(starts) == 0:
            return out
        unit = self._unit
        if not self._mappable and self.raw:
            s = starts.tolist()
            for i, row in enumerate(self._read_ranges_raw([(a, a + length) for a in s])):
                out[i] = row
            return out
        self._check_views()
        views = self._views
        parts = []
        if unit % length == 0 and not (starts % length).any():
            # the common case: rows aligned to the row length never straddle a unit, so a row
            # is row r % per of unit r // per, copied as bytes between memoryviews (a third
            # of the per-row cost of numpy indexing and assignment)
            u_of, k_of = np.divmod(starts // length, unit // length)
            rb = length * self.dtype.itemsize
            ob = memoryview(out.reshape(-1).view(np.uint8))
            at = 0
            for u, o in zip(u_of.tolist(), (k_of * rb).tolist(), strict=True):
                v = views.get(u)
                if v is None:
                    v = self._bytes_view(u)
                ob[at : at + rb] = v[o : o + rb]
                at += rb
            return out
        else:
            u_of = starts // unit
            u_end = (starts + (length - 1)) // unit
            ends = zip(u_of.tolist(), u_end.tolist(), strict=True)
            wanted = sorted({u for a, b in ends for u in range(a, b + 1)})
            held = self.units(wanted)  # each unit decoded at most once per call
            for s, u, lo in zip(
                starts.tolist(), u_of.tolist(), (starts - u_of * unit).tolist(), strict=True
            ):
                if lo + length <= unit:  # inside one unit: a view of its map or decoded copy
                    a = held[u]
                    if lo + length <= len(a):
                        parts.append(a[lo : lo + length])
                        continue
                parts.append(self.read(s, s + length, held))
        np.concatenate(parts, out=out.reshape(-1))
        return out
