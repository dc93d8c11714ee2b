"""How many rows of each source a global batch holds: its share, rounded, carried across steps.

An endless mixture gives source ``k`` either ``floor(w_k * G)`` or ``ceil(w_k * G)`` rows of
every global batch of ``G`` rows (so each batch is within one row of every share), and which
sources round up changes from step to step so that the running totals follow the exact shares:
the fractional parts ``f_k`` of the shares (they sum to an integer ``u``) tile ``[0, u)``; step
``s`` rounds up the sources whose tile holds one of the points ``theta_s + j`` (``j < u``, one
per tile at most, so exactly ``u`` sources), with ``theta_s = frac(s * a / M)`` (``M`` the
common denominator of the ``f_k``, ``a`` near ``M`` times the golden ratio's fraction and prime
to ``M``). Over ``M`` steps every ``theta`` occurs once, so each source's total is exact every
``M`` steps; in between it stays within a few rows (the golden stride spreads each source's
round-ups evenly). Every step and every running total is a closed form (a floor sum), O(#sources
x log M): no state is carried.

A finite pass (``total``) ends with every row served once: there the running totals are the
largest-remainder rounding of the exact shares (each within one row of its share, so the last,
partial batch never needs a negative count) and a batch is within two rows of each share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from math import gcd, isqrt, lcm

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


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a * i + b) / m) for i in range(n))`` for ``n >= 0``, ``m >= 1``, in
    O(log m) steps (exact integers): the sum counts lattice points under a line, and swapping
    the roles of the axes turns it into the same sum with ``(m, a)`` replaced by ``(a, m mod a)``.
    """
    total = 0
    while n > 0:
        if not 0 <= a < m:
            q, a = divmod(a, m)
            total += q * (n * (n - 1) // 2)
        if not 0 <= b < m:
            q, b = divmod(b, m)
            total += q * n
        top = a * n + b  # the line's value at i = n
        if top < m:
            break
        n, b = divmod(top, m)
        m, a = a, m
    return total


@dataclass(frozen=True)
class Spread:
    """Which sources round their share up at each step of an endless mixture (module doc)."""

    floors: tuple[int, ...]  # floor(w_k * G)
    tiles: tuple[tuple[int, int], ...]  # (start, length) of each source's tile, in units of 1/M
    period: int  # M
    stride: int  # a

    @classmethod
    def of(cls, weights: tuple[Fraction, ...], rows: int) -> Spread:
        shares = [w * rows for w in weights]
        floors = tuple(s.numerator // s.denominator for s in shares)
        fracs = [s - f for s, f in zip(shares, floors, strict=True)]
        period = lcm(*(f.denominator for f in fracs))
        tiles, start = [], 0
        for f in fracs:
            length = f.numerator * (period // f.denominator)
            tiles.append((start, length))
            start += length
        stride = (isqrt(5 * period * period) - period) // 2  # period * 0.618...
        while gcd(stride, period) != 1:
            stride += 1
        return cls(floors, tuple(tiles), period, stride)

    def up(self, step: int) -> np.ndarray:
        """1 for the sources that round up at ``step`` (exactly sum(f_k) of them), else 0."""
        theta = step * self.stride % self.period
        return np.array([(theta - lo) % self.period < n for lo, n in self.tiles], dtype=np.int64)

    def served(self, steps: int) -> np.ndarray:
        """Rows of each source in the first ``steps`` steps."""
        m, a = self.period, self.stride
        ups = [  # how many s < steps have (s*a - lo) mod m < n: floor differences count them
            floor_sum(steps, m, a, -lo) - floor_sum(steps, m, a, -lo - n) for lo, n in self.tiles
        ]
        return np.array(self.floors, dtype=np.int64) * steps + np.array(ups, dtype=np.int64)


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
    _spread: Spread | None = field(default=None, init=False, repr=False, compare=False)

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
        if self.total is None and len(self.weights) > 1:
            object.__setattr__(self, "_spread", Spread.of(self.weights, g))

    @property
    def rounding(self) -> str:
        """How the counts are rounded (saved in a state: an older one is re-based on resume)."""
        return "spread" if self._spread is not None else "remainder"

    def served(self, step: int) -> np.ndarray:
        """Rows of each source served before ``step`` (int64, one per source)."""
        if step < self.base_step:
            raise InvalidInputError(
                f"step {step} precedes step {self.base_step}, where this loader's weights or "
                "global batch size changed; earlier batches are not reproducible from this state"
            )
        if self._spread is not None:
            served = self._spread.served(step - self.base_step)
            return served + np.asarray(self.base_rows, dtype=np.int64)
        rows = (step - self.base_step) * self.global_batch_size
        if self.total is not None:
            rows = min(rows, self.total - sum(self.base_rows))
        if len(self.weights) == 1:
            return np.array([self.base_rows[0] + rows], dtype=np.int64)
        return cumulative(self.weights, rows) + np.asarray(self.base_rows, dtype=np.int64)

    def counts(self, step: int) -> np.ndarray:
        """Rows of each source in the global batch of ``step``."""
        if self._spread is not None and step >= self.base_step:
            spread = self._spread
            return np.array(spread.floors, dtype=np.int64) + spread.up(step - self.base_step)
        return self.served(step + 1) - self.served(step)
