"""The training loader: global batches by step number, mixtures, ranks, exact elastic resume.

The data order is a pure function of the configuration and the step. Step ``s`` holds
``global_batch_size`` rows; each source serves its share of them (largest remainder, carried:
``mixture.py``) from its own endless stream, which visits every row once per epoch in an order
shuffled anew each epoch (``Permutation(rows, derive_seed(seed, source, epoch))``). Rank ``r``
of ``world_size`` takes the ``r``-th slice of the global batch. Nothing depends on the number
of ranks or workers, so the resume state is the global position alone.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.loader.mixture import Mixture, exact_weights
from lmdata.loader.packing import PAD_VALUES, packed_buffers
from lmdata.loader.prefetch import prefetched
from lmdata.loader.shuffle import Permutation, derive_seed
from lmdata.loader.sources import LONG_DOCS, MODES, Source, open_source
from lmdata.loader.state import (
    STATE_VERSION,
    SavedState,
    check_reach,
    parse_state,
    refuse_other_data,
    show,
)

_SLOT_TAG = 0x510754  # seeds the order of a mixed global batch's slots
_BLOCK = 4096  # stream positions whose shuffled rows are computed and cached together
_BLOCKS_KEPT = 4  # cached blocks per source (a step needs one, two across a block edge)
_KEYS = {
    "packed": ("inputs", "targets", "segment_ids", "positions"),
    "eos": ("inputs", "targets"),
    "unpacked": ("inputs", "targets", "segment_ids", "positions", "loss_mask"),
}


@dataclass(frozen=True)
class LoaderConfig:
    """Everything that decides which rows a step reads (the rank layout does not)."""

    seq_len: int
    global_batch_size: int
    mode: str = "packed"
    shuffle: bool = True
    seed: int = 0
    epochs: int | None = None
    long_docs: str = "truncate"
    drop_last: bool = False

    def __post_init__(self) -> None:
        for name in ("seq_len", "global_batch_size"):
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


class Loader:
    """Batches for one rank: ``batch(step)`` for any step in O(1), iteration, resume state.

    ``sources`` is one token-sequence reader or path, or a list of them mixed by ``weights``
    (default: proportional to their sizes). ``mode`` is ``"packed"`` (rows cut from the
    concatenated tokens, ``segment_ids``/``positions`` for document-aware attention), ``"eos"``
    (windows of ``seq_len + 1`` tokens overlapping by one, for EOS-delimited data) or
    ``"unpacked"`` (one document or piece per row, right-padded, ``loss_mask``). ``epochs``
    makes a finite pass (evaluation): it stops after that many epochs and pads the last batch
    (``loss_mask`` False) instead of dropping it; with ``drop_last`` it serves full rows and
    full batches only, leaving out the partial row and the incomplete last batch. The batch
    keys and dtypes of each mode: the Loader guide (``docs/guide/loader.md``).
    """

    def __init__(
        self,
        sources: Any,
        *,
        seq_len: int,
        global_batch_size: int | None = None,
        mode: str = "packed",
        weights: list[float] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        token_column: str | None = None,
        epochs: int | None = None,
        dtype: str = "int32",
        bos_id: int = 0,
        pad_id: int = 0,
        long_docs: str = "truncate",
        drop_last: bool = False,
        prefetch: int = 0,
        start_step: int = 0,
        split: str | None = None,
        batch_size: int | None = None,
        packed: bool | None = None,
        truncate: bool | None = None,
    ) -> None:
        # topology first: the deprecated per-rank batch_size needs world_size
        if rank is None or world_size is None:
            r0, w0 = default_topology()
            rank = r0 if rank is None else rank
            world_size = w0 if world_size is None else world_size
        for name, v in (("rank", rank), ("world_size", world_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise InvalidInputError(f"{name} must be an integer, got {v!r}")
        rank, world_size = int(rank), int(world_size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidInputError(
                f"rank must be in [0, world_size) and world_size >= 1; got rank={rank}, "
                f"world_size={world_size}"
            )
        if batch_size is not None:  # the pre-0.2 name: a per-rank batch
            if global_batch_size is not None:
                raise InvalidInputError(
                    "pass global_batch_size= only (batch_size= is its old per-rank form)"
                )
            global_batch_size = batch_size * world_size
        if global_batch_size is None:
            raise InvalidInputError("global_batch_size= is required")
        if packed is not None:  # old spelling of mode
            mode = "packed" if packed else "unpacked"
        if truncate is not None:
            long_docs = "truncate" if truncate else "error"
        self.config = LoaderConfig(
            seq_len, global_batch_size, mode, bool(shuffle), seed, epochs, long_docs, drop_last
        )
        if global_batch_size % world_size:
            raise InvalidInputError(
                f"global_batch_size {global_batch_size} is not divisible by world_size "
                f"{world_size}; every rank must get the same number of rows"
            )
        if dtype not in ("int32", "int64"):
            raise InvalidInputError(f"dtype must be 'int32' or 'int64', got {dtype!r}")
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = global_batch_size // world_size
        self.dtype = np.dtype(dtype)
        self.bos_id, self.pad_id = int(bos_id), int(pad_id)
        info = np.iinfo(self.dtype)
        for name, v in (("bos_id", self.bos_id), ("pad_id", self.pad_id)):
            if not info.min <= v <= info.max:
                raise InvalidInputError(
                    f"{name} {v} does not fit the {dtype} outputs; pass an id in "
                    f"{info.min}..{info.max} (or dtype='int64')"
                )
        self.prefetch = int(prefetch)

        many = isinstance(sources, (list, tuple))
        readers = [open_source(s, token_column, split) for s in (sources if many else [sources])]
        if not readers:
            raise InvalidInputError("no sources given")
        self.sources = [
            Source(
                r,
                mode,
                seq_len,
                finite=epochs is not None and not drop_last,
                long_docs=long_docs,
                dtype=self.dtype,
                bos=self.bos_id,
                pad_id=self.pad_id,
            )
            for r in readers
        ]
        for k, s in enumerate(self.sources):
            if s.num_rows == 0:
                what = {"packed": f"rows of {seq_len} tokens", "eos": "windows"}.get(
                    mode, "documents"
                )
                raise InvalidInputError(
                    f"source {k} ({s.reader!r}) has no {what} ({s.num_tokens} tokens); "
                    "lower seq_len or drop the source"
                )
        sizes = exact_weights([s.num_rows for s in self.sources])
        if weights is None:
            weights = sizes
        elif len(weights) != len(self.sources):
            raise InvalidInputError(
                f"{len(weights)} weights for {len(self.sources)} sources; give one per source"
            )
        weights = exact_weights(list(weights))
        # a finite pass serves every row of every source `epochs` times, all ending together:
        # its proportions are the sources' sizes
        self._total = None if epochs is None else self.num_rows * epochs
        if drop_last and self._total is not None:  # whole batches only
            self._total -= self._total % global_batch_size
            if not self._total:
                raise InvalidInputError(
                    f"drop_last=True leaves no batch: {self.num_rows * epochs} rows in the "
                    f"pass, fewer than one global batch of {global_batch_size}; lower "
                    "global_batch_size or pass drop_last=False (the batch is padded)"
                )
        if epochs is not None and weights != sizes:
            raise InvalidInputError(
                "a finite pass (epochs=) over several sources serves every row of each "
                "`epochs` times, so its mixture is the sources' sizes; leave weights=None "
                "(or evaluate each source with its own Loader)"
            )
        try:
            self.mixture = Mixture(weights, global_batch_size, total=self._total)
        except InvalidInputError as e:
            if epochs is None:
                raise
            raise InvalidInputError(
                f"{e}: in a finite pass a source's share is its size; lower "
                "global_batch_size or evaluate that source with its own Loader"
            ) from None
        if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)):
            raise InvalidInputError(f"start_step must be an integer, got {show(start_step)}")
        check_reach(self.mixture, int(start_step), self._total)
        self.step = int(start_step)
        # DataLoader workers iterating this loader's to_torch() mark it here (torch_dataset)
        self._torch_use: Any = None
        # one endless source: a step's rows are a run of its stream, never padding (batch)
        self._one = len(self.sources) == 1 and epochs is None
        self._blocks: list[dict[int, np.ndarray]] = [{} for _ in self.sources]
        self._lock = threading.Lock()
        self.keys = _KEYS[mode] + (
            ("loss_mask",) if epochs is not None and not drop_last and mode != "unpacked" else ()
        )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Loader({len(self.sources)} source(s), mode={c.mode!r}, seq_len={c.seq_len}, "
            f"global_batch_size={c.global_batch_size}, rank={self.rank}/{self.world_size}, "
            f"step={self.step})"
        )

    # ---- sizes -----------------------------------------------------------------------------

    @property
    def global_batch_size(self) -> int:
        return self.config.global_batch_size

    @property
    def num_rows(self) -> int:
        """Rows in one epoch of all sources together."""
        return sum(s.num_rows for s in self.sources)

    @property
    def num_steps(self) -> int | None:
        """Steps of a finite pass (``epochs=``); None for an endless training stream."""
        if self.config.epochs is None:
            return None
        assert self._total is not None
        return -(-self._total // self.global_batch_size)

    @property
    def steps_per_epoch(self) -> int:
        """Full global batches in one epoch of all the data (at least 1)."""
        return max(1, self.num_rows // self.global_batch_size)

    def source_epochs(self, step: int | None = None) -> list[int]:
        """The epoch each source is in before ``step`` (default: ``self.step``): its served
        rows over its size. Sources are shuffled and counted independently, so a small source
        of a mixture is many epochs ahead of a large one."""
        served = self._served(self.step if step is None else int(step))
        return [int(v) // s.num_rows for v, s in zip(served.tolist(), self.sources, strict=True)]

    def __len__(self) -> int:
        n = self.num_steps
        if n is None:
            raise TypeError(
                "an endless training Loader has no len(); pass epochs= for a finite pass "
                f"(steps_per_epoch is {self.steps_per_epoch})"
            )
        return n

    # ---- the order -------------------------------------------------------------------------

    def indices(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, row, valid) of this rank's rows at ``step``; invalid rows are padding."""
        g, b = self.global_batch_size, self.local_batch_size
        c = self.config
        lo = self.rank * b
        served = self._served(step)
        if len(self.sources) == 1:
            start = int(served[0]) + lo
            src = np.zeros(b, dtype=np.int64)
            if self._total is None:
                return src, self._run_of(0, start, b), np.ones(b, dtype=bool)
            pos = np.arange(start, start + b, dtype=np.int64)
            valid = pos < self._total
            return src, self._rows_of(0, np.where(valid, pos, 0)), valid
        counts = self.mixture.counts(step)
        m = int(counts.sum())  # g, except in the last batch of a finite pass
        src = np.repeat(np.arange(len(self.sources)), counts)
        if c.shuffle:  # spread the sources over the ranks
            src = src[Permutation(m, derive_seed(c.seed, _SLOT_TAG, step))(np.arange(m))]
        # each source's rows, in slot order, are its next stream positions
        order = np.empty(m, dtype=np.int64)
        order[np.argsort(src, kind="stable")] = np.arange(m)
        first = np.cumsum(counts) - counts
        pos = served[src] + order - first[src]
        if m < g:  # the slots past the end of a finite pass are padding
            src = np.concatenate([src, np.full(g - m, -1)])
            pos = np.concatenate([pos, np.zeros(g - m, dtype=np.int64)])
        src, pos = src[lo : lo + b], pos[lo : lo + b]
        valid = src >= 0
        rows = np.zeros_like(pos)
        for k in np.unique(src[valid]).tolist():
            sel = src == k
            rows[sel] = self._rows_of(k, pos[sel])
        return np.where(valid, src, 0), rows, valid

    def _run_of(self, k: int, start: int, b: int, copy: bool = True) -> np.ndarray:
        """Rows at stream positions ``start .. start + b - 1`` of source ``k``: a slice of one
        cached block in the common case (a step of one source is a contiguous run), a view
        of the cache when ``copy`` is False (for a caller that only reads it)."""
        kb, at = divmod(start, _BLOCK)
        if self.config.shuffle and at + b <= _BLOCK:
            run = self._block(k, kb, self.sources[k].num_rows)[at : at + b]
            return run.copy() if copy else run
        return self._rows_of(k, np.arange(start, start + b, dtype=np.int64))

    def _rows_of(self, k: int, pos: np.ndarray) -> np.ndarray:
        """Rows at stream positions ``pos`` (increasing) of source ``k``."""
        n = self.sources[k].num_rows
        if not self.config.shuffle:
            return pos % n
        # the permutation is evaluated a block of positions at a time and cached: consecutive
        # steps reuse it, so a step costs a few array lookups
        key = pos // _BLOCK
        lo = int(key.min())
        if lo == int(key.max()):
            return self._block(k, lo, n)[pos - lo * _BLOCK]
        out = np.empty_like(pos)
        for kb in np.unique(key).tolist():
            sel = key == kb
            out[sel] = self._block(k, kb, n)[pos[sel] - kb * _BLOCK]
        return out

    def _block(self, k: int, kb: int, n: int) -> np.ndarray:
        """Rows of stream positions ``kb*_BLOCK ..`` of source ``k`` (crossing epoch ends)."""
        cache = self._blocks[k]
        got = cache.get(kb)
        if got is not None:
            return got
        pos = np.arange(kb * _BLOCK, (kb + 1) * _BLOCK, dtype=np.int64)
        epoch, j = np.divmod(pos, n)
        out = np.empty_like(j)
        for e in np.unique(epoch).tolist():
            sel = epoch == e
            out[sel] = Permutation(n, derive_seed(self.config.seed, k, e))(j[sel])
        out.flags.writeable = False  # handed out as views (batch); copies elsewhere
        with self._lock:  # each source keeps its own few blocks: any number of sources mix
            while len(cache) >= _BLOCKS_KEPT:
                cache.pop(next(iter(cache)))
            cache[kb] = out
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        state["_torch_use"] = None  # the main process's mark; datasets carry their own
        state["_blocks"] = [{} for _ in self.sources]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_torch_use", None)
        self._lock = threading.Lock()

    # ---- batches ---------------------------------------------------------------------------

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This rank's batch of ``step``: a dict of ``(local_batch_size, seq_len)`` arrays."""
        if self._one and step.__class__ is int and step >= self.mixture.base_step:
            # the common case in few operations (as indices() computes it): at 30 us a
            # batch, each microsecond of Python here is 3% of the loader's speed
            m, b = self.mixture, self.local_batch_size
            start = m.base_rows[0] + (step - m.base_step) * m.global_batch_size + self.rank * b
            return self.sources[0].read(self._run_of(0, start, b, copy=False))
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise InvalidInputError(f"step must be a non-negative integer, got {step!r}")
        n = self.num_steps
        if n is not None and step >= n:
            raise InvalidInputError(f"step {step} is past the end of this {n}-step finite pass")
        src, rows, valid = self.indices(int(step))
        if valid.all() and len(self.sources) == 1:
            return self.sources[0].read(rows)
        out = self._padding(len(rows))
        for k in np.unique(src[valid]).tolist():
            sel = np.flatnonzero(valid & (src == k))
            part = self.sources[k].read(rows[sel])
            for key in self.keys:
                out[key][sel] = part[key]
        return out

    def _padding(self, n: int) -> dict[str, np.ndarray]:
        """A batch of padding (the sources' rows are copied in): one recycled block."""
        out = packed_buffers(n, self.config.seq_len, self.dtype, tuple(self.keys))
        for key, a in out.items():
            a.fill(PAD_VALUES.get(key, self.pad_id))
        return out

    def _steps(self) -> Iterator[int]:
        s = self.step
        n = self.num_steps
        while n is None or s < n:
            yield s
            s += 1

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Batches from ``self.step`` on; ``self.step`` counts those handed out."""
        _refuse_naive_workers()
        if self.prefetch > 0:
            for s, b in prefetched(self.batch, self._steps(), self.prefetch):
                self.step = s + 1
                yield b
            return
        for s in self._steps():
            b = self.batch(s)
            self.step = s + 1
            yield b

    # ---- resume ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The global position and what it depends on: small, JSON-able, rank-free.

        An error if DataLoader workers iterated this loader's ``to_torch`` dataset: they run
        copies of the loader, so ``self.step`` is not where the training is (the message names
        the patterns whose state is right)."""
        if self._torch_use is not None:
            self._torch_use.check()
        return self._state_at(self.step)

    def _state_at(self, step: int) -> dict[str, Any]:
        m = self.mixture
        return {
            "version": STATE_VERSION,
            "step": step,
            **asdict(self.config),
            "sources": [s.describe() for s in self.sources],
            "weights": [str(w) for w in m.weights],
            "base_step": m.base_step,
            "base_rows": list(m.base_rows),
            "served": self._served(step).tolist(),
            "rounding": m.rounding,
        }

    def _served(self, step: int) -> np.ndarray:
        """Rows of each source served before ``step`` (a finite pass stops at its end)."""
        return self.mixture.served(step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was saved (any rank/worker layout).

        ``state`` is a ``state_dict``, or the ``state_dict()`` of a torchdata
        ``StatefulDataLoader`` over ``to_torch`` with any number of workers (its global
        position is the step after the last batch it handed out). A different global batch
        size or different weights continue each source's stream from what it had served; a
        different dataset, seed, sequence length or mode is an error naming what differs.
        """
        self._load(parse_state(state))

    def _load(self, saved: SavedState) -> None:
        """Adopt a parsed state (also a torch dataset's, in its DataLoader worker)."""
        refuse_other_data(saved, self.config, [s.describe() for s in self.sources])
        step, weights, g = saved.step, saved.weights, saved.global_batch_size
        n = self.num_steps
        if n is not None and g != self.global_batch_size:
            raise InvalidInputError(
                f"cannot resume a finite pass with global_batch_size {self.global_batch_size} "
                f"(saved: {g}); use the saved batch size"
            )
        if n is not None and step > n:
            raise InvalidInputError(
                f"cannot resume at step {step}: this finite pass has {n} steps (the state is "
                "not one this data and these settings produce)"
            )
        same_rounding = saved.rounding == self.mixture.rounding
        if weights == self.mixture.weights and g == self.global_batch_size and same_rounding:
            base = Mixture(weights, g, saved.base_step, saved.base_rows, self._total)
        else:  # re-base: the new rounding starts from what each source has served (also for a
            # state of an older lmdata, whose mixture rounded otherwise)
            served = saved.served
            if step != saved.saved_step:  # a torch position past the state's own step
                if not same_rounding:
                    raise InvalidInputError(
                        f"cannot resume: the saved mixture rounds {show(saved.rounding)}, "
                        "which this lmdata cannot continue past its saved step"
                    )
                old = Mixture(weights, g, saved.base_step, saved.base_rows)
                served = tuple(old.served(step).tolist())
            base = Mixture(self.mixture.weights, self.global_batch_size, step, served, self._total)
        check_reach(base, step, self._total)
        self.mixture = base
        self.step = step
        self._torch_use = None  # the position is set anew

    # ---- frameworks ------------------------------------------------------------------------

    def to_torch(self, *, start_step: int | None = None) -> Any:
        """A torch ``IterableDataset`` of this loader's batches as tensors, from ``self.step``.

        ``DataLoader(ds, batch_size=None, num_workers=k)``: worker ``i`` computes steps
        ``i, i+k, ...`` and the DataLoader hands them out in order, none lost or repeated.
        Resume state: without workers each batch handed out advances ``self.step``; with
        workers the main process runs none of the dataset, so ``state_dict`` refuses (it
        would restart the data). Use ``torch_loader``, or torchdata's
        ``StatefulDataLoader(ds, batch_size=None, num_workers=k)`` and its ``state_dict()``:
        the dataset is a torchdata ``Stateful`` whose workers' states give the global position
        (``load_state_dict`` takes it, for another worker count).
        """
        from lmdata.loader.torch_dataset import TorchBatches

        return TorchBatches(self, self.step if start_step is None else start_step)

    def torch_loader(
        self, *, num_workers: int = 0, pin_memory: bool = False, **options: Any
    ) -> Any:
        """A torch DataLoader over ``to_torch`` that advances ``self.step`` per batch
        received, so ``state_dict`` is right at any moment, with or without workers."""
        from lmdata.loader.torch_dataset import TorchLoader

        return TorchLoader(self, num_workers=num_workers, pin_memory=pin_memory, **options)


def _refuse_naive_workers() -> None:
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
