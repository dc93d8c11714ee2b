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


def _as_dtype(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if a.dtype == np.uint32 and dtype == np.int32:
        return a.view(np.int32)  # ids are < 2^31
    return a.astype(dtype, copy=False)


def packed_from_encoded(enc: np.ndarray, dtype: np.dtype, bos: int = 0) -> dict[str, np.ndarray]:
    """Packed rows from stored flat-tokens values (``id*2 + start bit``), shape (rows, L).

    ``enc`` is consumed: its memory becomes ``targets`` when the dtype allows.
    """
    enc = np.asarray(enc, dtype=np.uint32)
    if np.little_endian:  # the start bit is in the low byte: read a quarter of the bytes
        starts = enc.view(np.uint8)[:, ::4] & np.uint8(1)
    else:
        starts = (enc & np.uint32(1)).astype(np.uint8)
    starts[:, 0] = 1
    np.right_shift(enc, np.uint32(1), out=enc)
    return _packed(_as_dtype(enc, dtype), np.flatnonzero(starts.view(bool)), dtype, bos)


def packed_from_starts(
    targets: np.ndarray, is_start: np.ndarray, dtype: np.dtype, bos: int = 0
) -> dict[str, np.ndarray]:
    """Packed rows from decoded ids and a boolean map of sequence starts."""
    st = np.array(is_start, dtype=bool)
    if st.size:
        st[:, 0] = True
    return _packed(np.asarray(targets).astype(dtype), np.flatnonzero(st), dtype, bos)


_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    a = _ARANGE.get(n)
    if a is None:
        if len(_ARANGE) > 8:
            _ARANGE.clear()
        a = _ARANGE[n] = np.arange(n, dtype=np.int32)
    return a


def _packed(
    targets: np.ndarray, starts: np.ndarray, dtype: np.dtype, bos: int
) -> dict[str, np.ndarray]:
    b, length = targets.shape
    inputs = np.empty((b, length), dtype=dtype)
    flat = inputs.reshape(-1)
    flat[1:] = targets.reshape(-1)[:-1]  # one contiguous copy; row starts are in ``starts``
    flat[starts] = bos
    positions, segment_ids = segments(starts, b, length)
    return {
        "inputs": inputs,
        "targets": targets,
        "segment_ids": segment_ids,
        "positions": positions,
    }


def segments(starts: np.ndarray, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, segment_ids), int32 (rows, length), from the flat indices of segment starts
    (every row start included, sorted)."""
    n = rows * length
    row_start = starts % length == 0
    idx = np.arange(len(starts))
    local = idx - np.maximum.accumulate(np.where(row_start, idx, 0)) + 1
    # few, long segments (the usual case) are one memcpy-speed slice each
    fill = _segments_by_slices if len(starts) * 256 <= n else _segments_by_repeat
    positions, segment_ids = fill(starts, local, rows, length)
    return positions.reshape(rows, length), segment_ids.reshape(rows, length)


def _segments_by_slices(
    starts: np.ndarray, local: np.ndarray, rows: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
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
    seg_len = np.diff(starts, append=rows * length)
    positions = np.tile(_arange(length), rows)
    positions -= np.repeat((starts % length).astype(np.int32), seg_len)
    return positions, np.repeat(local.astype(np.int32), seg_len)


def eos_windows(windows: np.ndarray, dtype: np.dtype) -> dict[str, np.ndarray]:
    """inputs/targets of windows of ``seq_len + 1`` decoded tokens, shape (rows, L + 1)."""
    w = np.asarray(windows)
    return {
        "inputs": np.ascontiguousarray(w[:, :-1]).astype(dtype, copy=False),
        "targets": np.ascontiguousarray(w[:, 1:]).astype(dtype, copy=False),
    }


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
