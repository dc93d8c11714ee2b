"""Zarr metadata for the direct array reader: nodes, attributes, and one 1-D array's layout.

What an array's ``.zarray`` or ``zarr.json`` declares is parsed and checked here, once, into
frozen values (:class:`ArrayMeta`, :class:`Decoding`); :mod:`._zarr` reads chunks with them.
Declared sizes are checked before anything is allocated, and codecs that would run pickle or
other object decoders are refused (see :mod:`._codecs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdata import _json
from lmdata._deps import require
from lmdata.errors import CorruptDataError, FormatError, UnsafeDataError
from lmdata.formats.flat_tokens._codecs import Decoder, v2_decoder, v3_decoder
from lmdata.storage import Store, join

# A declared chunk larger than this is refused rather than allocated (hostile metadata).
MAX_CHUNK_BYTES = 1 << 31


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


@dataclass(frozen=True)
class Decoding:
    """How the stored bytes of one unit (a chunk, or an inner chunk of a shard) become items."""

    decode: Decoder | None  # None: the bytes are the items (no codec but ``bytes``)
    storage_dtype: np.dtype  # the items' dtype as stored (byte order included)
    index_crc: bool = False  # sharded: the shard index ends with a crc32c checksum
    index_end: bool = True  # sharded: the index is at the end of the shard (else the start)


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


def _key_prefix(enc: dict[str, Any], where: str) -> str:
    """What a v3 chunk key starts with: ``c/`` or ``c.`` (default encoding), none (v2)."""
    name = enc.get("name")
    sep = (enc.get("configuration") or {}).get("separator", "/" if name == "default" else ".")
    if name not in ("default", "v2") or sep not in ("/", "."):
        # (read as another layout, every chunk would be missing: all fill values, no error)
        raise FormatError(
            f"unsupported chunk_key_encoding {enc!r:.80} (supported: default, v2; '/' or '.')",
            path=where,
        )
    return f"c{sep}" if name == "default" else ""


def parse_array(store: Store, key: str) -> tuple[ArrayMeta, Decoding]:
    """The layout and decoding of the 1-D zarr array at ``key``; FormatError (or
    UnsafeDataError for sizes no reader should allocate) naming the metadata file if it is
    not one this reader supports."""
    p = store.url(key)
    try:
        return _parse(store, key, p)
    except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
        if isinstance(e, (FormatError, UnsafeDataError, CorruptDataError)):
            raise
        raise FormatError(  # metadata of the wrong shape: a list where an object belongs...
            f"malformed zarr metadata ({type(e).__name__}: {e})", path=p
        ) from None


def _parse(store: Store, key: str, p: str) -> tuple[ArrayMeta, Decoding]:
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
        if meta.get("order", "C") not in ("C", "F"):
            raise FormatError(f"bad order {meta.get('order')!r}", path=where)
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
        decode, desc, sharding = v3_decoder(meta.get("codecs") or [], dtype, max(chunk_len, 1), p)
        prefix = _key_prefix(meta.get("chunk_key_encoding") or {"name": "default"}, where)
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
    decoding = Decoding(decode, dtype)
    if sharding is not None:
        shard_inner = _positive_int(sharding.get("chunk_shape"), "inner chunk_shape", where)
        if shard_inner == 0 or chunk_len % shard_inner:
            raise FormatError("shard shape is not a multiple of the inner chunk shape", path=where)
        if shard_inner * dtype.itemsize > MAX_CHUNK_BYTES:
            raise UnsafeDataError("declared inner chunk is too large", path=where)
        inner_decode, inner_desc, nested = v3_decoder(
            sharding.get("codecs") or [{"name": "bytes"}], dtype, shard_inner, p
        )
        if nested is not None:
            raise FormatError("nested sharding is not supported", path=where)
        at = sharding.get("index_location", "end")
        if at not in ("start", "end"):
            raise FormatError(f"shard index_location {at!r} (expected start or end)", path=where)
        decoding = Decoding(
            inner_decode, dtype, _index_has_crc(sharding.get("index_codecs"), where), at == "end"
        )
        desc = f"sharding({inner_desc})"
    array = ArrayMeta(p, kind[0], length, chunk_len, dtype, int(fill), desc, prefix, shard_inner)
    return array, decoding
