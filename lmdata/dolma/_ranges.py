"""Byte ranges of plain JSONL document files, the units of tag, mix and dedupe: how large a
job's ranges are (:func:`range_size`) and where a file's ranges start and end (:func:`cut`).
Kept apart from :mod:`lmdata.dolma._spans` so that tag's and mix's workers import nothing
else.
"""

from __future__ import annotations

from lmdata._units import spread_size

RANGE_BYTES = 64 << 20  # the ranges of tag, mix and dedupe are at most this large
MIN_RANGE_BYTES = 4 << 20  # ... and at least this large (a smaller job runs in fewer units)
SPREAD_UNITS = 16  # a small job's plain files make about this many ranges, when they can


def range_size(total: int) -> int:
    """Bytes per range for a job holding ``total`` bytes of plain JSONL: ``total`` over
    :data:`SPREAD_UNITS`, so a small job still makes enough units for its workers to finish
    together (two workers given ranges of 64, 64, 64 and 8 MiB run 128 against 72: 1.56x the
    speed of one, not 2x), but
    within [:data:`MIN_RANGE_BYTES`, :data:`RANGE_BYTES`] (:data:`RANGE_BYTES` if they cross).
    It depends on the inputs only, never on the workers: the bytes of an output joined from
    the pieces of its ranges may depend on the ranges, and must be the same for any number of
    workers (a resumed job plans the same units too)."""
    return spread_size(total, SPREAD_UNITS, MIN_RANGE_BYTES, RANGE_BYTES)


def cut(size: int, range_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the fewest ranges of equal size (to a byte) not larger than
    ``range_bytes`` that tile ``size`` bytes (one range for a file not larger)."""
    n = max(1, -(-size // max(1, range_bytes)))
    return [(k * size // n, (k + 1) * size // n) for k in range(n)]
