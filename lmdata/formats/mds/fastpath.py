"""Per-shard read functions, generated once per column layout: the hot path of ``r[i]``,
``take`` and iteration.

A read takes the sample's two offsets from the shard's table, checks they lie in the file,
reads the variable columns' sizes (one struct call, which also reads leading ``int`` columns),
checks that the sizes add up to the sample, then slices and decodes each column inline, with
no intermediate copy of the sample and no call per column for ``str``, ``int``, ``bytes``,
``json`` and 1-D ``ndarray:DTYPE`` columns. It checks no less than the plain decoder: whenever
anything is off (offsets outside the file, sizes that do not add up, a value a column decoder
refuses) it hands the sample to ``slow(j)``, the reader's precise path, which decodes it again
and returns it or raises the error naming file and position.

Where the optional C extension ``lmdata/_native/mdsread.c`` is built, ``compile_layout``'s functions
are its ``Reader`` (the same steps in one C call per sample) in front of the generated ``one``,
which gets every sample the C reader declines; without a compiler the generated functions serve.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import orjson

from lmdata import _json
from lmdata._native import load
from lmdata.errors import CorruptDataError, LmdataError
from lmdata.formats.mds import encodings as E
from lmdata.formats.mds.mds import SampleDecoder

# lmdata/_native/mdsread.c; None: the generated Python functions serve
_mdsread = load("mdsread")

# one sample: its dict; many: a list of dicts (take); run: samples j0..j1-1 in order
One = Callable[[int], Any]
Many = Callable[[Iterable[int]], list[Any]]
Run = Callable[[int, int], list[Any]]
Fns = tuple[One, Many, Run]
Factory = Callable[[Any, Any, int, int, Callable[[int], Any]], Fns]

_PAIR = struct.Struct("<II")
_INT, _STR, _BYTES, _JSON, _ND, _OTHER = range(6)  # column kinds of _native/mdsread.c


def _runs(table: Any, j0: int, j1: int) -> Iterable[tuple[int, int]]:
    """(begin, end) of samples j0..j1-1 from one unpack of their offsets."""
    return itertools.pairwise(struct.unpack_from(f"<{j1 - j0 + 1}I", table, 4 + 4 * j0))


def _column_lines(
    c: int,
    name: str,
    encoding: str,
    dec: Callable[[bytes], Any],
    size: int | None,
    piece: str,
    env: dict,
) -> list[str]:
    """Statements assigning column ``c``'s value to ``c{c}`` from the slice ``piece``."""
    if dec is E._dec_str:
        return [f"c{c} = {piece}.decode('utf-8')"]
    if dec is E._dec_int and size == 8:  # any other size: the decoder refuses it
        return [f"c{c} = _from_bytes({piece}, 'little', signed=True)"]
    if dec is bytes:
        return [f"c{c} = {piece}"]
    if dec is E._dec_json:
        # _json.parse's fast path, inline: orjson unless a long digit run could be an
        # integer beyond 64 bits (orjson refusing the text sends it to the slow path)
        return [
            f"x = {piece}",
            f"c{c} = _loads(x) if len(x) < {_json.LONG_RUN} or "
            f"len(x) - len(x.translate(None, _DIGITS)) < {_json.LONG_RUN} else _parse(x)",
        ]
    env[f"d{c}"] = dec
    dtype, shape = E.parse_ndarray(encoding) if encoding.startswith("ndarray") else (None, (0,))
    if dtype is not None and shape is None:
        # the common token array: a known dtype and a 1-D shape stored per sample
        dt = np.dtype(dtype).newbyteorder("<")
        env[f"t{c}"] = dt
        return [
            f"x = {piece}",
            "h = x[0]",
            "w = 1 << (h & 3)",
            "m = _from_bytes(x[1 : 1 + w], 'little')",
            f"c{c} = _frombuffer(x, t{c}, m, 1 + w) if h >> 2 == 1 and "
            f"m * {dt.itemsize} == len(x) - 1 - w else d{c}(x)",
        ]
    return [f"c{c} = d{c}({piece})"]


def compile_layout(plan: SampleDecoder, encodings: tuple[str, ...]) -> Factory:
    """``make(table, data, lo, size, slow) -> (one, many, run)`` for shards of this layout.

    ``data`` is sliced per column (a memory map or bytes); ``lo``/``size`` bound the offsets.
    """
    env: dict[str, Any] = {
        "_pair": _PAIR.unpack_from,
        "_runs": _runs,
        "_from_bytes": int.from_bytes,
        "_frombuffer": np.frombuffer,
        "_loads": orjson.loads,
        "_parse": _json.parse,
        "_DIGITS": _json.DIGITS,
    }
    cols = plan.plan
    # the size table, plus the int columns that come before any other column
    lead = 0
    while lead < len(cols) and cols[lead][2] == 8 and cols[lead][1] is E._dec_int:
        lead += 1
    head = [f"v{k}" for k in range(plan.nvar)] + [f"c{c}" for c in range(lead)]
    body: list[str] = []
    if head:
        env["_head"] = struct.Struct(f"<{plan.nvar}I{lead}q").unpack_from
        body.append(f"{', '.join(head)}, = _head(data, b)")
    fixed = sum(s for _, _, s, _ in cols if s is not None)
    total = " + ".join([str(plan.head + fixed), *[f"v{k}" for k in range(plan.nvar)]])
    body += [f"if {total} != e - b:", "    raise ValueError"]
    pos, k, items = f"b + {plan.head}", 0, []
    spec = _c_spec(plan, encodings)
    for c, (name, dec, size, keep) in enumerate(cols):
        if size is None:
            end = f"v{k}"
            k += 1
        else:
            end = str(size)
        body.append(f"p{c} = {pos} + {end}")
        if keep:
            if c >= lead:
                body += _column_lines(c, name, encodings[c], dec, size, f"data[{pos}:p{c}]", env)
            items.append(f"{name!r}: c{c}")
        pos = f"p{c}"
    value = f"{{{', '.join(items)}}}"

    def block(indent: int, done: str) -> list[str]:
        pad = " " * indent
        return (
            [f"{pad}if lo <= b <= e <= size:", f"{pad}    try:"]
            + [f"{pad}        {line}" for line in body]
            + [f"{pad}        {done.format(value)}", f"{pad}    except Exception:"]
            + [f"{pad}        pass"]
        )

    src = [
        "def make(table, data, lo, size, slow):",
        "    def one(j):",
        "        b, e = _pair(table, 4 + 4 * j)",
        *block(8, "return {}"),
        "        return slow(j)",
        "    def many(js):",
        "        out = []",
        "        append = out.append",
        "        for j in js:",
        "            b, e = _pair(table, 4 + 4 * j)",
        *block(12, "append({}); continue"),
        "            append(slow(j))",
        "        return out",
        "    def run(j0, j1):",
        "        out = []",
        "        append = out.append",
        "        j = j0 - 1",
        "        for b, e in _runs(table, j0, j1):",
        "            j += 1",
        *block(12, "append({}); continue"),
        "            append(slow(j))",
        "        return out",
        "    return one, many, run",
    ]
    # only repr()s of column names, integers and the names above go into the source
    exec("\n".join(src), env)
    make_py: Factory = env["make"]
    if _mdsread is None:
        return make_py

    def make(table: Any, data: Any, lo: int, size: int, slow: Callable[[int], Any]) -> Fns:
        # the C reader, which hands what it declines to the generated ``one``
        one = make_py(table, data, lo, size, slow)[0]
        r = _mdsread.Reader(
            table, data, lo, size, spec, plan.nvar, _json.LONG_RUN, orjson.loads, np.frombuffer, one
        )
        return r, r.many, r.run

    return make


def ranged(plan: SampleDecoder, encodings: tuple[str, ...], dec: Callable[[bytes], Any]) -> Factory:
    """``make`` for MDS shards read by ranges (``data`` has ``fetch(begin, length)``, one read
    of a sample's bytes from the store or its range cache): the C reader decodes them where it
    is built, else :func:`generic` with ``dec``, which is also what the C reader declines to."""
    make_py = generic(dec)
    if _mdsread is None:
        return make_py
    spec = _c_spec(plan, encodings)

    def make(table: Any, data: Any, lo: int, size: int, slow: Callable[[int], Any]) -> Fns:
        one = make_py(table, data, lo, size, slow)[0]
        r = _mdsread.Reader(
            table,
            data.fetch,
            lo,
            size,
            spec,
            plan.nvar,
            _json.LONG_RUN,
            orjson.loads,
            np.frombuffer,
            one,
        )
        return r, r.many, r.run

    return make


def _c_spec(plan: SampleDecoder, encodings: tuple[str, ...]) -> tuple:
    """The C reader's column spec of this layout."""
    return tuple(
        _c_column(n, d, s, kp, e) for (n, d, s, kp), e in zip(plan.plan, encodings, strict=True)
    )


def _c_column(
    name: str, dec: Callable[[bytes], Any], size: int | None, keep: bool, encoding: str
) -> tuple[str | None, int, int, Any, int]:
    """One column for the C reader: (name or None when not kept, kind, size or -1, dtype or
    decoder, item size)."""
    out = name if keep else None
    width = -1 if size is None else size
    if dec is E._dec_int and size == 8:
        return out, _INT, width, None, 0
    if dec is E._dec_str:
        return out, _STR, width, None, 0
    if dec is bytes:
        return out, _BYTES, width, None, 0
    if dec is E._dec_json:
        return out, _JSON, width, None, 0
    if encoding.startswith("ndarray"):
        dtype, shape = E.parse_ndarray(encoding)
        if dtype is not None and shape is None:
            dt = np.dtype(dtype).newbyteorder("<")
            return out, _ND, width, dt, dt.itemsize
    return out, _OTHER, width, dec, 0


def generic(dec: Callable[[bytes], Any]) -> Factory:
    """The same three functions for shards of any other kind (CSV/TSV/JSON lines, or MDS
    sample bytes read by range): one slice per sample, then ``dec``."""

    def make(table: Any, data: Any, lo: int, size: int, slow: Callable[[int], Any]) -> Fns:
        def one(j: int) -> Any:
            b, e = _PAIR.unpack_from(table, 4 + 4 * j)
            if lo <= b <= e <= size:
                try:
                    return dec(data[b:e])
                except Exception:
                    pass
            return slow(j)

        def many(js: Iterable[int]) -> list[Any]:
            return [one(j) for j in js]

        def run(j0: int, j1: int) -> list[Any]:
            out = []
            j = j0
            for b, e in _runs(table, j0, j1):
                value = None
                if lo <= b <= e <= size:
                    try:
                        value = dec(data[b:e])
                    except Exception:
                        value = None
                out.append(slow(j) if value is None else value)
                j += 1
            return out

        return one, many, run

    return make


# ---- the precise path ----------------------------------------------------------------------


def raw(loaded: Any, k: int, j: int) -> bytes:
    """The stored bytes of sample ``j`` of shard ``k``, its offsets checked against the file."""
    begin, end = _PAIR.unpack_from(loaded.table, 4 + 4 * j)
    if not loaded.lo <= begin <= end <= loaded.size:
        raise CorruptDataError(
            f"offsets [{begin}, {end}) of sample {j} are not a range inside the "
            f"{len(loaded.data)}-byte file; run `lmdata validate`",
            path=loaded.table_path,
            position=f"shard {k} sample {j}",
        )
    return loaded.data[begin:end]  # type: ignore[no-any-return]


def decode(dec: Callable[[bytes], Any], data: bytes, loaded: Any, k: int, j: int) -> Any:
    """``dec(data)``, any failure an lmdata error naming the shard file and sample."""
    try:
        return dec(data)
    except LmdataError as e:
        if e.path is not None:
            raise
        raise type(e)(str(e), path=loaded.data_path, position=f"shard {k} sample {j}") from None
    except (ValueError, UnicodeDecodeError, struct.error, StopIteration) as e:
        raise CorruptDataError(
            f"cannot decode sample: {e}",
            path=loaded.data_path,
            position=f"shard {k} sample {j}",
        ) from None


def slow(dec: Callable[[bytes], Any], loaded: Any, k: int, j: int) -> Any:
    """The precise path of one sample (what the fast path falls back to): it returns the
    value or raises the error naming file and position."""
    return decode(dec, raw(loaded, k, j), loaded, k, j)
