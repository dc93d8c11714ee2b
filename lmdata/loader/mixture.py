"""How many rows of each source a global batch holds: largest remainder, carried across steps.

After ``t`` steps of ``G`` rows the sources have been served ``R(t)``: the largest-remainder
rounding of the exact shares ``w_k * G * t`` (weights as exact fractions, ties to the lower
source index). Step ``t`` serves ``R(t+1) - R(t)`` rows of each source. ``R(t)`` is a closed
form, so any step is O(#sources) and no state is carried, yet the rounding is carried: every
source's running total stays within one row of its exact share at every step. Counts never go
negative as long as each used source gets at least one row per batch on average
(``w_k * G >= 1``), which :class:`Mixture` checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from lmdata.errors import InvalidInputError


def exact_weights(weights: list[float] | tuple[float, ...]) -> tuple[Fraction, ...]:
    """The weights as exact fractions summing to 1 (floats are taken at their exact value)."""
    fr = []
    for i, w in enumerate(weights):
        try:
            f = Fraction(w)
        except (TypeError, ValueError):
            raise InvalidInputError(f"weight {i} is {w!r}, not a number") from None
        if f < 0:
            raise InvalidInputError(f"weight {i} is negative ({w!r}); weights must be >= 0")
        fr.append(f)
    total = sum(fr, Fraction(0))
    if total == 0:
        raise InvalidInputError("the mixture weights sum to 0; give at least one positive weight")
    return tuple(f / total for f in fr)


def cumulative(weights: tuple[Fraction, ...], rows: int) -> np.ndarray:
    """Largest-remainder rounding of ``w_k * rows``: int64 counts that sum to ``rows``."""
    if len(weights) == 1:
        return np.array([rows], dtype=np.int64)
    floors, rems = [], []
    for w in weights:
        q, r = divmod(w.numerator * rows, w.denominator)
        floors.append(q)
        rems.append(Fraction(r, w.denominator))
    left = rows - sum(floors)
    order = sorted(range(len(weights)), key=lambda k: (-rems[k], k))
    for k in order[:left]:
        floors[k] += 1
    return np.array(floors, dtype=np.int64)


@dataclass(frozen=True)
class Mixture:
    """Per-source row counts from ``base_step`` on, starting from ``base_rows`` served rows.

    The base moves only when a resumed run changes the weights or the global batch size: the
    new rounding then starts from what each source had already served, so nothing is repeated
    or skipped. ``total`` ends a finite pass: no more than that many rows are ever served.
    """

    weights: tuple[Fraction, ...]
    global_batch_size: int
    base_step: int = 0
    base_rows: tuple[int, ...] = ()
    total: int | None = None

    def __post_init__(self) -> None:
        if not self.base_rows:
            object.__setattr__(self, "base_rows", (0,) * len(self.weights))
        g = self.global_batch_size
        for k, w in enumerate(self.weights):
            if 0 < w * g < 1:
                raise InvalidInputError(
                    f"source {k} has weight {float(w):.6g}, less than one row of the global "
                    f"batch of {g}; raise its weight to at least 1/{g} or the batch size"
                )

    def served(self, step: int) -> np.ndarray:
        """Rows of each source served before ``step`` (int64, one per source)."""
        if step < self.base_step:
            raise InvalidInputError(
                f"step {step} precedes step {self.base_step}, where this loader's weights or "
                "global batch size changed; earlier batches are not reproducible from this state"
            )
        rows = (step - self.base_step) * self.global_batch_size
        if self.total is not None:
            rows = min(rows, self.total - sum(self.base_rows))
        if len(self.weights) == 1:
            return np.array([self.base_rows[0] + rows], dtype=np.int64)
        return cumulative(self.weights, rows) + np.asarray(self.base_rows, dtype=np.int64)

    def counts(self, step: int) -> np.ndarray:
        """Rows of each source in the global batch of ``step``."""
        return self.served(step + 1) - self.served(step)
