"""Chunk decoders for the direct zarr reader: numcodecs (v2) and zarr v3 codec chains.

Only codecs whose decode is a pure function of bytes are accepted, and every decompression is
bounded by the chunk's declared size, so hostile metadata or frames cannot make us run pickle
or allocate without limit.
"""

from __future__ import annotations

import bz2
import functools
import lzma
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from lmdata._deps import require
from lmdata.errors import FormatError, UnsafeDataError
from lmdata.formats.flat_tokens._blosc import BadChunk, check_header

# numcodecs ids whose decode is a pure function of bytes (no pickle, no object arrays).
_SAFE_NUMCODECS = {
    "blosc",
    "zstd",
    "gzip",
    "zlib",
    "lz4",
    "bz2",
    "lzma",
    "delta",
    "crc32",
    "crc32c",
    "adler32",
    "fletcher32",
    "shuffle",
    "astype",
    "fixedscaleoffset",
    "bitround",
    "quantize",
}


def _numcodec(config: dict[str, Any], where: str) -> Any:
    import numcodecs

    cid = config.get("id")
    if cid not in _SAFE_NUMCODECS:
        raise UnsafeDataError(
            f"codec {cid!r} is not supported (allowed: {', '.join(sorted(_SAFE_NUMCODECS))})",
            path=where,
        )
    try:
        return numcodecs.get_codec(dict(config))
    except (ValueError, TypeError, KeyError) as e:
        raise FormatError(f"bad codec configuration {config}: {e}", path=where) from None


# streaming decompressors whose decompress(data, max_length) bounds the output
_STREAMS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(wbits=47),  # 47: gzip or zlib header, detected
    "zlib": lambda: zlib.decompressobj(wbits=15),
    "bz2": bz2.BZ2Decompressor,
    "lzma": lzma.LZMADecompressor,
}


# what the codec libraries raise on bytes they refuse (besides bz2's OSError and zstandard's
# ZstdError, caught where those run): numcodecs RuntimeError (a failed decompression, a
# checksum that does not match), ValueError (a size that is not a whole number of items) or
# IndexError (fletcher32 on fewer bytes than its checksum), zlib.error, lzma.LZMAError.
# Caught around the library calls only, never around our code.
_REFUSED: tuple[type[Exception], ...] = (
    RuntimeError,
    ValueError,
    IndexError,
    zlib.error,
    lzma.LZMAError,
)


def _bounded_decompress(cid: str, codec: Any, buf: bytes, limit: int) -> bytes:
    """Decompress ``buf`` refusing to produce more than ``limit`` bytes; BadChunk for bytes
    that do not decode."""
    if cid == "blosc":
        check_header(buf, limit)
        return bytes(_decode_with(codec, buf))
    if cid == "zstd":
        import zstandard

        try:
            size = zstandard.frame_content_size(buf)
        except zstandard.ZstdError as e:
            raise BadChunk(f"zstd frame header: {e}") from e
        if size > limit:
            raise BadChunk(f"zstd frame declares {size} bytes, more than the chunk's {limit}")
        # with no declared size, max_output_size bounds the output (ZstdError beyond it)
        try:
            return zstandard.ZstdDecompressor().decompress(buf, max_output_size=limit)
        except zstandard.ZstdError as e:
            raise BadChunk(str(e)) from e
    if cid in _STREAMS:
        try:
            out = _STREAMS[cid]().decompress(buf, limit + 1)
        except (*_REFUSED, OSError, EOFError) as e:  # bz2: OSError "Invalid data stream"
            raise BadChunk(str(e)) from e
        if len(out) > limit:
            raise BadChunk("stream decodes to more bytes than the chunk holds")
        return out
    if cid == "lz4":
        if len(buf) < 4:
            raise BadChunk("lz4 header cut short")
        (size,) = struct.unpack_from("<I", buf, 0)
        if size > limit:
            raise BadChunk(f"lz4 frame declares {size} bytes, more than the chunk's {limit}")
    return bytes(_decode_with(codec, buf))


def _decode_with(codec: Any, data: Any) -> Any:
    """``codec.decode(data)``, BadChunk for bytes the codec refuses."""
    try:
        return codec.decode(data)
    except _REFUSED as e:
        raise BadChunk(str(e)) from e


@functools.cache
def _crc32c() -> Callable[[bytes], int]:
    return require("google_crc32c", "reading a zarr v3 array with crc32c checksums").value


def crc32c_strip(buf: bytes) -> bytes:
    """``buf`` without its trailing crc32c checksum, which must match (BadChunk if not)."""
    crc = _crc32c()
    if len(buf) < 4:
        raise BadChunk("crc32c checksum cut short")
    data, stored = buf[:-4], struct.unpack("<I", buf[-4:])[0]
    if crc(data) != stored:
        raise BadChunk("crc32c checksum mismatch")
    return data


def _items(data: Any, dtype: np.dtype) -> np.ndarray:
    """Decoded bytes as items of ``dtype``; BadChunk when they are not a whole number."""
    n = memoryview(data).nbytes
    if n % dtype.itemsize:
        raise BadChunk(f"chunk decodes to {n} bytes, not whole {dtype.itemsize}-byte items")
    return np.frombuffer(data, dtype)


Decoder = Callable[[bytes], np.ndarray]


def _encoded_limit(filters: list[Any], nbytes: int) -> int:
    """The most bytes ``filters`` (numcodecs, in encoding order) make of a chunk of ``nbytes``:
    what its compressed frame may declare. A filter changing the item type scales it (AsType,
    or ``astype`` of Delta, FixedScaleOffset, Quantize), and a checksum appends 4 bytes (8 are
    allowed for each filter)."""
    size = nbytes
    for f in filters:
        dec, enc = getattr(f, "decode_dtype", None), getattr(f, "encode_dtype", None)
        if dec is None:
            dec, enc = getattr(f, "dtype", None), getattr(f, "astype", None)
        if dec is not None and enc is not None:
            d, e = np.dtype(dec).itemsize, np.dtype(enc).itemsize
            size = -(-size // d) * e
        size += 8
    return size


def v2_decoder(
    meta: dict[str, Any], dtype: np.dtype, chunk_len: int, where: str
) -> tuple[Decoder | None, str]:
    """(decoder, description) for a v2 array; decoder None means raw bytes (mmap-able)."""
    comp = meta.get("compressor")
    filters = meta.get("filters") or []
    if not isinstance(filters, list):
        raise FormatError("'filters' must be a list or null", path=f"{where}/.zarray")
    if comp is not None and not isinstance(comp, dict):
        raise FormatError("'compressor' must be an object or null", path=f"{where}/.zarray")
    comp_codec = _numcodec(comp, where) if comp else None
    filter_codecs = [_numcodec(f, where) for f in filters]
    limit = _encoded_limit(filter_codecs, chunk_len * dtype.itemsize)
    desc = ", ".join([f["id"] for f in filters] + ([comp["id"]] if comp else [])) or "none"
    if comp_codec is None and not filter_codecs:
        return None, desc

    def decode(buf: bytes) -> np.ndarray:
        data: Any = buf
        if comp_codec is not None:
            data = _bounded_decompress(comp["id"], comp_codec, buf, limit)
        for f in reversed(filter_codecs):
            data = _decode_with(f, data)
        arr = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray) else data, np.uint8)
        return arr

    return decode, desc


def v3_decoder(
    codecs: list[Any], dtype: np.dtype, chunk_len: int, where: str
) -> tuple[Decoder | None, str, dict[str, Any] | None]:
    """(decoder, description, sharding config) for a v3 codec chain."""
    names: list[str] = []
    array_codecs: list[Any] = []
    bytes_codecs: list[tuple[str, Any]] = []
    endian = "little"
    sharding = None
    seen_bytes = False
    for c in codecs:
        if isinstance(c, str):
            c = {"name": c}
        if not isinstance(c, dict) or "name" not in c:
            raise FormatError(f"bad codec entry {c!r}", path=f"{where}/zarr.json")
        name, conf = c["name"], c.get("configuration") or {}
        names.append(name)
        if name == "bytes":
            endian = conf.get("endian", "little") or "little"
            if endian not in ("little", "big"):
                raise FormatError(
                    f"bytes codec endian {endian!r} (expected 'little' or 'big')",
                    path=f"{where}/zarr.json",
                )
            if endian == "big":  # named in the description: the stored bytes are swapped
                names[-1] = "bytes(big)"
            seen_bytes = True
        elif name == "sharding_indexed":
            sharding = conf
            seen_bytes = True
        elif name == "transpose":
            continue  # a 1-D transpose is the identity
        elif name in ("zstd", "gzip", "blosc", "crc32c"):
            if not seen_bytes:
                raise FormatError(f"codec {name} before the bytes codec", path=where)
            if name == "crc32c":
                require("google_crc32c", "reading a zarr v3 array with crc32c checksums")
                bytes_codecs.append(("crc32c", None))
            elif name == "blosc":
                shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}.get(
                    conf.get("shuffle", "noshuffle"), 0
                )
                bytes_codecs.append(
                    (
                        "blosc",
                        _numcodec(
                            {
                                "id": "blosc",
                                "cname": conf.get("cname", "lz4"),
                                "clevel": conf.get("clevel", 5),
                                "shuffle": shuffle,
                            },
                            where,
                        ),
                    )
                )
            else:
                bytes_codecs.append((name, _numcodec({"id": name}, where)))
        elif name.startswith("numcodecs."):
            cid = name.split(".", 1)[1]
            codec = _numcodec({"id": cid, **conf}, where)
            if seen_bytes:
                bytes_codecs.append((cid, codec))
            else:
                array_codecs.append(codec)
        else:
            raise FormatError(f"unsupported zarr v3 codec {name!r}", path=f"{where}/zarr.json")
    desc = ", ".join(n for n in names if n not in ("bytes", "transpose")) or "none"
    if sharding is not None:
        return None, desc, sharding
    limit = chunk_len * dtype.itemsize
    if not array_codecs and not bytes_codecs and endian == "little":
        return None, desc, None
    swap = endian == "big"

    def decode(buf: bytes) -> np.ndarray:
        data: Any = buf
        for cid, codec in reversed(bytes_codecs):
            data = (
                crc32c_strip(data)
                if cid == "crc32c"
                else _bounded_decompress(cid, codec, data, limit)
            )
        arr = _items(bytes(data), dtype.newbyteorder(">") if swap else dtype)
        if swap:
            arr = arr.astype(dtype)
        for codec in reversed(array_codecs):
            arr = _items(np.ascontiguousarray(_decode_with(codec, arr.tobytes())), dtype)
        return arr.view(np.uint8)

    return decode, desc, None
