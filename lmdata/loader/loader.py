"""The training loader: batches by step number, stateless shuffle, exact resume, ranks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.loader.packing import expand_encoded, pad_sequences, shift_inputs, starts_in_rows
from lmdata.loader.shuffle import Permutation


@dataclass(frozen=True)
class LoaderConfig:
    """Everything that decides which rows a step reads; part of the resume state."""

    seq_len: int
    batch_size: int
    packed: bool = True
    shuffle: bool = True
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    pad_id: int = 0
    truncate: bool = True

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "world_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
        if not 0 <= self.rank < self.world_size:
            raise InvalidInputError(
                f"rank must be in [0, world_size={self.world_size}), got {self.rank}"
            )
        if not 0 <= self.seed < 2**63:
            raise InvalidInputError(f"seed must be in [0, 2^63), got {self.seed}")


class Loader:
    """Batches of ``batch_size`` rows of ``seq_len`` tokens for one rank.

    The global batch of step ``s`` is rows ``s*G .. s*G+G-1`` (``G = batch_size*world_size``) of
    an endless stream that visits every row once per epoch, in an order shuffled anew each
    epoch (``seed + epoch``); rank ``r`` takes the ``r``-th slice. The data order therefore
    depends on the seed, seq_len and the global batch, never on how many ranks share it, and
    the whole training position is the step number: ``loader.batch(step)`` is O(1) and
    ``state_dict()``/``load_state_dict()`` resume exactly.

    Packed (default): a row is ``seq_len`` consecutive tokens of the concatenated dataset
    (one read); ``inputs`` hold 0 at each sequence start, no loss mask is needed.
    Unpacked: a row is one sequence, truncated to ``seq_len`` and right-padded with ``pad_id``
    (two reads); ``mask`` marks real tokens.
    """

    def __init__(
        self,
        source: Any,
        *,
        seq_len: int,
        batch_size: int,
        packed: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        pad_id: int = 0,
        truncate: bool = True,
        start_step: int = 0,
        split: str | None = None,
    ) -> None:
        if isinstance(source, (str, os.PathLike)):
            from lmdata._api import open as open_dataset

            source = open_dataset(source, split=split)
        for attr in ("span", "boundaries", "num_tokens"):
            if not hasattr(source, attr):
                raise InvalidInputError(
                    f"the Loader needs a token-sequence reader; {type(source).__name__} has no "
                    f"{attr!r} (tokenize the dataset first: `lmdata tokenize`)"
                )
        self.source = source
        self.config = LoaderConfig(
            seq_len, batch_size, packed, shuffle, seed, rank, world_size, pad_id, truncate
        )
        if packed:
            self.num_rows = source.num_tokens // seq_len
        else:
            self.num_rows = len(source)
        if self.num_rows == 0:
            what = f"rows of {seq_len} tokens" if packed else "sequences"
            raise InvalidInputError(f"the dataset has no {what} ({source.num_tokens} tokens)")
        self.step = start_step
        self._perms: dict[int, Permutation] = {}

    @property
    def global_batch(self) -> int:
        return self.config.batch_size * self.config.world_size

    def __len__(self) -> int:
        """Steps in one epoch (the stream itself is endless)."""
        return max(1, self.num_rows // self.global_batch)

    def rows(self, step: int) -> np.ndarray:
        """The row indices this rank reads at ``step``."""
        c = self.config
        g = np.arange(c.batch_size, dtype=np.int64) + (
            step * self.global_batch + c.rank * c.batch_size
        )
        epoch, j = np.divmod(g, self.num_rows)
        if not c.shuffle:
            return j
        out = np.empty_like(j)
        for e in np.unique(epoch).tolist():
            perm = self._perms.get(e)
            if perm is None:
                if len(self._perms) > 4:
                    self._perms.clear()
                perm = self._perms[e] = Permutation(self.num_rows, c.seed + e)
            sel = epoch == e
            out[sel] = perm(j[sel])
        return out

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """The batch of ``step``: ``inputs``, ``targets`` (int32, rows x seq_len), ``is_start``
        (packed) or ``mask`` (unpacked)."""
        if step < 0:
            raise InvalidInputError(f"step must be non-negative, got {step}")
        rows = self.rows(step)
        c = self.config
        src = self.source
        if not c.packed:
            return pad_sequences(
                src.take(rows), c.seq_len, pad_id=c.pad_id, truncate=c.truncate, where=rows.tolist()
            )
        if hasattr(src, "packed_rows"):
            return expand_encoded(src.packed_rows(rows, c.seq_len))
        starts = rows * c.seq_len
        targets = np.stack([src.span(s, s + c.seq_len) for s in starts.tolist()]).astype(np.int32)
        return shift_inputs(targets, starts_in_rows(src.boundaries, starts, c.seq_len))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        while True:
            b = self.batch(self.step)
            self.step += 1
            yield b

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "num_rows": self.num_rows, **asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        for k in ("num_rows", "seq_len", "batch_size", "world_size", "packed", "shuffle", "seed"):
            if k in state and state[k] != mine[k]:
                raise InvalidInputError(
                    f"cannot resume: the saved state has {k}={state[k]!r} but this loader has "
                    f"{mine[k]!r}; the data order would differ"
                )
        self.step = int(state["step"])
