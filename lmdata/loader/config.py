"""The Loader's configuration (what decides the rows, checked in one place) and the rank layout
it runs under."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.loader.sources import LONG_DOCS, MODES

Mode = Literal["packed", "eos", "unpacked", "bestfit"]  # = sources.MODES
LongDocs = Literal["truncate", "split", "error"]  # = sources.LONG_DOCS
Dtype = Literal["int32", "int64"]

REMOVAL = "0.3"  # the version that drops the Loader's deprecated spellings


def deprecated(old: str, new: str) -> None:
    """Warn that ``Loader(old)`` goes in :data:`REMOVAL`, at the caller's line (past this
    function, ``Loader.__init__`` and its option check)."""
    import warnings

    msg = f"Loader({old}) is deprecated and goes in lmdata {REMOVAL}; pass {new}"
    warnings.warn(msg, DeprecationWarning, stacklevel=4)


@dataclass(frozen=True)
class LoaderConfig:
    """Everything that decides which rows a step reads (the rank layout does not)."""

    seq_len: int
    global_batch_size: int
    mode: Mode = "packed"
    shuffle: bool = True
    seed: int = 0
    epochs: int | None = None
    long_docs: LongDocs = "truncate"
    drop_last: bool = False
    block_rows: int = 4096  # bestfit: rows per packing block (loader/bestfit.py)

    def __post_init__(self) -> None:
        for name in ("seq_len", "global_batch_size", "block_rows"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
        if self.mode not in MODES:
            raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.long_docs not in LONG_DOCS:
            raise InvalidInputError(
                f"long_docs must be one of {', '.join(LONG_DOCS)}, got {self.long_docs!r}"
            )
        if self.epochs is not None and (not isinstance(self.epochs, int) or self.epochs < 1):
            raise InvalidInputError(f"epochs must be None or a positive integer: {self.epochs!r}")
        if not isinstance(self.drop_last, bool):
            raise InvalidInputError(f"drop_last must be True or False, got {self.drop_last!r}")
        if self.drop_last and self.epochs is None:
            raise InvalidInputError(
                "drop_last=True is for a finite pass (epochs=): an endless training stream has "
                "no last batch, and its rows are always full"
            )
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise InvalidInputError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")


def default_topology() -> tuple[int, int]:
    """(rank, world_size): torch.distributed if initialised, else RANK/WORLD_SIZE, else 0/1."""
    torch = sys.modules.get("torch")  # never imported here: only asked if the caller has it
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise InvalidInputError(
            "RANK / WORLD_SIZE environment variables are not integers; pass rank= and "
            "world_size= explicitly"
        ) from None


def refuse_naive_workers() -> None:
    """Iterating a Loader inside one of several DataLoader workers serves each batch once per
    worker; refuse, pointing at the right way."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    data = getattr(getattr(torch, "utils", None), "data", None)
    info = data.get_worker_info() if data is not None else None
    if info is not None and info.num_workers > 1:
        raise InvalidInputError(
            f"a Loader is being iterated inside DataLoader worker {info.id} of "
            f"{info.num_workers}: every worker would yield every batch. Use "
            "DataLoader(loader.to_torch(), batch_size=None, num_workers=k) or "
            "loader.torch_loader(num_workers=k), which split the steps between workers"
        )
