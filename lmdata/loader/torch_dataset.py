"""torch adapters: an ``IterableDataset`` that splits steps between DataLoader workers and keeps
its position as a torchdata ``Stateful``, and a DataLoader wrapper that counts what the main
process received (the resume state).

Imported only by ``Loader.to_torch``/``torch_loader``: ``import lmdata`` never imports torch
(nor torchdata, which needs nothing from here: ``StatefulDataLoader`` finds ``state_dict`` and
``load_state_dict`` by name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError, MissingDependencyError
from lmdata.loader.state import TORCH_STATE_VERSION, parse_worker

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - exercised only without torch
    raise MissingDependencyError(
        "the torch adapters need PyTorch: pip install 'lmdata[torch]'"
    ) from None

_PLAIN, _STATEFUL = 1, 2  # who iterated a loader's dataset in DataLoader workers


def to_tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """numpy arrays to tensors sharing their memory."""
    return {k: torch.from_numpy(v) for k, v in batch.items()}


class WorkerUse:
    """A byte in shared memory that DataLoader workers set when they iterate a loader's
    dataset: the main process's loader then knows its ``step`` is not where training is.

    Workers get it by fork or, under spawn, through torch's shared-memory pickling: either
    way they write the main process's byte.
    """

    def __init__(self) -> None:
        self.flag = torch.zeros(1, dtype=torch.uint8).share_memory_()

    def mark(self, kind: int) -> None:
        self.flag[0] = kind

    def check(self) -> None:
        """An error naming the right patterns if workers iterated the dataset."""
        kind = int(self.flag[0])
        if kind == _STATEFUL:
            raise InvalidInputError(
                "this Loader's batches come through a StatefulDataLoader's workers, which run "
                "copies of it: loader.state_dict() would restart the data. Save the "
                "DataLoader's dl.state_dict() and resume with dl.load_state_dict(saved) (or "
                "loader.load_state_dict(saved) and a new StatefulDataLoader, for another "
                "num_workers)"
            )
        if kind:
            raise InvalidInputError(
                "this Loader's batches come through DataLoader workers (DataLoader("
                "loader.to_torch(), num_workers=k)), which run copies of it: its step is not "
                "where training is, and loader.state_dict() would restart the data. Use "
                "loader.torch_loader(num_workers=k), which counts the batches received (its "
                "loader.state_dict() is right), or torchdata's StatefulDataLoader("
                "loader.to_torch(), batch_size=None, num_workers=k) and save dl.state_dict()"
            )


def worker_use(loader: Any) -> WorkerUse:
    """The loader's mark (one per loader, made on first use)."""
    if loader._torch_use is None:
        loader._torch_use = WorkerUse()
    return loader._torch_use


def _layout() -> tuple[int, int, bool]:
    """(worker id, number of workers, inside a worker)."""
    info = get_worker_info()
    return (0, 1, False) if info is None else (info.id, info.num_workers, True)


class TorchBatches(IterableDataset):
    """The loader's batches from ``start_step`` on, as dicts of tensors.

    In DataLoader worker ``i`` of ``k`` it yields steps ``start+i, start+i+k, ...``; the
    DataLoader takes one batch from each worker in turn, so the main process receives exactly
    the loader's sequence, whatever ``k`` is. Use ``batch_size=None``: batches are already
    batched. Without workers, each batch handed out advances ``loader.step``.

    ``state_dict``/``load_state_dict`` (torchdata's ``Stateful``, called by
    ``StatefulDataLoader`` in each worker) hold the step this worker yields next, its place
    among the workers and the Loader state where the dataset started: together the workers'
    states give the global position, whatever their number.

    A loader moved after the dataset was made (``loader.load_state_dict(saved)`` once the
    DataLoader is built, as training scripts restore checkpoints) is followed: the next
    iteration starts at its new step, not at the step ``to_torch()`` saw.
    """

    def __init__(self, loader: Any, start_step: int, *, counted: bool = False) -> None:
        super().__init__()
        self.loader = loader
        self.start_step = int(start_step)
        self._counted = counted  # a TorchLoader counts the received batches itself
        self._use = None if counted else worker_use(loader)
        self._stateful = False  # a StatefulDataLoader asked for the state (workers: at start)
        self._origin: dict[str, Any] | None = None  # the Loader state at start_step
        self._resume: int | None = None  # the step the next iteration starts at, once loaded
        self._next: int | None = None  # the step this iteration yields next
        self._seen = loader.step  # the loader's step as this dataset last knew it

    def _follow(self) -> None:
        """Start from the loader's step if something else moved it since this dataset last
        saw it (a ``loader.load_state_dict`` after ``to_torch()``): never from a stale step."""
        if self._counted or self._resume is not None or self._next is not None:
            return
        if self.loader.step != self._seen:
            self.start_step = self._seen = int(self.loader.step)
            self._origin = None

    def _stop(self) -> int | None:
        return self.loader.num_steps

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._next = None  # a new iteration: its start is decided now
        self._follow()
        wid, nw, in_worker = _layout()
        first = self.start_step + wid if self._resume is None else self._resume
        self._resume = None
        self._next = first  # set now: torchdata asks for the state before the first batch
        return self._batches(first, nw, in_worker)

    def _batches(self, s: int, nw: int, in_worker: bool) -> Iterator[dict[str, torch.Tensor]]:
        if in_worker and self._use is not None:
            self._use.mark(_STATEFUL if self._stateful else _PLAIN)
        stop = self._stop()
        while stop is None or s < stop:
            b = to_tensors(self.loader.batch(s))
            self._next = s + nw
            if not in_worker and not self._counted:
                self.loader.step = self._seen = s + 1  # handed out (a DataLoader without workers)
            yield b
            s += nw

    def __len__(self) -> int:
        self._follow()
        stop = self._stop()
        if stop is None:
            raise TypeError("an endless training stream has no len(); pass epochs= to the Loader")
        return max(0, stop - self.start_step)

    # ---- torchdata Stateful ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: small, JSON-able (see the class docstring)."""
        self._stateful = True
        self._follow()
        wid, nw, _ = _layout()
        nxt = self._next
        if nxt is None:
            nxt = self.start_step + wid if self._resume is None else self._resume
        if self._origin is None:
            self._origin = self.loader._state_at(self.start_step)
        return {
            "lmdata_torch": TORCH_STATE_VERSION,
            "next_step": nxt,
            "worker": wid,
            "num_workers": nw,
            "loader": self._origin,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue this worker from a state :meth:`state_dict` gave in the same worker."""
        self._stateful = True
        pos = parse_worker(state)
        wid, nw, in_worker = _layout()
        if (pos.worker, pos.workers) != (wid, nw):
            raise InvalidInputError(
                f"this state is DataLoader worker {pos.worker} of {pos.workers}'s, loaded into "
                f"worker {wid} of {nw}; for another num_workers pass the whole "
                "StatefulDataLoader state to loader.load_state_dict() and iterate a new "
                "StatefulDataLoader(loader.to_torch(), ...)"
            )
        self.loader._load(pos.loader)  # its mixture base too (a resume may have re-based it)
        self.start_step = pos.loader.step
        self._origin = self.loader._state_at(self.start_step)
        self._resume = self._next = pos.next_step
        if not in_worker and not self._counted:
            self.loader.step = pos.next_step
        self._seen = self.loader.step


class TorchLoader:
    """``DataLoader(loader.to_torch(), batch_size=None, ...)`` that advances ``loader.step`` for
    every batch the main process receives, so ``loader.state_dict()`` is always right."""

    def __init__(self, loader: Any, **options: Any) -> None:
        if options.get("batch_size") is not None:
            raise InvalidInputError("batches are already batched: do not pass batch_size")
        self.loader = loader
        self.options = options

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        ds = TorchBatches(self.loader, self.loader.new_pass(), counted=True)
        opts = dict(self.options)
        if not opts.get("num_workers"):
            opts.pop("prefetch_factor", None)
        for b in DataLoader(ds, batch_size=None, **opts):
            self.loader.step += 1
            yield b

    def __len__(self) -> int:
        n, step = self.loader.num_steps, self.loader.step
        start = 0 if n is not None and step >= n else step  # (a pass over: the next one's)
        return len(TorchBatches(self.loader, start, counted=True))
