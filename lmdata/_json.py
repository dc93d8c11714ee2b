"""Bounded JSON parsing: one place that every metadata read and JSON record goes through.

``json.loads`` recurses once per nesting level, so ``'[' * 100000`` ends in a RecursionError,
and a metadata file can be any size. Here the size is capped before reading; orjson (which
stops at 1024 levels by itself) parses what it can, and the standard library the rest
(``NaN``, integers beyond 64 bits, lone surrogates) only after a windowed scan has checked
the nesting depth, so what is accepted is what ``json.loads`` accepts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from lmdata.errors import CorruptDataError

MAX_METADATA_BYTES = 64 << 20  # no metadata file of any format comes near this
MAX_METADATA_DEPTH = 64  # nesting levels allowed in metadata (real files use < 10)
MAX_DEPTH = 1024  # nesting levels allowed in JSON records (orjson's own limit)

# orjson turns integers beyond 64 bits into floats; text with long digit runs goes through the
# standard library instead, so big integers survive exactly.
LONG_RUN = 19  # digits from which an integer may be beyond 64 bits
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % LONG_RUN)
DIGITS = b"0123456789"
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1
_WINDOW = 1 << 20  # bytes scanned at a time by nesting_depth


def nesting_depth(data: bytes | bytearray | memoryview, window: int = _WINDOW) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets in strings skipped),
    in vectorised passes over windows of ``window`` bytes: no recursion, linear time, memory
    bounded by the window (a few dozen bytes per byte of it), not by the text."""
    raw = bytes(data)
    if b"[" not in raw and b"{" not in raw:
        return 0
    depth = best = 0
    inside = False  # in a string at the window's start
    backslashes = 0  # the run of backslashes that ends the previous window
    for lo in range(0, len(raw), window):
        chunk = raw[lo : lo + window]
        carry = backslashes
        stripped = len(chunk.rstrip(b"\\"))
        backslashes = len(chunk) - stripped + (carry if stripped == 0 else 0)
        a = np.frombuffer(chunk, np.uint8)
        steps = _OPEN[a]
        if b'"' in chunk:
            # a quote is escaped when an odd run of backslashes precedes it
            pos = np.arange(len(a), dtype=np.int64)
            last_plain = np.maximum.accumulate(np.where(a != 0x5C, pos, -1 - carry))
            run_before = np.empty(len(a), np.int64)
            run_before[0] = carry
            run_before[1:] = pos[:-1] - last_plain[:-1]
            quote = (a == 0x22) & (run_before % 2 == 0)
            in_string = (np.cumsum(quote, dtype=np.int64) & 1).astype(bool) ^ inside
            steps = np.where(in_string, 0, steps).astype(np.int8)
            inside = bool(in_string[-1])
        elif inside:
            continue  # the whole window is inside one string
        level = np.cumsum(steps, dtype=np.int64)
        best = max(best, depth + int(level.max(initial=0)))
        depth += int(level[-1])
    return best


def _depth(obj: Any) -> int:
    """The nesting depth of a parsed value (lists and dicts), without recursion."""
    if type(obj) is not list and type(obj) is not dict:
        return 0
    best = 0
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        best = max(best, d)
        for v in o.values() if type(o) is dict else o:
            if type(v) is list or type(v) is dict:
                stack.append((v, d + 1))
    return best


_WALK_BUDGET = 64  # containers' entries looked at before the byte scan is cheaper


def exact(obj: Any, data: bytes) -> bool:
    """Whether orjson's value ``obj`` of ``data`` is what ``json.loads`` gives: it differs only
    where an integer beyond 64 bits became a float, which needs a float of magnitude 1e18 or
    more in ``obj`` and a run of 19 digits in ``data``. The value is looked at first (a
    document of a few fields costs well under a microsecond, where scanning its bytes costs
    about one per kilobyte); past a few dozen entries the bytes are scanned instead."""
    stack, budget = [obj], _WALK_BUDGET
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            budget -= len(v)
            stack.extend(v.values())
        elif t is list:
            budget -= len(v)
            stack.extend(v)
        elif t is float and not -1e18 < v < 1e18:
            break  # maybe a big integer: the bytes decide
        if budget < 0:
            break
    else:
        return True
    digits = len(data) - len(data.translate(None, DIGITS))
    return digits < LONG_RUN or not _LONG_DIGITS.search(data)


def parse(data: bytes | bytearray | memoryview | str, max_depth: int = MAX_DEPTH) -> Any:
    """The value of JSON text, accepting what ``json.loads`` accepts; ValueError if it is not
    JSON or nests deeper than ``max_depth`` (never RecursionError).

    orjson parses first (it stops at 1024 levels by itself; a stricter ``max_depth`` is
    checked on the parsed value); only text orjson refuses or would change (integers beyond
    64 bits) has its depth scanned before the standard library parses it.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    elif not isinstance(data, bytes):
        data = bytes(data)
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        pass  # not JSON, too deep for orjson, or what only json.loads takes (NaN, ...)
    else:
        if exact(obj, data):
            if max_depth < MAX_DEPTH:
                depth = _depth(obj)
                if depth > max_depth:
                    raise ValueError(
                        f"nested {depth} levels deep, more than the {max_depth} allowed"
                    )
            return obj
    depth = nesting_depth(data)
    if depth > max_depth:
        raise ValueError(f"nested {depth} levels deep, more than the {max_depth} allowed")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"nested too deeply (more than {max_depth} levels)") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(str(e) or type(e).__name__) from None


def loads(
    data: bytes | bytearray | memoryview | str,
    *,
    path: str | os.PathLike[str] | None = None,
    position: str | None = None,
    what: str = "JSON",
    max_depth: int = MAX_METADATA_DEPTH,
) -> Any:
    """:func:`parse`, with any failure a CorruptDataError naming ``path`` and ``position``."""
    try:
        return parse(data, max_depth)
    except ValueError as e:
        raise CorruptDataError(
            f"{what} is not valid JSON: {e}", path=path, position=position
        ) from None


def read(
    path: str | os.PathLike[str],
    *,
    what: str = "metadata",
    max_bytes: int = MAX_METADATA_BYTES,
    max_depth: int = MAX_METADATA_DEPTH,
    want: type | None = dict,
) -> Any:
    """The JSON value in the file ``path`` (a dict unless ``want`` says otherwise).

    A file larger than ``max_bytes``, deeper than ``max_depth``, not JSON or of the wrong type
    is a CorruptDataError naming it; a missing file is FileNotFoundError, as from ``open``.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            # read(n) allocates n bytes up front: ask for what the file holds, capped
            size = os.fstat(f.fileno()).st_size
            data = f.read(min(size, max_bytes) + 1) if size else f.read(1 << 20)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise
    except OSError as e:
        raise CorruptDataError(f"cannot read {what}: {e}", path=p) from None
    return from_bytes(data, path=p, what=what, max_bytes=max_bytes, max_depth=max_depth, want=want)


def from_bytes(
    data: bytes,
    *,
    path: str | os.PathLike[str] | None,
    what: str = "metadata",
    max_bytes: int = MAX_METADATA_BYTES,
    max_depth: int = MAX_METADATA_DEPTH,
    want: type | None = dict,
) -> Any:
    """What :func:`read` does after reading: for metadata read some other way (a store's
    ranged read of at most ``max_bytes + 1`` bytes), with the same checks and errors."""
    if len(data) > max_bytes:
        raise CorruptDataError(
            f"{what} is larger than {max_bytes} bytes, far more than any real one", path=path
        )
    obj = loads(data, path=path, what=what, max_depth=max_depth)
    if want is not None and not isinstance(obj, want):
        kind = "a JSON object" if want is dict else f"a JSON {want.__name__}"
        raise CorruptDataError(f"{what} must hold {kind}, not {type(obj).__name__}", path=path)
    return obj


# ---- writing ---------------------------------------------------------------------------------


def _default(obj: Any) -> Any:
    """What orjson cannot serialise itself, as JSON values: arrays as lists, bytes as
    ``{"$base64": ...}``, sets and tuples as lists, complex numbers as ``[real, imag]``."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        import base64

        return {"$base64": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, complex):
        return [obj.real, obj.imag]
    return str(obj)


_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj: Any, *, indent: bool = False) -> bytes:
    """JSON text of any value lmdata reads or reports (numpy as lists, bytes as base64);
    integers beyond 64 bits and lone surrogates, which orjson refuses, go through the
    standard library."""
    opts = _DUMP_OPTIONS | (orjson.OPT_INDENT_2 if indent else 0)
    try:
        return orjson.dumps(obj, default=_default, option=opts)
    except TypeError:
        pass
    text = json.dumps(obj, default=_default, ensure_ascii=False, indent=2 if indent else None)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, so the output stays valid UTF-8
        return json.dumps(obj, default=_default, indent=2 if indent else None).encode()
