"""Records as bytes a worker stages and the driver reads back, without pickle.

A block of records (dicts of JSON values, ``bytes``, numpy arrays and scalars, tuples, NaN)
becomes one JSON document plus the raw bytes of its binary values; :func:`unpack` gives back
equal records of the same types. A value of any other type raises TypeError in :func:`pack`,
and the caller hands that block over as it is. Reading staged records executes nothing.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson

from lmdata.errors import CorruptDataError

MAGIC = b"LMRB1\n"
_MARK = "\x00lmdata"  # the one key of a tagged value (a record's own dict with it is wrapped)
_LEN = struct.Struct("<Q")


def pack(records: list[Any]) -> bytes:
    """``records`` as bytes; TypeError for a value that cannot be staged exactly."""
    blobs: list[bytes] = []
    tagged = [False]

    def tag(*what: Any) -> dict[str, Any]:
        tagged[0] = True
        return {_MARK: list(what)}

    def blob(data: bytes) -> int:
        blobs.append(data)
        return len(blobs) - 1

    def enc(x: Any) -> Any:
        t = type(x)
        if t is str or t is int or t is bool or x is None:
            if t is int and not -(1 << 63) <= x < 1 << 64:
                raise TypeError("an integer beyond 64 bits")
            return x
        if t is float:
            return x if math.isfinite(x) else tag("f", repr(x))
        if t is dict:
            if not all(type(k) is str for k in x):
                raise TypeError("a dict with keys that are not strings")
            out = {k: enc(v) for k, v in x.items()}
            return tag("d", out) if _MARK in x else out
        if t is list:
            return [enc(v) for v in x]
        if t is tuple:
            return tag("t", [enc(v) for v in x])
        if t is bytes:
            return tag("b", blob(x))
        if t is np.ndarray and not x.dtype.hasobject:
            return tag("a", blob(np.ascontiguousarray(x).tobytes()), x.dtype.str, list(x.shape))
        if isinstance(x, np.generic) and not x.dtype.hasobject:
            return tag("s", blob(x.tobytes()), x.dtype.str)
        raise TypeError(f"a {t.__name__} value")

    body = [enc(r) for r in records]
    head = orjson.dumps({"tagged": tagged[0], "blobs": [len(b) for b in blobs], "records": body})
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *blobs])


def unpack(data: bytes, where: str = "") -> list[Any]:
    """The records :func:`pack` made ``data`` of; CorruptDataError for anything else."""
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a staged record block")
        (n,) = _LEN.unpack_from(data, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        head = orjson.loads(data[start : start + n])
        offsets = [start + n]
        for size in head["blobs"]:
            offsets.append(offsets[-1] + int(size))
        if offsets[-1] != len(data):
            raise ValueError("its binary values do not fill it")
        if not head["tagged"]:
            return list(head["records"])
        view = memoryview(data)

        def blob(i: int) -> memoryview:
            return view[offsets[i] : offsets[i + 1]]

        def dec(x: Any) -> Any:
            if type(x) is list:
                return [dec(v) for v in x]
            if type(x) is not dict:
                return x
            if len(x) == 1 and _MARK in x:
                kind, *args = x[_MARK]
                if kind == "d":
                    return {k: dec(v) for k, v in args[0].items()}
                if kind == "t":
                    return tuple(dec(v) for v in args[0])
                if kind == "f":
                    return float(args[0])
                if kind == "b":
                    return bytes(blob(args[0]))
                if kind == "a":
                    arr = np.frombuffer(blob(args[0]), dtype=np.dtype(args[1]))
                    return arr.reshape(args[2]).copy()
                if kind == "s":
                    return np.frombuffer(blob(args[0]), dtype=np.dtype(args[1]))[0]
                raise ValueError(f"an unknown tag {kind!r}")
            return {k: dec(v) for k, v in x.items()}

        return [dec(r) for r in head["records"]]
    except (ValueError, KeyError, IndexError, TypeError, struct.error, orjson.JSONDecodeError) as e:
        raise CorruptDataError(
            f"a staged record block is damaged ({e}); run the job again", path=where
        ) from None
