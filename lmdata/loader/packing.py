"""From stored tokens to what a model trains on.

Packed rows follow the flat-tokens convention (seqax): ``targets`` are all the tokens of the
row; ``inputs`` are the targets shifted right by one with 0 at every sequence start and at row
position 0, so every position is a valid target and no loss mask is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lmdata.errors import InvalidInputError


def expand_encoded(enc: np.ndarray) -> dict[str, np.ndarray]:
    """inputs/targets of packed rows stored flat-tokens style (``id*2 + start bit``)."""
    enc = np.asarray(enc, dtype=np.uint32)
    targets = (enc >> 1).view(np.int32)  # ids are < 2^31
    keep = enc & np.uint32(1)
    keep -= np.uint32(1)  # all ones where a sequence continues, 0 at its start
    inputs = np.empty_like(targets)
    inputs[:, 0] = 0
    np.bitwise_and(targets[:, :-1], keep[:, 1:].view(np.int32), out=inputs[:, 1:])
    return {"inputs": inputs, "targets": targets, "is_start": keep == 0}


def shift_inputs(targets: np.ndarray, is_start: np.ndarray) -> dict[str, np.ndarray]:
    inputs = np.empty_like(targets)
    inputs[:, 0] = 0
    inputs[:, 1:] = targets[:, :-1]
    inputs[is_start] = 0
    return {"inputs": inputs, "targets": targets, "is_start": is_start}


def starts_in_rows(boundaries: np.ndarray, row_starts: np.ndarray, seq_len: int) -> np.ndarray:
    """Boolean (rows, seq_len): True where a non-empty sequence starts, from ``boundaries``."""
    b = np.asarray(boundaries, dtype=np.int64)
    nonempty = np.unique(b[:-1][b[1:] > b[:-1]])
    out = np.zeros((len(row_starts), seq_len), dtype=bool)
    for i, s in enumerate(np.asarray(row_starts, dtype=np.int64).tolist()):
        lo, hi = np.searchsorted(nonempty, [s, s + seq_len])
        out[i, nonempty[lo:hi] - s] = True
    return out


def pad_sequences(
    seqs: Sequence[np.ndarray],
    seq_len: int,
    *,
    pad_id: int = 0,
    truncate: bool = True,
    where: Sequence[int] | None = None,
) -> dict[str, np.ndarray]:
    """One sequence per row, right-padded with ``pad_id``; ``mask`` marks real tokens."""
    n = len(seqs)
    targets = np.full((n, seq_len), pad_id, dtype=np.int32)
    mask = np.zeros((n, seq_len), dtype=bool)
    for i, s in enumerate(seqs):
        m = len(s)
        if m > seq_len:
            if not truncate:
                idx = where[i] if where is not None else i
                raise InvalidInputError(
                    f"sequence {idx} has {m} tokens, more than seq_len {seq_len}; "
                    "pass truncate=True to cut it"
                )
            m = seq_len
        targets[i, :m] = s[:m]
        mask[i, :m] = True
    inputs = np.zeros_like(targets)
    inputs[:, 1:] = targets[:, :-1]
    inputs[~mask] = pad_id
    return {"inputs": inputs, "targets": targets, "mask": mask}
