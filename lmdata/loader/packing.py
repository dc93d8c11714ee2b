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

from collections.abc import Sequence

import numpy as np

PAD_VALUES = {"segment_ids": 0, "positions": 0, "loss_mask": False}


_GAP = 1024  # bytes between the arrays of one block (see packed_buffers)
_I32 = np.dtype(np.int32)
PACKED_KEYS = ("inputs", "targets", "segment_ids", "positions")


def packed_buffers(
    rows: int, length: int, dtype: np.dtype, keys: tuple[str, ...] = PACKED_KEYS
) -> dict[str, np.ndarray]:
    """Uninitialised outputs ``keys`` (inputs and targets of ``dtype``, the rest int32), shape
    (rows, length), carved from one allocation.

    One block per batch instead of four arrays: the allocator keeps reusing the same memory
    for it, where four fresh arrays per batch each cost page faults. A gap separates the
    arrays: ``inputs`` is ``targets`` copied one item over, and two arrays whose distance is
    a multiple of the 4 KiB page make that copy ~10x slower (4K aliasing of loads and stores).
    """
    n = rows * length
    types = [np.dtype(dtype) if k in ("inputs", "targets") else _I32 for k in keys]
    offsets, at = [], 0
    for t in types:
        offsets.append(at)
        at += -(-(n * t.itemsize + _GAP) // 64) * 64
    block = np.empty(at, dtype=np.uint8)
    shape = (rows, length)
    return {
        k: np.ndarray(shape, dtype=t, buffer=block, offset=o)
        for k, t, o in zip(keys, types, offsets, strict=True)
    }


def packed_from_encoded(enc: np.ndarray, dtype: np.dtype, bos: int = 0) -> dict[str, np.ndarray]:
    """Packed rows from stored flat-tokens values (``id*2 + start bit``), shape (rows, L)."""
    enc = np.asarray(enc, dtype=np.uint32)
    out = packed_buffers(*enc.shape, dtype)
    fill_packed(enc, out, bos)
    return out


def fill_packed(enc: np.ndarray, out: dict[str, np.ndarray], bos: int = 0) -> None:
    """Fill ``out`` (from :func:`packed_buffers`) from stored values ``enc`` (rows, L).

    ``enc`` may be ``out["targets"]`` itself seen as uint32 (decoded in place). Each step is
    one vectorised pass over the batch: no per-row or per-document Python.
    """
    is_start = np.empty(enc.shape, dtype=bool)
    np.bitwise_and(enc, np.uint32(1), out=is_start, casting="unsafe")
    is_start[:, 0] = True
    starts = np.flatnonzero(is_start)
    targets = out["targets"]
    if targets.dtype == np.int32:
        np.right_shift(enc, np.uint32(1), out=targets.view(np.uint32))  # ids are < 2^31
    else:
        np.right_shift(enc, np.uint32(1), out=targets)
    _finish(out, starts, bos)


def packed_from_starts(
    targets: np.ndarray, is_start: np.ndarray, dtype: np.dtype, bos: int = 0
) -> dict[str, np.ndarray]:
    """Packed rows from decoded ids and a boolean map of sequence starts."""
    st = np.array(is_start, dtype=bool)
    if st.size:
        st[:, 0] = True
    targets = np.asarray(targets)
    out = packed_buffers(*targets.shape, dtype)
    out["targets"][...] = targets
    _finish(out, np.flatnonzero(st), bos)
    return out


_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    """A cached read-only ``arange(n)`` of int32 (int64 past int32's range)."""
    a = _ARANGE.get(n)
    if a is None:
        if len(_ARANGE) > 8:
            _ARANGE.clear()
        a = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        a.flags.writeable = False
        _ARANGE[n] = a
    return a


def _finish(out: dict[str, np.ndarray], starts: np.ndarray, bos: int) -> None:
    """inputs, segment_ids and positions of ``out`` from its targets and the segment starts
    (flat indices, every row start included, sorted)."""
    targets = out["targets"]
    b, length = targets.shape
    if not targets.size:
        return
    flat = out["inputs"].reshape(-1)
    flat[1:] = targets.reshape(-1)[:-1]  # one contiguous copy; row starts are in ``starts``
    flat[starts] = bos
    seg_len = _seg_len(starts, b * length)
    ar = _arange(b * length)
    positions = out["positions"].reshape(-1)
    if ar.dtype == np.int32:  # flat index - its segment's start, written in place
        np.subtract(ar, np.repeat(starts.astype(np.int32), seg_len), out=positions)
    else:
        positions[...] = ar - np.repeat(starts, seg_len)
    local = _local_ids(starts, length).astype(np.int32)
    out["segment_ids"].reshape(-1)[...] = np.repeat(local, seg_len)


def _seg_len(starts: np.ndarray, n: int) -> np.ndarray:
    seg_len = np.empty_like(starts)
    if not len(starts):
        return seg_len
    np.subtract(starts[1:], starts[:-1], out=seg_len[:-1])
    seg_len[-1] = n - starts[-1]
    return seg_len


def _local_ids(starts: np.ndarray, length: int) -> np.ndarray:
    """The 1-based number of each segment within its row."""
    row_start = starts % length == 0
    idx = np.arange(len(starts))
    return idx - np.maximum.accumulate(np.where(row_start, idx, 0)) + 1


def segments(starts: np.ndarray, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, segment_ids), int32 (rows, length), from the flat indices of segment starts
    (every row start included, sorted)."""
    positions, segment_ids = _segments_by_repeat(starts, _local_ids(starts, length), rows, length)
    return positions.reshape(rows, length), segment_ids.reshape(rows, length)


def _segments_by_slices(
    starts: np.ndarray, local: np.ndarray, rows: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """The plain per-segment reference for :func:`_segments_by_repeat` (tests compare them)."""
    n = rows * length
    positions = np.empty(n, dtype=np.int32)
    segment_ids = np.empty(n, dtype=np.int32)
    ar = _arange(length)
    ends = [*starts[1:].tolist(), n]
    for a, z, k in zip(starts.tolist(), ends, local.tolist(), strict=True):
        positions[a:z] = ar[: z - a]
        segment_ids[a:z] = k
    return positions, segment_ids


def _segments_by_repeat(
    starts: np.ndarray, local: np.ndarray, rows: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Two ``np.repeat`` passes: a segment's id, and (flat index - its start) as position."""
    n = rows * length
    seg_len = _seg_len(starts, n)
    ar = _arange(n)
    positions = np.repeat(starts.astype(ar.dtype), seg_len)
    np.subtract(ar, positions, out=positions)
    return positions.astype(np.int32, copy=False), np.repeat(local.astype(np.int32), seg_len)


def eos_windows(windows: np.ndarray, dtype: np.dtype) -> dict[str, np.ndarray]:
    """inputs/targets of windows of ``seq_len + 1`` decoded tokens, shape (rows, L + 1)."""
    w = np.asarray(windows)
    out = _eos_buffers(w.shape[0], w.shape[1] - 1, dtype)
    out["inputs"][...] = w[:, :-1]
    out["targets"][...] = w[:, 1:]
    return out


def eos_from_encoded(enc: np.ndarray, dtype: np.dtype) -> dict[str, np.ndarray]:
    """inputs/targets of windows of stored values (``id*2 + start bit``), decoded as they are
    copied into place (one pass each)."""
    enc = np.asarray(enc, dtype=np.uint32)
    out = _eos_buffers(enc.shape[0], enc.shape[1] - 1, dtype)
    for key, part in (("inputs", enc[:, :-1]), ("targets", enc[:, 1:])):
        a = out[key]
        np.right_shift(part, np.uint32(1), out=a.view(np.uint32) if a.dtype == np.int32 else a)
    return out


def _eos_buffers(rows: int, length: int, dtype: np.dtype) -> dict[str, np.ndarray]:
    return packed_buffers(rows, max(length, 0), dtype, ("inputs", "targets"))


def unpacked_rows(
    pieces: Sequence[np.ndarray], seq_len: int, dtype: np.dtype, bos: int = 0, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """One piece (at most ``seq_len`` tokens) per row, right-padded."""
    n = len(pieces)
    targets = np.full((n, seq_len), pad_id, dtype=dtype)
    inputs = np.full((n, seq_len), pad_id, dtype=dtype)
    mask = np.zeros((n, seq_len), dtype=bool)
    for i, p in enumerate(pieces):
        m = len(p)
        targets[i, :m] = p
        if m:
            inputs[i, 0] = bos
            inputs[i, 1:m] = p[:-1]
        mask[i, :m] = True
    positions = np.where(mask, np.arange(seq_len, dtype=np.int32), 0).astype(np.int32)
    return {
        "inputs": inputs,
        "targets": targets,
        "segment_ids": mask.astype(np.int32),
        "positions": positions,
        "loss_mask": mask,
    }


def pad_tail(batch: dict[str, np.ndarray], row: int, valid: int, pad_id: int) -> None:
    """Turn positions ``valid:`` of ``row`` into padding (a partial last row of an epoch)."""
    for k, a in batch.items():
        a[row, valid:] = PAD_VALUES.get(k, pad_id)
    if "loss_mask" in batch:
        batch["loss_mask"][row, :valid] = True


def starts_in_rows(boundaries: np.ndarray, row_starts: np.ndarray, seq_len: int) -> np.ndarray:
    """Boolean (rows, seq_len): True where a non-empty sequence starts, from ``boundaries``."""
    b = np.asarray(boundaries, dtype=np.int64)
    nonempty = b[:-1][b[1:] > b[:-1]]
    out = np.zeros((len(row_starts), seq_len), dtype=bool)
    rs = np.asarray(row_starts, dtype=np.int64)
    lo = np.searchsorted(nonempty, rs)
    hi = np.searchsorted(nonempty, rs + seq_len)
    for i in range(len(rs)):
        out[i, nonempty[lo[i] : hi[i]] - rs[i]] = True
    return out
