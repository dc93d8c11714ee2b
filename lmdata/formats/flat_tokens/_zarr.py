"""A small, direct reader of 1-D zarr arrays (zarr format v2 and v3) for the hot path.

zarr-python costs tens of microseconds per call and decodes whole chunks; here chunk objects
are read directly through a store: local uncompressed chunks are memory-mapped, remote ones
read by byte ranges, compressed ones decoded once into the process-wide byte cache. Only what
flat-tokens needs is supported: 1-D integer arrays, regular chunks,
the v2 compressors/filters of numcodecs, the v3 codecs ``bytes``, ``transpose``, ``zstd``,
``gzip``, ``blosc``, ``crc32c``, ``numcodecs.*`` and ``sharding_indexed``.

Declared sizes are checked before anything is allocated, and codecs that would run pickle or
other object decoders are refused.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdata import _json
from lmdata._deps import require
from lmdata.errors import CorruptDataError, FormatError, LmdataError, UnsafeDataError
from lmdata.formats.flat_tokens._codecs import crc32c_strip, v2_decoder, v3_decoder
from lmdata.storage import Store, join, new_slot

# A declared chunk larger than this is refused rather than allocated (hostile metadata).
MAX_CHUNK_BYTES = 1 << 31
DEFAULT_CACHE_BYTES = 256 << 20
_MISSING = 2**64 - 1


def read_json(store: Store, key: str) -> dict[str, Any]:
    """A zarr metadata object as a dict (bounded in size and nesting, see lmdata._json)."""
    data = store.read(key, _json.MAX_METADATA_BYTES + 1)
    return _json.from_bytes(data, path=store.url(key), what="zarr metadata")


def _read_json_if_any(store: Store, key: str) -> dict[str, Any] | None:
    try:
        return read_json(store, key)
    except (FileNotFoundError, NotADirectoryError):
        return None


def node_kind(store: Store, key: str) -> tuple[int, str] | None:
    """(zarr_format, 'group'|'array') for a zarr node at ``key``, or None."""
    names = store.list(key)
    if "zarr.json" in names:
        meta = read_json(store, join(key, "zarr.json"))
        return 3, str(meta.get("node_type", ""))
    if ".zarray" in names:
        return 2, "array"
    if ".zgroup" in names:
        return 2, "group"
    return None


def node_attrs(store: Store, key: str) -> dict[str, Any]:
    """The user attributes of a zarr group or array (v2 ``.zattrs`` or v3 ``attributes``)."""
    v3 = _read_json_if_any(store, join(key, "zarr.json"))
    if v3 is not None:
        attrs = v3.get("attributes", {})
    else:
        attrs = _read_json_if_any(store, join(key, ".zattrs")) or {}
    if not isinstance(attrs, dict):
        raise CorruptDataError("attributes are not a JSON object", path=store.url(key))
    return attrs


# --------------------------------------------------------------------------------------------
# the array


@dataclass(frozen=True)
class ArrayMeta:
    """What the reader needs to know about one 1-D zarr array, parsed and checked once."""

    path: str  # where the array is, as shown to users
    zarr_format: int
    length: int
    chunk_len: int
    dtype: np.dtype
    fill_value: int
    codecs: str
    key_prefix: str  # "" (v2, v3 "v2" encoding) or "c/" / "c." (v3 default)
    shard_inner: int = 0  # inner chunk length when sharded, else 0


def _parse_dtype(raw: Any, where: str) -> np.dtype:
    v3names = {
        "uint8": "u1",
        "uint16": "u2",
        "uint32": "u4",
        "uint64": "u8",
        "int8": "i1",
        "int16": "i2",
        "int32": "i4",
        "int64": "i8",
    }
    try:
        dt = np.dtype(v3names.get(raw, raw) if isinstance(raw, str) else raw)
    except TypeError:
        raise FormatError(f"unsupported dtype {raw!r}", path=where) from None
    if dt.kind not in "iu":
        raise FormatError(f"dtype {raw!r} is not an integer type", path=where)
    return dt


def _positive_int(obj: Any, what: str, where: str) -> int:
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    elif isinstance(obj, list):
        raise FormatError(f"{what} must be 1-dimensional, got {obj}", path=where)
    if not isinstance(obj, int) or isinstance(obj, bool) or obj < 0:
        raise FormatError(f"{what} must be a non-negative integer, got {obj!r}", path=where)
    if obj > 2**48:  # 2^48 items is petabytes: a typo or a hostile file, not a dataset
        raise FormatError(f"{what} {obj} is implausibly large", path=where)
    return obj


def _index_has_crc(codecs: Any, where: str) -> bool:
    """Whether a shard index ends with a crc32c checksum (its codecs: ``bytes``, ``crc32c``)."""
    if codecs is None:
        return False
    if not isinstance(codecs, list):
        raise FormatError(f"sharding index_codecs must be a list, got {codecs!r:.60}", path=where)
    names = []
    for c in codecs:
        name = c if isinstance(c, str) else c.get("name") if isinstance(c, dict) else None
        if not isinstance(name, str):
            raise FormatError(
                f"sharding index_codecs entry {c!r:.60} is not a codec (an object with a name)",
                path=where,
            )
        names.append(name)
    unknown = set(names) - {"bytes", "crc32c"}
    if unknown:
        raise FormatError(
            f"unsupported shard index codecs {sorted(unknown)} (supported: bytes, crc32c)",
            path=where,
        )
    if "crc32c" not in names:
        return False
    require("google_crc32c", "reading a sharded zarr v3 array (its index has a crc32c checksum)")
    return True


class ZArray:
    """Random reads of a 1-D zarr array straight from its chunk objects in a store.

    Decoded chunks live in the process-wide byte cache (at most ``cache_bytes`` of them for this
    array; 0 keeps none); local uncompressed chunks are memory maps, kept per array.
    """

    def __init__(self, store: Store, key: str, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.store = store
        self.key = key
        self.path = store.url(key)
        self._cache_bytes = cache_bytes
        try:
            self._parse()
        except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
            if isinstance(e, (FormatError, UnsafeDataError, CorruptDataError)):
                raise
            raise FormatError(  # metadata of the wrong shape: a list where an object belongs...
                f"malformed zarr metadata ({type(e).__name__}: {e})", path=self.path
            ) from None
        self._init_cache()

    # pickling ships only the store and key: each process builds its own caches and maps
    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "key": self.key, "cache_bytes": self._cache_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["store"], state["key"], state["cache_bytes"])  # type: ignore[misc]

    def _init_cache(self) -> None:
        self._lock = threading.Lock()
        self._slot = new_slot(self._cache_bytes)  # decoded units and shard indexes
        # memory maps (no copies, so outside the byte budget); FIFO, cheap lookups
        self._maps: dict[int, np.ndarray] = {}
        self._views: dict[int, memoryview] = {}
        self._epoch = -1
        self._mappable = self.raw and self.store.can_mmap  # else read by byte ranges

    def close(self) -> None:
        """Drop cached chunks and maps (they are read again if the array is used again)."""
        with self._lock:
            self._slot.clear()
            self._maps.clear()
            self._views.clear()

    def _parse(self) -> None:
        store, key = self.store, self.key
        p = self.path
        kind = node_kind(store, key)
        if kind is None or kind[1] != "array":
            raise FormatError("not a zarr array (no .zarray or zarr.json)", path=p)
        sharding = None
        if kind[0] == 2:
            meta = read_json(store, join(key, ".zarray"))
            where = f"{p}/.zarray"
            length = _positive_int(meta.get("shape"), "shape", where)
            chunk_len = _positive_int(meta.get("chunks"), "chunks", where)
            dtype = _parse_dtype(meta.get("dtype"), where)
            order_ok = meta.get("order", "C") in ("C", "F")
            if not order_ok:
                raise FormatError(f"bad order {meta.get('order')!r}", path=where)
            self._storage_dtype = dtype
            decode, desc = v2_decoder(meta, dtype, max(chunk_len, 1), p)
            prefix = ""
        else:
            meta = read_json(store, join(key, "zarr.json"))
            where = f"{p}/zarr.json"
            length = _positive_int(meta.get("shape"), "shape", where)
            grid = meta.get("chunk_grid") or {}
            if grid.get("name") != "regular":
                raise FormatError(f"unsupported chunk grid {grid.get('name')!r}", path=where)
            chunk_len = _positive_int(
                (grid.get("configuration") or {}).get("chunk_shape"), "chunk_shape", where
            )
            dtype = _parse_dtype(meta.get("data_type"), where)
            self._storage_dtype = dtype
            decode, desc, sharding = v3_decoder(
                meta.get("codecs") or [], dtype, max(chunk_len, 1), p
            )
            enc = meta.get("chunk_key_encoding") or {"name": "default"}
            sep = (enc.get("configuration") or {}).get("separator", "/")
            prefix = f"c{sep}" if enc.get("name") == "default" else ""
        if chunk_len == 0 and length:
            raise FormatError("chunk length 0 for a non-empty array", path=where)
        if chunk_len * dtype.itemsize > MAX_CHUNK_BYTES and sharding is None:
            raise UnsafeDataError(
                f"declared chunk of {chunk_len} items is larger than {MAX_CHUNK_BYTES} bytes",
                path=where,
            )
        fill = meta.get("fill_value")
        if fill is None:
            fill = 0
        if not isinstance(fill, int) or isinstance(fill, bool):
            raise FormatError(f"fill_value {fill!r} is not an integer", path=where)
        shard_inner = 0
        if sharding is not None:
            shard_inner = _positive_int(sharding.get("chunk_shape"), "inner chunk_shape", where)
            if shard_inner == 0 or chunk_len % shard_inner:
                raise FormatError(
                    "shard shape is not a multiple of the inner chunk shape", path=where
                )
            if shard_inner * dtype.itemsize > MAX_CHUNK_BYTES:
                raise UnsafeDataError("declared inner chunk is too large", path=where)
            inner_decode, inner_desc, nested = v3_decoder(
                sharding.get("codecs") or [{"name": "bytes"}], dtype, shard_inner, p
            )
            if nested is not None:
                raise FormatError("nested sharding is not supported", path=where)
            self._index_crc = _index_has_crc(sharding.get("index_codecs"), where)
            self._index_end = sharding.get("index_location", "end") != "start"
            decode = inner_decode
            desc = f"sharding({inner_desc})"
        self._decode = decode
        self.meta = ArrayMeta(
            p, kind[0], length, chunk_len, dtype, int(fill), desc, prefix, shard_inner
        )
        self.dtype = dtype.newbyteorder("=")
        self._unit = shard_inner or chunk_len  # the decodable unit
        self.raw = (
            decode is None
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
        """Unit ``u`` as an array of ``dtype`` (a memory map or a cached decoded copy).

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
                    self._views.clear()
        else:
            self._slot.put(u, arr, arr.nbytes)
        return arr

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

    def _load_unit(self, u: int) -> tuple[np.ndarray, bool]:
        need = self._needed(u)
        if self.meta.shard_inner:
            return self._load_inner(u, need), False
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
            buf = self.store.read(key, MAX_CHUNK_BYTES)
        except FileNotFoundError:
            return self._fill(need), False
        except OSError as e:
            raise CorruptDataError(
                f"cannot read chunk: {e}", path=f, position=f"chunk {u}"
            ) from None
        return self._decode_buf(buf, need, f, f"chunk {u}"), False

    def _raw_size(self, u: int) -> int:
        """Bytes of uncompressed chunk ``u`` (FileNotFoundError if it was never written)."""
        key = self.chunk_key(u)
        size = self.store.size(key)
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

    def _decode_buf(self, buf: bytes, need: int, f: str, pos: str) -> np.ndarray:
        try:
            if self._decode is None:
                raw = np.frombuffer(buf, np.uint8)
            else:
                raw = self._decode(buf)
        except LmdataError:
            raise
        except Exception as e:  # codec libraries raise anything from RuntimeError to ValueError
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

    def _load_inner(self, u: int, need: int) -> np.ndarray:
        per = self.meta.chunk_len // self.meta.shard_inner
        k, j = divmod(u, per)
        key = self.chunk_key(k)
        f = self.store.url(key)
        pos = f"shard {k}, inner chunk {j}"
        try:
            got = self._slot.get(("index", k))
            if got is None:
                size = self.store.size(key)
                crc = self._index_crc
                isize = per * 16 + (4 if crc else 0)
                if size < isize:
                    raise CorruptDataError(
                        f"shard file of {size} bytes has no full index", path=f, position=pos
                    )
                at = size - isize if self._index_end else 0
                index_raw = self.store.read_range(key, at, isize)
                if crc:
                    index_raw = crc32c_strip(index_raw)
                got = (np.frombuffer(index_raw, "<u8").reshape(per, 2), size)
                self._slot.put(("index", k), got, isize)
            index, size = got
            off, nb = int(index[j, 0]), int(index[j, 1])
            if off == _MISSING and nb == _MISSING:
                return self._fill(need)
            if off + nb > size or nb > MAX_CHUNK_BYTES:
                raise CorruptDataError(
                    f"index points past the shard ({off}+{nb} > {size})", path=f, position=pos
                )
            buf = self.store.read_range(key, off, nb)
        except FileNotFoundError:
            return self._fill(need)
        except ValueError as e:
            raise CorruptDataError(f"bad shard index: {e}", path=f, position=pos) from None
        return self._decode_buf(buf, need, f, pos)

    # ----------------------------------------------------------------------------------------

    def read(self, start: int, stop: int) -> np.ndarray:
        """Items ``start:stop`` (clipped to the array) as a new array."""
        n = self.meta.length
        start, stop = max(0, min(start, n)), max(0, min(stop, n))
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        if not self._mappable and self.raw:
            return self._read_ranges_raw([(start, stop)])[0]
        unit = self._unit
        first, last = start // unit, (stop - 1) // unit
        if first == last:
            a = self.unit_array(first)
            return np.array(a[start - first * unit : stop - first * unit])
        out = np.empty(stop - start, dtype=self.dtype)
        pos = 0
        for u in range(first, last + 1):
            a = self.unit_array(u)
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
            for s, u, lo in zip(
                starts.tolist(), u_of.tolist(), (starts - u_of * unit).tolist(), strict=True
            ):
                if lo + length <= unit:  # inside one unit: a view of its map or decoded copy
                    a = self.unit_array(u)
                    if lo + length <= len(a):
                        parts.append(a[lo : lo + length])
                        continue
                parts.append(self.read(s, s + length))
        np.concatenate(parts, out=out.reshape(-1))
        return out
