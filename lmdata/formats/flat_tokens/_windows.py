"""Where flat-tokens windows lie in memory, and their copies: the row lookup behind
``packed_rows``, ``encoded_window_parts`` and ``sequence_ranges`` (in C by
``lmdata/_native/kernel.c`` where built, in Python per window otherwise)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lmdata._native import load
from lmdata.formats.flat_tokens._zarr import ZArray

_C = load("kernel")  # row lookup and gather in C (lmdata/_native/kernel.c); None: Python per row
_copy_rows = _C.copy_rows if _C is not None else None
_unit_windows = _C.unit_windows if _C is not None else None


def in_c() -> bool:
    """Whether the lookup runs in C (it then also checks windows against the array)."""
    return _unit_windows is not None


def aligned_rows(
    arr: ZArray, rows: Sequence[int] | np.ndarray, n: int, length: int, out: np.ndarray | None
) -> np.ndarray | None:
    """Rows ``rows`` (each in ``0 .. n-1``) of ``length`` items of ``arr`` by
    :func:`copy_windows`, or None when they need the general path (negative or out-of-range
    rows, which it normalises or reports)."""
    if not isinstance(rows, np.ndarray) or rows.dtype.kind not in "iu" or rows.ndim != 1:
        return None
    if _unit_windows is not None and _copy_rows is not None and arr.dtype.itemsize == 4:
        # row numbers as they are: the C lookup checks each below n, then multiplies (two
        # numpy reductions and a product here cost a fifth of the whole gather)
        return copy_windows(arr, rows, length, out, n * length, scale=length)
    if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= n):
        return None  # (rows * length would wrap for huge ones: checked before it)
    return copy_windows(arr, rows.astype(np.int64) * length, length, out, n * length)


def _looked_up(arr: ZArray, lookup: Any, *args: Any) -> Any:
    """``lookup(arr._views, *args)``, a C lookup of ``_native.kernel``, and once more with the
    units it found missing made (still their list where another thread dropped the views).

    Views made here stay in ``arr._views`` for the rest of the call even when the byte cache
    evicts their units meanwhile (they are dropped at the next call): a call needing more units
    than the cache holds decodes each at most once, as zarr's ``oindex`` does. (Dropping them
    at once made the second lookup miss the units the first one's decodes had evicted, and
    decode them again, evicting others: a batch over more units than the cache thrashed.)"""
    arr._check_views()
    views = arr._views
    got = lookup(views, *args)
    if got.__class__ is not list:
        return got
    ranges = _ranges(arr, got, args) if arr._partial is not None else None
    if ranges:
        views = dict(views)  # partial units: for this call only, never in the shared dict
    arr.units(got, views, ranges)
    return lookup(views, *args)


def _ranges(arr: ZArray, missing: list[int], args: tuple) -> dict[int, list[tuple[int, int]]]:
    """The item ranges a lookup ``(unit, starts, width, total, scale, ...)`` reads in each
    missing unit (none where the lookup's unit is not the array's)."""
    unit, starts, width, _total, scale = args[:5]
    if unit != arr.unit or width <= 0:
        return {}
    want = set(missing)
    out: dict[int, list[tuple[int, int]]] = {}
    for s in (np.asarray(starts, dtype=np.int64) * scale).tolist():
        u, lo = divmod(s, unit)
        if u in want:
            if lo + width > unit:
                return {}  # straddles: the lookup declines anyway
            out.setdefault(u, []).append((lo, lo + width))
    return out


def pairs(arr: ZArray, idx: np.ndarray) -> np.ndarray | None:
    """Items ``i, i + 1`` of an array of 8-byte items for each ``i`` in ``idx`` (each below
    ``len(arr) - 1``), shape (n, 2), by the C lookup and copy: each pair is four 4-byte
    values at ``2 * i``. None where that is not built or declines (a pair straddles two
    units, a unit is short, units are read by range): ``gather``, which loops in Python."""
    unit = arr.unit
    if (
        _unit_windows is None
        or _copy_rows is None
        or arr.dtype.itemsize != 8
        or not 0 < unit < 2**60
        or len(arr) >= 2**60  # (doubled below: kept inside the C lookup's integers)
        or (arr.raw and not arr._mappable)
        or not len(idx)
    ):
        return None
    st = np.ascontiguousarray(idx, dtype=np.int64)
    got = _looked_up(arr, _unit_windows, 2 * unit, st, 4, 2 * len(arr), 2)
    if not isinstance(got, tuple):
        return None
    out = np.empty((len(st), 4), dtype=np.uint32)
    _copy_rows(got, out, len(st), 4)
    return out.view(arr.dtype)


def windows_into(
    arr: ZArray, layout: Any, starts: np.ndarray, width: int, total: int, scale: int, args: tuple
) -> bool:
    """``layout(views, unit, starts, width, total, scale, *args)``: a C layout of
    ``lmdata._native.kernel`` (``packed_at``, ``eos_at``) that looks the windows up as
    :func:`window_parts` does and writes its outputs ``args`` from where they lie, in one call
    (no lists per row). True when it did; False (outputs untouched) where
    :func:`window_parts` would give None or the C lookup is not built."""
    unit = arr.unit
    if _unit_windows is None or unit <= 0 or arr.dtype.itemsize != 4:
        return False
    if arr.raw and not arr._mappable:
        return False
    # (a list still: the views were dropped in between, the byte cache evicted)
    return _looked_up(arr, layout, unit, starts, width, total, scale, *args) is True


def window_parts(
    arr: ZArray, starts: list[int] | np.ndarray, length: int, total: int, scale: int = 1
) -> tuple[list, list] | None:
    """(a byte buffer per window, the window's byte offset in it) for items ``s : s + length``
    of ``arr``, each ``s`` in ``starts`` times ``scale``, into the mapped or cached units;
    None when one straddles two units, a unit is short, or units are read by range. Windows
    must lie in ``0 .. total`` (``len(arr)`` at most): outside, the C lookup returns None too
    (callers without it check first; ``scale`` other than 1 needs the C lookup).
    Looked up in C where built, else with Python int arithmetic per window (numpy operations
    on a batch's few numbers cost more)."""
    unit = arr.unit
    if length <= 0 or unit <= 0 or (arr.raw and not arr._mappable) or arr.dtype.itemsize != 4:
        return None  # (the C row readers take 4-byte items only)
    if _unit_windows is not None:
        try:
            st = np.ascontiguousarray(starts, dtype=np.int64)
        except OverflowError:  # a start past int64 (a list of Python ints): outside, as
            return None  # the C lookup declines those (the callers say which window)
        got = _looked_up(arr, _unit_windows, unit, st, length, total, scale)
        if got.__class__ is not list:
            return got or None
        # the views were dropped in between (the byte cache evicted): Python below, from
        # starts the lookup found inside 0 .. total (a missing unit is reported after all
        # windows are checked)
        starts = st * scale if scale != 1 else starts
    return _py_window_parts(arr, starts, length)


def _py_window_parts(
    arr: ZArray, starts: list[int] | np.ndarray, length: int
) -> tuple[list[Any], list[int]] | None:
    """:func:`window_parts` with Python int arithmetic, for items of any size."""
    if isinstance(starts, np.ndarray):
        starts = starts.tolist()
    unit = arr.unit
    nb = length * arr.dtype.itemsize
    arr._check_views()
    views = arr._views
    bases, offsets = [], []
    for st in starts:
        u, o = divmod(st, unit)
        if o + length > unit:
            return None  # straddles two units
        v = views.get(u) or arr._bytes_view(u)
        o *= arr.dtype.itemsize
        if o + nb > len(v):
            return None  # a short (corrupt) unit: the general path reports it
        bases.append(v)
        offsets.append(o)
    return bases, offsets


def copy_windows(
    arr: ZArray,
    starts: list[int] | np.ndarray,
    length: int,
    out: np.ndarray | None,
    total: int | None = None,
    scale: int = 1,
) -> np.ndarray | None:
    """Items ``s : s + length`` of ``arr`` for each ``s`` in ``starts`` (all inside the array
    or ``0 .. total``, as :func:`window_parts`; ``starts`` times ``scale``, which needs the
    C lookup) when each lies inside one unit, else None.

    The random-batch hot path: a window is a byte range of one unit's buffer, copied between
    memoryviews with Python int arithmetic (a few hundred ns each, where numpy operations on
    the small row arrays cost microseconds each under load).
    """
    unit = arr.unit
    if length <= 0 or unit <= 0 or (arr.raw and not arr._mappable):
        return None
    shape = (len(starts), length)
    if out is None:
        out = np.empty(shape, dtype=arr.dtype)
    elif out.shape != shape or out.dtype != arr.dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {arr.dtype} array of shape {shape}")
    if not len(starts):
        return out
    if _copy_rows is not None and arr.dtype.itemsize == 4:
        parts = window_parts(arr, starts, length, len(arr) if total is None else total, scale)
        if parts is None:
            return None
        _copy_rows(parts, out, len(starts), length)  # one C loop, the GIL released
        return out
    parts = _py_window_parts(arr, starts, length)
    if parts is None:
        return None  # a window straddles two units or a unit is short: the general path
    rb = length * arr.dtype.itemsize
    ob = memoryview(out.reshape(-1).view(np.uint8))
    for k, (v, o) in enumerate(zip(*parts, strict=True)):
        ob[k * rb : (k + 1) * rb] = v[o : o + rb]
    return out
