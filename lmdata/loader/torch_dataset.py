"""torch adapters: an ``IterableDataset`` that splits steps between DataLoader workers, and a
DataLoader wrapper that counts what the main process received (the resume state).

Imported only by ``Loader.to_torch``/``torch_loader``: ``import lmdata`` never imports torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError, MissingDependencyError

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - exercised only without torch
    raise MissingDependencyError(
        "the torch adapters need PyTorch: pip install 'lmdata[torch]'"
    ) from None


def to_tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """numpy arrays to tensors sharing their memory."""
    return {k: torch.from_numpy(v) for k, v in batch.items()}


class TorchBatches(IterableDataset):
    """The loader's batches from ``start_step`` on, as dicts of tensors.

    In DataLoader worker ``i`` of ``k`` it yields steps ``start+i, start+i+k, ...``; the
    DataLoader takes one batch from each worker in turn, so the main process receives exactly
    the loader's sequence, whatever ``k`` is. Use ``batch_size=None``: batches are already
    batched.
    """

    def __init__(self, loader: Any, start_step: int) -> None:
        super().__init__()
        self.loader = loader
        self.start_step = int(start_step)

    def _stop(self) -> int | None:
        return self.loader.num_steps

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        stop = self._stop()
        steps = (
            itertools.count(self.start_step + wid, nw)
            if stop is None
            else range(self.start_step + wid, stop, nw)
        )
        for s in steps:
            yield to_tensors(self.loader.batch(s))

    def __len__(self) -> int:
        stop = self._stop()
        if stop is None:
            raise TypeError("an endless training stream has no len(); pass epochs= to the Loader")
        return max(0, stop - self.start_step)


class TorchLoader:
    """``DataLoader(loader.to_torch(), batch_size=None, ...)`` that advances ``loader.step`` for
    every batch the main process receives, so ``loader.state_dict()`` is always right."""

    def __init__(self, loader: Any, **options: Any) -> None:
        if options.get("batch_size") is not None:
            raise InvalidInputError("batches are already batched: do not pass batch_size")
        self.loader = loader
        self.options = options

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        ds = TorchBatches(self.loader, self.loader.step)
        opts = dict(self.options)
        if not opts.get("num_workers"):
            opts.pop("prefetch_factor", None)
        for b in DataLoader(ds, batch_size=None, **opts):
            self.loader.step += 1
            yield b

    def __len__(self) -> int:
        return len(TorchBatches(self.loader, self.loader.step))
