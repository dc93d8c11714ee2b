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
    """Packed rows from stored flat-tokens values (``id*2 + start bit``), shape (rows, L)."""
    enc = np.asarray(enc, dtype=np.uint32)
    targets = _as_dtype(enc >> np.uint32(1), dtype)
    starts = enc & np.uint32(1)
    starts[:, 0] = 1
    return _packed(targets, np.flatnonzero(starts), dtype, bos)


def packed_from_starts(
    targets: np.ndarray, is_start: np.ndarray, dtype: np.dtype, bos: int = 0
) -> dict[str, np.ndarray]:
    """Packed rows from decoded ids and a boolean map of sequence starts."""
    st = np.array(is_start, dtype=bool)
    if st.size:
        st[:, 0] = True
    return _packed(np.asarray(targets).astype(dtype), np.flatnonzero(st), dtype, bos)


def _packed(
    targets: np.ndarray, starts: np.ndarray, dtype: np.dtype, bos: int
) -> dict[str, np.ndarray]:
    b, length = targets.shape
    n = b * length
    inputs = np.empty((b, length), dtype=dtype)
    inputs[:, 1:] = targets[:, :-1]
    inputs.reshape(-1)[starts] = bos
    # segments in flat coordinates: each starts at a document start or a row start
    idx = np.int64 if n >= 2**31 else np.int32
    seg_len = np.diff(starts, append=n)
    positions = np.arange(n, dtype=idx)
    positions -= np.repeat(starts.astype(idx), seg_len)
    row_first = np.flatnonzero(starts % length == 0)  # the first segment of each row
    local = np.arange(len(starts), dtype=np.int32)
    local -= np.repeat(row_first.astype(np.int32), np.diff(row_first, append=len(starts)))
    local += 1
    segment_ids = np.repeat(local, seg_len)
    return {
        "inputs": inputs,
        "targets": targets,
        "segment_ids": segment_ids.reshape(b, length),
        "positions": positions.astype(np.int32, copy=False).reshape(b, length),
    }


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
