"""From stored tokens to what a model trains on: the three row layouts.

Every function returns a dict of arrays of shape ``(rows, seq_len)``:

- packed rows follow the flat-tokens convention (seqax): ``targets`` are the row's tokens;
  ``inputs`` are the targets shifted right by one with ``bos`` (0 by default) at every sequence
  start and at row position 0, so every position is a target and no loss mask is needed.
  ``segment_ids`` number the documents within the row from 1; ``positions`` count from 0 at
  each document start and at the row start (document-aware attention, as Grain and MaxText).
- eos rows are windows of ``seq_len + 1`` tokens: ``inputs = w[:-1]``, ``targets = w[1:]``.
- unpacked rows hold one document (or one piece of it), right-padded, with ``loss_mask``.

Padding anywhere has ``targets``/``inputs`` = ``pad_id``, ``segment_ids`` = ``positions`` = 0
and ``loss_mask`` False.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from lmdata._native import load
from lmdata.loader import pool

_C = load("kernel")  # lmdata/_native/kernel.c; None: numpy does the same

PAD_VALUES = {"segment_ids": 0, "positions": 0, "loss_mask": False}
PACKED_KEYS = ("inputs", "targets", "segment_ids", "positions")
UNPACKED_KEYS = (*PACKED_KEYS, "loss_mask")
IO_KEYS = ("inputs", "targets")  # carved from one block; segment ids and positions are computed

_GAP = 1024  # bytes between the arrays of one block (see packed_buffers)
_I32 = np.dtype(np.int32)
_TYPES = {"loss_mask": np.dtype(bool)}  # the rest of a block's arrays are int32
_ONE = np.uint32(1)
_LAYOUTS: dict[tuple[int, int, np.dtype, tuple[str, ...]], tuple] = {}
Parts = tuple[list, list]  # rows where they lie: (a buffer per row, byte offsets) (C only)


def packed_buffers(
    rows: int, length: int, dtype: np.dtype, keys: tuple[str, ...] = PACKED_KEYS
) -> dict[str, np.ndarray]:
    """Uninitialised outputs ``keys`` (inputs and targets of ``dtype``, loss_mask bool, the
    rest int32), shape (rows, length), carved from one allocation.

    One block per batch instead of several arrays, recycled once no array of it is alive
    (:mod:`lmdata.loader.pool`): fresh memory per batch costs page faults. A gap separates
    the arrays: ``inputs`` is ``targets`` copied one item over, and two arrays whose distance
    is a multiple of the 4 KiB page make that copy ~10x slower (4K aliasing of loads and
    stores). Each array starts on a 64-byte cache line: a block from the allocator starts 16
    bytes past a page, and outputs there laid out a batch 15% slower (vector stores split
    across lines). The layout is computed once per shape, and each block's arrays once per
    layout (kept by the pool): a batch gets fresh views of them.
    """
    key = (rows, length, dtype, keys)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _layout(rows, length, np.dtype(dtype), keys)
        if len(_LAYOUTS) > 16:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    size, carve = layout
    return dict(zip(keys, map(_VIEW, pool.carved(size, key, carve)), strict=True))


_VIEW = np.ndarray.view


def _layout(rows: int, length: int, dtype: np.dtype, keys: tuple[str, ...]) -> tuple:
    """(block bytes, a function carving a block into an array per key): the arrays a fixed
    distance apart (the gap included), each on a cache line."""
    n = rows * length
    places: list[tuple[np.dtype, int]] = []
    at = 0
    for k in keys:
        t = dtype if k in ("inputs", "targets") else _TYPES.get(k, _I32)
        places.append((t, at))
        at += -(-(n * t.itemsize + _GAP) // 64) * 64
    shape = (rows, length)

    def carve(block: np.ndarray) -> tuple[np.ndarray, ...]:
        first = -block.ctypes.data % 64  # every array starts on a cache line
        return tuple(np.ndarray(shape, dtype=t, buffer=block, offset=first + o) for t, o in places)

    return at + 64, carve


def packed_from_encoded(
    enc: np.ndarray | Parts, dtype: np.dtype, bos: int = 0, shape: tuple[int, int] | None = None
) -> dict[str, np.ndarray]:
    """Packed rows from stored flat-tokens values (``id*2 + start bit``), shape (rows, L)
    (``shape`` is needed for :data:`Parts`)."""
    if isinstance(enc, tuple):
        assert shape is not None and _C is not None
    else:
        enc = np.ascontiguousarray(enc, dtype=np.uint32)
        shape = enc.shape
    out = packed_buffers(*shape, dtype, PACKED_KEYS if _C else IO_KEYS)
    fill_packed(enc, out, bos)
    return out


def laid_out_at(
    into: Callable[..., bool], eos: bool, rows: np.ndarray, length: int, dtype: np.dtype, bos: int
) -> dict[str, np.ndarray] | None:
    """Packed rows (``eos``: windows of ``length + 1``) numbered ``rows`` (int64) laid out by
    one C call that also finds them (``into``: a reader's ``encoded_windows_into``, which hands
    where they lie to ``kernel.packed_at`` / ``eos_at``); None where it declines (or numpy
    lays out): the caller's general path."""
    if _C is None:
        return None
    wide = dtype != _I32
    if eos:
        out = packed_buffers(len(rows), length, dtype, IO_KEYS)
        done = into(_C.eos_at, rows, length + 1, length, out["inputs"], out["targets"], wide)
    else:
        out = packed_buffers(len(rows), length, dtype, PACKED_KEYS)
        done = into(
            _C.packed_at,
            rows,
            length,
            length,
            out["inputs"],
            out["targets"],
            out["segment_ids"],
            out["positions"],
            bos,
            wide,
        )
    return out if done else None


def packed_out(rows: int, length: int, dtype: np.dtype) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Outputs for packed rows and the uint32 array (rows, length) to gather their stored
    values into before :func:`fill_packed`: memory of the outputs themselves (``positions``
    for the C kernel, which reads each item before writing it; ``targets`` for numpy's int32
    in-place decode), so a batch touches one recycled block."""
    if _C is not None:
        out = packed_buffers(rows, length, dtype, PACKED_KEYS)
        return out, out["positions"].view(np.uint32)
    out = packed_buffers(rows, length, dtype, IO_KEYS)
    t = out["targets"]
    return out, t.view(np.uint32) if t.dtype == _I32 else np.empty((rows, length), np.uint32)


def in_c() -> bool:
    """Whether the layouts run in C, which also take a batch's rows where they lie (a pair
    of lists: a buffer per row and the byte offset of the row's stored values in it, as
    ``encoded_window_parts`` of flat-tokens gives) instead of one array."""
    return _C is not None


def fill_packed(enc: np.ndarray | Parts, out: dict[str, np.ndarray], bos: int = 0) -> None:
    """Fill ``out`` (from :func:`packed_out` or :func:`packed_buffers`) from stored values
    ``enc`` (rows, L): one pass in C when the kernel is built and ``out`` holds all four
    arrays, else vectorised numpy passes over the batch (no per-row or per-document Python).

    ``enc`` may be ``out["targets"]`` (int32) or ``out["positions"]`` seen as uint32, or (C
    only, :func:`in_c`) the rows where they lie.
    """
    if not out["targets"].size:
        return
    if _C is not None and "positions" in out:
        t = out["targets"]
        _C.packed(
            enc,
            out["inputs"],
            t,
            out["segment_ids"],
            out["positions"],
            *t.shape,
            bos,
            t.dtype != _I32,
        )
        return
    is_start = _scratch(enc.shape)
    # 0/1 written as uint8 into the bool scratch: a third faster than a cast to bool
    np.bitwise_and(enc, _ONE, out=is_start.view(np.uint8), casting="unsafe")
    is_start[:, 0] = True
    starts = np.flatnonzero(is_start)
    targets = out["targets"]
    np.right_shift(enc, _ONE, out=targets.view(np.uint32) if targets.dtype == _I32 else targets)
    _finish(out, starts, bos)


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """A reusable bool array of ``shape`` for this thread (the start bits of a batch): a fresh
    one per batch costs page faults, and prefetch threads each need their own."""
    a = getattr(_SCRATCH, "bits", None)
    if a is None or a.shape != shape:
        a = _SCRATCH.bits = np.empty(shape, dtype=bool)
    return a


def packed_from_starts(
    targets: np.ndarray, starts: np.ndarray, dtype: np.dtype, bos: int = 0
) -> dict[str, np.ndarray]:
    """Packed rows from decoded ids (rows, L) and the sorted flat indices of the sequence starts
    in them, row starts included (:func:`starts_in_rows`)."""
    targets = np.asarray(targets)
    out = packed_buffers(*targets.shape, dtype, IO_KEYS)
    out["targets"][...] = targets
    if targets.size:
        _finish(out, starts, bos)
    return out


def _finish(out: dict[str, np.ndarray], starts: np.ndarray, bos: int) -> None:
    """inputs, positions and segment_ids of ``out`` from its targets and the segment starts
    (sorted flat indices, every row start included): whole-batch passes, the work per
    segment is a handful of array entries.

    ``np.repeat`` writes each id array in one pass; running sums into the block (no fresh
    arrays) measured a third slower: an accumulation is a dependent chain, a fill is not.
    """
    targets = out["targets"]
    b, length = targets.shape
    n = b * length
    flat = out["inputs"].reshape(-1)
    flat[1:] = targets.reshape(-1)[:-1]  # one contiguous copy; row starts are in ``starts``
    flat[starts] = bos
    seg_len = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=seg_len[:-1])
    seg_len[-1] = n - starts[-1]
    # a segment's id is its number within its row: its index minus its row's first segment's
    row_first = np.searchsorted(starts, starts - starts % length)
    local = (np.arange(1, len(starts) + 1, dtype=np.int64) - row_first).astype(np.int32)
    out["segment_ids"] = np.repeat(local, seg_len).reshape(b, length)
    # a position is its flat index minus its segment's start (computed in place)
    ar = _arange(n)
    pos = np.repeat(starts.astype(ar.dtype), seg_len)
    np.subtract(ar, pos, out=pos)
    out["positions"] = pos.reshape(b, length).astype(np.int32, copy=False)


_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    """A cached read-only ``arange(n)`` of int32 (int64 past int32's range), one per batch
    size (small aranges are not cached: their sizes vary per batch and would evict it)."""
    a = _ARANGE.get(n)
    if a is None:
        if len(_ARANGE) > 8:
            _ARANGE.clear()
        a = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        a.flags.writeable = False
        _ARANGE[n] = a
    return a


def starts_in_rows(seq_starts: np.ndarray, row_starts: np.ndarray, length: int) -> np.ndarray:
    """Sorted flat indices, in a block of rows ``row_starts[i] : row_starts[i] + length``, of
    the row starts and of the sequence starts ``seq_starts`` inside them (sorted; repeats, as
    empty sequences give, are merged). Vectorised: no per-row Python."""
    rs = np.asarray(row_starts, dtype=np.int64)
    lo = np.searchsorted(seq_starts, rs)
    counts = np.searchsorted(seq_starts, rs + length) - lo
    row = np.repeat(np.arange(len(rs), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    j = np.arange(int(counts.sum()), dtype=np.int64) - first[row] + lo[row]
    inner = seq_starts[j] - rs[row] + row * length
    return np.union1d(inner, np.arange(len(rs), dtype=np.int64) * length)


def eos_windows(windows: np.ndarray, dtype: np.dtype) -> dict[str, np.ndarray]:
    """inputs/targets of windows of ``seq_len + 1`` decoded tokens, shape (rows, L + 1)."""
    w = np.asarray(windows)
    out = _eos_buffers(w.shape[0], w.shape[1] - 1, dtype)
    out["inputs"][...] = w[:, :-1]
    out["targets"][...] = w[:, 1:]
    return out


def eos_from_encoded(
    enc: np.ndarray | Parts, dtype: np.dtype, shape: tuple[int, int] | None = None
) -> dict[str, np.ndarray]:
    """inputs/targets of windows of stored values (``id*2 + start bit``), shape (rows, L + 1),
    decoded as they are copied into place (one pass; ``shape`` is needed for
    :data:`Parts`)."""
    if isinstance(enc, tuple):
        assert shape is not None and _C is not None
    else:
        enc = np.ascontiguousarray(enc, dtype=np.uint32)
        shape = enc.shape
    out = _eos_buffers(shape[0], shape[1] - 1, dtype)
    if _C is not None:
        t = out["targets"]
        _C.eos(enc, out["inputs"], t, *t.shape, t.dtype != _I32)
        return out
    for key, part in (("inputs", enc[:, :-1]), ("targets", enc[:, 1:])):
        a = out[key]
        np.right_shift(part, _ONE, out=a.view(np.uint32) if a.dtype == _I32 else a)
    return out


def _eos_buffers(rows: int, length: int, dtype: np.dtype) -> dict[str, np.ndarray]:
    return packed_buffers(rows, max(length, 0), dtype, IO_KEYS)


def unpacked_rows(
    pieces: Sequence[np.ndarray], seq_len: int, dtype: np.dtype, bos: int = 0, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """One piece (at most ``seq_len`` tokens) per row, right-padded."""
    ids = np.zeros((len(pieces), seq_len), dtype=np.int64)
    for i, p in enumerate(pieces):
        ids[i, : len(p)] = p
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    return unpacked_from_windows(ids, lengths, dtype, bos, pad_id)


def unpacked_from_encoded(
    enc: np.ndarray | Parts,
    offsets: np.ndarray,
    lengths: np.ndarray,
    dtype: np.dtype,
    bos: int = 0,
    pad_id: int = 0,
    seq_len: int | None = None,
) -> dict[str, np.ndarray]:
    """Unpacked rows from windows of stored values ``enc`` (rows, seq_len): row ``i``'s piece
    is ``enc[i, offsets[i] : offsets[i] + lengths[i]]`` decoded (each inside its window).
    ``enc`` is overwritten on the numpy path; ``seq_len`` is needed for :data:`Parts`."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if _C is not None:
        if isinstance(enc, tuple):
            assert seq_len is not None
        else:
            enc = np.ascontiguousarray(enc, dtype=np.uint32)
            seq_len = enc.shape[1]
        rows = len(offsets)
        out = packed_buffers(rows, seq_len, dtype, UNPACKED_KEYS)
        t = out["targets"]
        _C.unpacked(
            enc,
            offsets,
            lengths,
            out["inputs"],
            t,
            out["segment_ids"],
            out["positions"],
            out["loss_mask"],
            rows,
            seq_len,
            bos,
            pad_id,
            1,
            t.dtype != _I32,
        )
        return out
    np.right_shift(enc, _ONE, out=enc)
    for i in np.flatnonzero(offsets).tolist():
        k = int(offsets[i])
        enc[i, : enc.shape[1] - k] = enc[i, k:].copy()
    return unpacked_from_windows(enc, lengths, dtype, bos, pad_id)


def unpacked_from_windows(
    ids: np.ndarray, lengths: np.ndarray, dtype: np.dtype, bos: int = 0, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Unpacked rows from windows ``ids`` (rows, seq_len) of which the first ``lengths[i]``
    tokens of row ``i`` are its piece: whole-batch passes into one recycled block, no per-row
    Python."""
    rows, seq_len = ids.shape
    out = packed_buffers(rows, seq_len, dtype, UNPACKED_KEYS)
    ar = _arange(seq_len)
    mask = out["loss_mask"]
    np.less(ar, np.asarray(lengths, dtype=np.int64).reshape(-1, 1), out=mask)
    segment_ids = out["segment_ids"]
    np.copyto(segment_ids, mask)
    np.multiply(ar, segment_ids, out=out["positions"], casting="unsafe")
    # padding by arithmetic (x * keep + pad * (1 - keep)): whole-array integer passes, where
    # masked assignments take an order of magnitude longer
    keep = segment_ids if np.dtype(dtype) == np.int32 else segment_ids.astype(dtype)
    fill = np.multiply(np.subtract(1, keep), pad_id, dtype=dtype) if pad_id else None
    targets = out["targets"]
    np.copyto(targets, ids, casting="unsafe")
    np.multiply(targets, keep, out=targets)
    inputs = out["inputs"]
    inputs[:, 1:] = targets[:, :-1]  # inside a piece, the token before is the piece's
    inputs[:, :1] = bos
    np.multiply(inputs, keep, out=inputs)
    if fill is not None:
        targets += fill
        inputs += fill
    return out


def pad_tail(batch: dict[str, np.ndarray], row: int, valid: int, pad_id: int) -> None:
    """Turn positions ``valid:`` of ``row`` into padding (a partial last row of an epoch)."""
    for k, a in batch.items():
        a[row, valid:] = PAD_VALUES.get(k, pad_id)


def segment_rows(
    windows: np.ndarray | Parts,
    width: int,
    offsets: np.ndarray,
    lengths: np.ndarray,
    seg_rows: np.ndarray,
    rows: int,
    seq_len: int,
    dtype: np.dtype,
    bos: int = 0,
    pad_id: int = 0,
    shift: int = 1,
) -> dict[str, np.ndarray]:
    """Bestfit rows: segment ``j`` is ``windows[j, offsets[j] : offsets[j] + lengths[j]] >>
    shift`` (each window ``width`` values; stored values with ``shift`` 1, ids with 0), laid
    end to end in row ``seg_rows[j]`` (never decreasing) as documents (``bos`` before each,
    ``segment_ids`` from 1, ``positions`` from 0), each row right-padded (``pad_id``, segment
    0, ``loss_mask`` False). One pass in C, else whole-batch numpy passes."""
    out = packed_buffers(rows, seq_len, dtype, UNPACKED_KEYS)
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    lens = np.ascontiguousarray(lengths, dtype=np.int64)
    where = np.ascontiguousarray(seg_rows, dtype=np.int64)
    if _C is not None:
        t = out["targets"]
        if not isinstance(windows, tuple):
            windows = np.ascontiguousarray(windows, dtype=np.uint32)
        _C.segments(
            windows,
            width,
            off,
            lens,
            where,
            out["inputs"],
            t,
            out["segment_ids"],
            out["positions"],
            out["loss_mask"],
            rows,
            seq_len,
            bos,
            pad_id,
            shift,
            t.dtype != _I32,
        )
        return out
    for key, a in out.items():
        a.fill(PAD_VALUES.get(key, pad_id))
    n = int(lens.sum())
    if not n:
        return out
    # each segment's first place in its row: the row's earlier segments' lengths before it
    first = np.cumsum(lens) - lens
    row_first = np.searchsorted(where, where)  # index of the row's first segment
    at = first - first[row_first]
    seg_no = np.arange(len(lens), dtype=np.int64) - row_first + 1
    k = np.arange(n, dtype=np.int64) - np.repeat(first, lens)  # place inside the segment
    seg = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    dest = where[seg] * seq_len + at[seg] + k
    src = np.asarray(windows).reshape(len(lens), width)[seg, off[seg] + k].astype(np.int64)
    tokens = src >> shift
    flat = {key: a.reshape(-1) for key, a in out.items()}
    flat["targets"][dest] = tokens
    before = np.empty_like(tokens)
    before[1:] = tokens[:-1]
    before[k == 0] = bos
    flat["inputs"][dest] = before
    flat["segment_ids"][dest] = seg_no[seg]
    flat["positions"][dest] = k
    flat["loss_mask"][dest] = True
    return out


def segment_rows_at(
    into: Callable[..., bool],
    starts: np.ndarray,
    width: int,
    offsets: np.ndarray,
    lengths: np.ndarray,
    seg_rows: np.ndarray,
    rows: int,
    seq_len: int,
    dtype: np.dtype,
    bos: int = 0,
    pad_id: int = 0,
) -> dict[str, np.ndarray] | None:
    """:func:`segment_rows` of stored windows of ``width`` values at ``starts`` (int64) found
    and laid out by one C call (``into``: a reader's ``encoded_windows_into``); None where it
    declines (or no C layout was built): the caller's general path."""
    if _C is None:
        return None
    out = packed_buffers(rows, seq_len, dtype, UNPACKED_KEYS)
    t = out["targets"]
    done = into(
        _C.segments_at,
        starts,
        width,
        1,
        offsets,
        lengths,
        seg_rows,
        out["inputs"],
        t,
        out["segment_ids"],
        out["positions"],
        out["loss_mask"],
        rows,
        seq_len,
        bos,
        pad_id,
        t.dtype != _I32,
    )
    return out if done else None


def varlen(segment_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cu_seqlens, max_seqlen) of a batch: the cumulative boundaries of its sequences in the
    flattened batch (a sequence is a run of one segment id within a row, so each row's
    padding is one sequence of its own), int32, padded to ``rows * seq_len + 1`` entries with
    ``rows * seq_len`` (the sentinel: empty sequences at the end, so every batch has the same
    shape); max_seqlen the longest (int32, 0-d)."""
    rows, length = segment_ids.shape
    n = rows * length
    cu = np.full(n + 1, n, dtype=np.int32)
    if not n:
        return cu, np.zeros((), dtype=np.int32)
    seg = segment_ids.reshape(-1)
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(seg[1:], seg[:-1], out=change[1:])
    change[::length] = True
    starts = np.flatnonzero(change)
    cu[: len(starts)] = starts
    longest = np.diff(starts, append=n).max()
    return cu, np.array(longest, dtype=np.int32)
