"""Every MDS column encoding of mosaicml-streaming 0.13.0, both directions.

A :class:`Coder` turns one column value into bytes and back. Decoders return the same Python
types streaming's reader returns (numpy scalars for the numpy dtypes, read-only arrays for
``ndarray``, lazily loaded PIL images for ``jpeg``/``png``). Encoders raise
:class:`InvalidInputError` for values streaming would refuse; decoders raise plain
``ValueError`` that the shard reader turns into :class:`CorruptDataError` with its place.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from typing import Any

import numpy as np

from lmdata import _json
from lmdata._pickle import safe_loads
from lmdata.errors import InvalidInputError, UnsafeDataError

# numpy dtype name <-> one-byte code used when an ndarray column has no dtype in its name.
VALUE_DTYPES: dict[int, str] = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
DTYPE_CODES: dict[str, int] = {v: k for k, v in VALUE_DTYPES.items()}
# The shape of a dynamic-shape ndarray is stored as the smallest uint type above its largest dim.
_SHAPE_DTYPES = ("<u1", "<u2", "<u4", "<u8")
SCALARS = (
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
)
SIMPLE = (
    "bytes",
    "str",
    "int",
    *SCALARS,
    "str_int",
    "str_float",
    "str_decimal",
    "pil",
    "jpeg",
    "png",
    "list[pil]",
    "list[jpeg]",
    "list[png]",
    "jpeg_array",
    "jpegarray",
    "json",
    "pkl",
)
UNSAFE = frozenset({"pkl"})
_U32 = struct.Struct("<I")


class Coder:
    """Encode/decode one column; ``size`` is the fixed byte size or None when variable."""

    __slots__ = ("decode", "encode", "name", "size")

    def __init__(
        self,
        name: str,
        size: int | None,
        encode: Callable[[Any], bytes],
        decode: Callable[[bytes], Any],
    ) -> None:
        self.name = name
        self.size = size
        self.encode = encode
        self.decode = decode


def _need(value: Any, kind: type | tuple[type, ...], enc: str) -> None:
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidInputError(
            f"encoding {enc!r} needs a {names} value, got {type(value).__name__}"
        )


# ---- scalars and strings -----------------------------------------------------------------


def _enc_bytes(v: Any) -> bytes:
    _need(v, (bytes, bytearray, memoryview), "bytes")
    return bytes(v)


def _enc_str(v: Any) -> bytes:
    _need(v, str, "str")
    return v.encode("utf-8")


def _dec_str(b: bytes) -> str:
    return b.decode("utf-8")


def _enc_int(v: Any) -> bytes:
    _need(v, int, "int")  # like streaming: a Python int (bool included), not a numpy integer
    if not -(2**63) <= v < 2**63:
        raise InvalidInputError(f"encoding 'int' stores int64; {v} is out of range")
    return int(v).to_bytes(8, "little", signed=True)


def _dec_int(b: bytes) -> int:
    if len(b) != 8:
        raise ValueError(f"an int column holds 8 bytes, found {len(b)}")
    return int.from_bytes(b, "little", signed=True)


def _scalar(dtype_name: str) -> Coder:
    dt = np.dtype(dtype_name).newbyteorder("<")
    np_type = np.dtype(dtype_name).type

    def enc(v: Any) -> bytes:
        try:
            with np.errstate(over="ignore"):
                x = np_type(v)
        except (OverflowError, ValueError, TypeError) as e:
            raise InvalidInputError(f"encoding {dtype_name!r} cannot store {v!r}: {e}") from None
        return np.asarray(x, dtype=dt).tobytes()

    def dec(b: bytes) -> Any:
        if len(b) != dt.itemsize:
            raise ValueError(f"a {dtype_name} column holds {dt.itemsize} bytes, found {len(b)}")
        return np.frombuffer(b, dt)[0]

    return Coder(dtype_name, dt.itemsize, enc, dec)


def _str_coder(name: str, kind: type, parse: Callable[[str], Any]) -> Coder:
    def enc(v: Any) -> bytes:
        _need(v, kind, name)
        return str(v).encode("utf-8")

    def dec(b: bytes) -> Any:
        return parse(b.decode("utf-8"))

    return Coder(name, None, enc, dec)


def _parse_decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except ArithmeticError:
        raise ValueError(f"{text[:40]!r} is not a decimal number") from None


# ---- ndarray -----------------------------------------------------------------------------


def _ndarray(dtype: str | None, shape: tuple[int, ...] | None, name: str) -> Coder:
    fixed_dt = np.dtype(dtype).newbyteorder("<") if dtype else None
    size = None
    if fixed_dt is not None and shape is not None:
        size = int(np.prod(shape)) * fixed_dt.itemsize

    def enc(v: Any) -> bytes:
        arr = v if isinstance(v, np.ndarray) else np.asarray(v, dtype=fixed_dt)
        code = DTYPE_CODES.get(arr.dtype.name)
        if code is None:
            raise InvalidInputError(
                f"encoding {name!r} cannot store dtype {arr.dtype}; use one of "
                f"{', '.join(DTYPE_CODES)}"
            )
        parts: list[bytes] = []
        if fixed_dt is None:
            parts.append(bytes([code]))
        elif arr.dtype.name != dtype:
            arr = _cast_integers(arr, fixed_dt, name)
        if arr.size == 0:
            raise InvalidInputError(
                f"encoding {name!r} cannot store an empty array (streaming "
                "refuses arrays with 0 elements)"
            )
        if shape is None:
            if arr.ndim == 0:
                raise InvalidInputError(
                    f"encoding {name!r} cannot store a 0-d array; use a "
                    "scalar encoding such as 'int64'"
                )
            if arr.ndim >= 64:
                raise InvalidInputError(f"an ndarray may have at most 63 axes, got {arr.ndim}")
            biggest = max(arr.shape)
            sd = 0 if biggest < 1 << 8 else 1 if biggest < 1 << 16 else 2 if biggest < 2**32 else 3
            parts.append(bytes([(arr.ndim << 2) | sd]))
            parts.append(np.asarray(arr.shape, dtype=_SHAPE_DTYPES[sd]).tobytes())
        elif arr.shape != shape:
            raise InvalidInputError(f"encoding {name!r} needs shape {shape}, got {arr.shape}")
        parts.append(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
        return b"".join(parts)

    def dec(b: bytes) -> np.ndarray:
        if fixed_dt is not None and shape is None and len(b) > 1 and b[0] >> 2 == 1:
            # the common case (token arrays): a known dtype and a 1-D shape stored per sample
            w = 1 << (b[0] & 3)
            dim = int.from_bytes(b[1 : 1 + w], "little")
            if dim * fixed_dt.itemsize == len(b) - 1 - w:
                return np.frombuffer(b, fixed_dt, dim, 1 + w)
        pos = 0
        if fixed_dt is None:
            if not b:
                raise ValueError("ndarray value is empty")
            dname = VALUE_DTYPES.get(b[0])
            if dname is None:
                raise ValueError(f"unknown ndarray dtype code {b[0]}")
            dt = np.dtype(dname).newbyteorder("<")
            pos = 1
        else:
            dt = fixed_dt
        if shape is None:
            if len(b) <= pos:
                raise ValueError("ndarray value ends before its shape")
            ndim, sd = b[pos] >> 2, b[pos] & 3
            pos += 1
            nbytes = ndim << sd
            if len(b) < pos + nbytes:
                raise ValueError("ndarray value ends inside its shape")
            shp = tuple(int(x) for x in np.frombuffer(b, _SHAPE_DTYPES[sd], ndim, pos))
            pos += nbytes
        else:
            shp = shape
        count = 1
        for d in shp:
            count *= d
        if count * dt.itemsize != len(b) - pos:
            raise ValueError(
                f"ndarray of shape {shp} and dtype {dt.name} needs "
                f"{count * dt.itemsize} bytes, found {len(b) - pos}"
            )
        return np.frombuffer(b, dt, count, pos).reshape(shp)

    return Coder(name, size, enc, dec)


def _cast_integers(arr: np.ndarray, dt: np.dtype, name: str) -> np.ndarray:
    """Integer arrays convert to an integer column dtype when every value fits exactly
    (token ids from another reader); anything else is refused, as streaming refuses it."""
    if arr.dtype.kind in "iu" and dt.kind in "iu" and arr.size:
        info = np.iinfo(dt)
        if int(arr.min()) >= info.min and int(arr.max()) <= info.max:
            return arr.astype(dt)
    raise InvalidInputError(f"encoding {name!r} needs dtype {dt.name}, got {arr.dtype}")


def parse_ndarray(encoding: str) -> tuple[str | None, tuple[int, ...] | None]:
    """(dtype, shape) of an ``ndarray[:dtype[:d0,d1,...]]`` encoding, or ValueError."""
    args = encoding.split(":")[1:]
    if len(args) > 2:
        raise ValueError(f"{encoding!r}: write ndarray, ndarray:DTYPE or ndarray:DTYPE:D0,D1")
    dtype = args[0] if args else None
    if dtype is not None and dtype not in DTYPE_CODES:
        raise ValueError(f"{encoding!r}: dtype must be one of {', '.join(DTYPE_CODES)}")
    shape = None
    if len(args) == 2:
        try:
            shape = tuple(int(x) for x in args[1].split(","))
        except ValueError:
            raise ValueError(f"{encoding!r}: the shape must be integers joined by commas") from None
        if any(d < 1 for d in shape):
            raise ValueError(f"{encoding!r}: every dimension must be at least 1")
    return dtype, shape


# ---- images ------------------------------------------------------------------------------


def _image_module() -> Any:
    from PIL import Image

    return Image


def _enc_pil(v: Any) -> bytes:
    image = _image_module()
    _need(v, image.Image, "pil")
    mode = v.mode.encode("utf-8")
    w, h = v.size
    return struct.pack("<III", w, h, len(mode)) + mode + v.tobytes()


def _dec_pil(b: bytes) -> Any:
    if len(b) < 12:
        raise ValueError("pil value is shorter than its 12-byte header")
    w, h, mlen = struct.unpack_from("<III", b)
    mode = b[12 : 12 + mlen].decode("utf-8")
    raw = b[12 + mlen :]
    if w * h > 8 * len(raw) + 8:  # refuse to allocate far beyond the data we hold
        raise ValueError(f"pil image of {w}x{h} pixels cannot come from {len(raw)} bytes")
    return _image_module().frombytes(mode, (w, h), raw)


def _enc_jpeg(v: Any) -> bytes:
    image = _image_module()
    _need(v, image.Image, "jpeg")
    from PIL.JpegImagePlugin import JpegImageFile

    # streaming stores the original file of an image opened from a JPEG file, unchanged
    if isinstance(v, JpegImageFile) and getattr(v, "filename", None):
        try:
            with open(v.filename, "rb") as f:
                return f.read()
        except FileNotFoundError:
            pass
    out = io.BytesIO()
    v.save(out, format="JPEG")
    return out.getvalue()


def _enc_png(v: Any) -> bytes:
    _need(v, _image_module().Image, "png")
    out = io.BytesIO()
    v.save(out, format="PNG")
    return out.getvalue()


def _dec_image(b: bytes) -> Any:
    return _image_module().open(io.BytesIO(b))


def _list_coder(name: str, inner: Coder) -> Coder:
    def enc(v: Any) -> bytes:
        _need(v, list, name)
        items = [inner.encode(x) for x in v]
        head = struct.pack(f"<II{len(items)}I", 0, len(items), *map(len, items))
        return head + b"".join(items)

    def dec(b: bytes) -> list[Any]:
        if len(b) < 8:
            raise ValueError(f"{name} value is shorter than its 8-byte header")
        (n,) = _U32.unpack_from(b, 4)
        return _split_items(b, 8, n, inner.decode, name)

    return Coder(name, None, enc, dec)


def _split_items(b: bytes, pos: int, n: int, decode: Callable[[bytes], Any], name: str) -> list:
    if pos + 4 * n > len(b):
        raise ValueError(f"{name} declares {n} items, more than its {len(b)} bytes can hold")
    sizes = struct.unpack_from(f"<{n}I", b, pos)
    pos += 4 * n
    if pos + sum(sizes) > len(b):
        raise ValueError(f"{name} item sizes add up to more than the value holds")
    out = []
    for s in sizes:
        out.append(decode(b[pos : pos + s]))
        pos += s
    return out


def _enc_jpeg_array(v: Any) -> bytes:
    if not isinstance(v, (list, tuple)) or not all(
        isinstance(x, (bytes, bytearray, memoryview)) for x in v
    ):
        raise InvalidInputError("encoding 'jpeg_array' needs a list of JPEG-encoded bytes")
    items = [bytes(x) for x in v]
    return struct.pack(f"<I{len(items)}I", len(items), *map(len, items)) + b"".join(items)


def _dec_jpeg_array(b: bytes) -> list[Any]:
    if len(b) < 4:
        raise ValueError("jpeg_array value is shorter than its 4-byte count")
    (n,) = _U32.unpack_from(b, 0)
    if n == 0:
        raise ValueError("jpeg_array holds no images")  # streaming refuses these too
    return _split_items(b, 4, n, _dec_image, "jpeg_array")


# ---- json and pickle ---------------------------------------------------------------------


def _enc_json(v: Any) -> bytes:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    try:
        text = json.dumps(v)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"encoding 'json' cannot store this value: {e}") from None
    return text.encode("utf-8")


def _dec_json(b: bytes) -> Any:
    return _json.parse(b)  # json.loads's values, orjson's speed, bounded nesting


def _enc_pkl(v: Any) -> bytes:
    import pickle

    return pickle.dumps(v)


# ---- the table ---------------------------------------------------------------------------


def _build(encoding: str, allow_unsafe_pickle: bool) -> Coder:
    if encoding == "bytes":
        return Coder(encoding, None, _enc_bytes, bytes)
    if encoding == "str":
        return Coder(encoding, None, _enc_str, _dec_str)
    if encoding == "int":
        return Coder(encoding, 8, _enc_int, _dec_int)
    if encoding in SCALARS:
        return _scalar(encoding)
    if encoding == "str_int":
        return _str_coder(encoding, int, int)
    if encoding == "str_float":
        return _str_coder(encoding, float, float)
    if encoding == "str_decimal":
        return _str_coder(encoding, Decimal, _parse_decimal)
    if encoding == "ndarray" or encoding.startswith("ndarray:"):
        return _ndarray(*parse_ndarray(encoding), encoding)
    if encoding == "pil":
        return Coder(encoding, None, _enc_pil, _dec_pil)
    if encoding == "jpeg":
        return Coder(encoding, None, _enc_jpeg, _dec_image)
    if encoding == "png":
        return Coder(encoding, None, _enc_png, _dec_image)
    if encoding in ("list[pil]", "list[jpeg]", "list[png]"):
        return _list_coder(encoding, _build(encoding[5:-1], False))
    if encoding in ("jpeg_array", "jpegarray"):
        return Coder(encoding, None, _enc_jpeg_array, _dec_jpeg_array)
    if encoding == "json":
        return Coder(encoding, None, _enc_json, _dec_json)
    if encoding == "pkl":

        def dec_pkl(b: bytes) -> Any:
            # The rule: a pkl column is read only when the user trusts the file.
            if not allow_unsafe_pickle:
                raise UnsafeDataError(
                    "this dataset has a pkl column, which can run code when read; pass "
                    "allow_unsafe_pickle=True (--allow-unsafe-pickle) if you trust it",
                    position="pkl column",
                )
            return safe_loads(b, where="pkl column", allow_unsafe=True)

        return Coder(encoding, None, _enc_pkl, dec_pkl)
    raise ValueError(
        f"unknown MDS encoding {encoding!r}; known: {', '.join(SIMPLE)}, "
        "ndarray[:DTYPE[:D0,D1,...]]"
    )


@lru_cache(maxsize=256)
def coder(encoding: str, allow_unsafe_pickle: bool = False) -> Coder:
    """The coder of ``encoding`` (ValueError if streaming has no such encoding)."""
    return _build(encoding, allow_unsafe_pickle)


def is_integer_ndarray(encoding: str) -> bool:
    if encoding != "ndarray" and not encoding.startswith("ndarray:"):
        return False
    try:
        dtype, _ = parse_ndarray(encoding)
    except ValueError:
        return False
    return dtype is not None and np.dtype(dtype).kind in "iu"


def infer_encoding(value: Any) -> str:
    """The encoding a writer picks for a column it was not told about (never ``pkl``)."""
    if isinstance(value, (bool, np.bool_)):
        return "json"
    if isinstance(value, np.generic) and value.dtype.name in SCALARS:
        return value.dtype.name
    if isinstance(value, int):
        return "int" if -(2**63) <= value < 2**63 else "str_int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, Decimal):
        return "str_decimal"
    if isinstance(value, np.ndarray) and value.dtype.name in DTYPE_CODES:
        return f"ndarray:{value.dtype.name}"
    try:
        from PIL import Image

        if isinstance(value, Image.Image):
            return "jpeg" if getattr(value, "format", None) == "JPEG" else "png"
    except ImportError:  # pragma: no cover - pillow is a dependency
        pass
    return "json"
