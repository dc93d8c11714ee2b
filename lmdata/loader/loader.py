"""The training loader: global batches by step number, mixtures, ranks, exact elastic resume.

The data order is a pure function of the configuration and the step. Step ``s`` holds
``global_batch_size`` rows; each source serves its share of them (largest remainder, carried:
``mixture.py``) from its own endless stream, which visits every row once per epoch in an order
shuffled anew each epoch (``Permutation(rows, derive_seed(seed, source, epoch))``). Rank ``r``
of ``world_size`` takes the ``r``-th slice of the global batch. Nothing depends on the number
of ranks or workers, so the resume state is the global position alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import numpy as np

from lmdata._options import checked
from lmdata.errors import InvalidInputError
from lmdata.loader.config import (
    Dtype,
    LoaderConfig,
    LongDocs,
    Mode,
    default_topology,
    deprecated,
    refuse_naive_workers,
)
from lmdata.loader.inputs import open_source, split_weights, start_token
from lmdata.loader.lineage import Lineage, lineage
from lmdata.loader.mixture import Mixture, exact_weights
from lmdata.loader.packing import PAD_VALUES, packed_buffers, varlen
from lmdata.loader.prefetch import prefetched
from lmdata.loader.shuffle import Permutation, derive_seed
from lmdata.loader.sources import make_source
from lmdata.loader.state import (
    MAX_ROWS,
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
    "bestfit": ("inputs", "targets", "segment_ids", "positions", "loss_mask"),
}
VARLEN_KEYS = ("cu_seqlens", "max_seqlen")


class Loader:
    """Batches for one rank: ``batch(step)`` for any step in O(1), iteration, resume state.

    ``sources`` is one token-sequence reader or path, a list of them mixed by ``weights``
    (default: proportional to their sizes), or a mapping of them to weights. ``mode`` is
    ``"packed"`` (rows cut from the concatenated tokens, ``segment_ids``/``positions`` for
    document-aware attention), ``"bestfit"`` (whole documents packed into rows by best fit,
    right-padded, ``loss_mask``; only documents longer than ``seq_len`` are cut, per
    ``long_docs``, default ``"split"``), ``"eos"`` (windows of ``seq_len + 1`` tokens
    overlapping by one, for EOS-delimited data) or ``"unpacked"`` (one document or piece per
    row, right-padded, ``loss_mask``). ``varlen`` adds ``cu_seqlens``/``max_seqlen`` for
    variable-length attention. ``bos_id`` defaults to the recorded tokenizer's BOS. ``epochs``
    makes a finite pass (evaluation): it stops after that many epochs and pads the last batch
    (``loss_mask`` False) instead of dropping it; with ``drop_last`` it serves full rows and
    full batches only, leaving out the partial row and the incomplete last batch. The batch
    keys and dtypes of each mode: the Loader guide (``docs/guide/loader.md``). Old spellings
    (``batch_size=`` per rank, ``packed=``, ``truncate=``) warn until lmdata 0.3.
    """

    @checked("lmdata.Loader", hide=("batch_size", "packed", "truncate"))
    def __init__(
        self,
        sources: Any,
        *,
        seq_len: int,
        global_batch_size: int | None = None,
        mode: Mode = "packed",
        weights: list[float] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        token_column: str | None = None,
        epochs: int | None = None,
        dtype: Dtype = "int32",
        bos_id: int | None = None,
        pad_id: int = 0,
        long_docs: LongDocs | None = None,
        drop_last: bool = False,
        block_rows: int = 4096,
        varlen: bool = False,
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
            deprecated("batch_size=B", "global_batch_size=B * world_size")
            if global_batch_size is not None:
                raise InvalidInputError(
                    "pass global_batch_size= only (batch_size= is its old per-rank form)"
                )
            global_batch_size = batch_size * world_size
        if global_batch_size is None:
            raise InvalidInputError("global_batch_size= is required")
        if packed is not None:  # old spelling of mode
            deprecated(f"packed={packed}", f"mode={'packed' if packed else 'unpacked'!r}")
            mode = "packed" if packed else "unpacked"
        if truncate is not None:
            deprecated(f"truncate={truncate}", f"long_docs={'truncate' if truncate else 'error'!r}")
            long_docs = "truncate" if truncate else "error"
        if long_docs is None:  # bestfit's point is whole documents: long ones in pieces
            long_docs = "split" if mode == "bestfit" else "truncate"
        self.config = LoaderConfig(
            seq_len,
            global_batch_size,
            mode,
            bool(shuffle),
            seed,
            epochs,
            long_docs,
            drop_last,
            block_rows,
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
        self.pad_id = int(pad_id)
        self.varlen = bool(varlen)
        if self.varlen and mode == "eos":
            raise InvalidInputError(
                "varlen=True is for packed, bestfit and unpacked rows (eos windows have no "
                "document boundaries)"
            )
        self.prefetch = int(prefetch)

        given, weights, _many = split_weights(sources, weights)
        readers = [open_source(s, token_column, split) for s in given]
        if not readers:
            raise InvalidInputError("no sources given")
        # each source's start token: bos_id=, else its recorded tokenizer's BOS, else 0
        starts = []
        for r in readers:  # (a loop, not a comprehension: a warning names the caller's line)
            starts.append(start_token(r, bos_id))
        self.bos_id = starts[0]
        info = np.iinfo(self.dtype)
        for name, v in [("bos_id", b) for b in starts] + [("pad_id", self.pad_id)]:
            if not info.min <= v <= info.max:
                raise InvalidInputError(
                    f"{name} {v} does not fit the {dtype} outputs; pass an id in "
                    f"{info.min}..{info.max} (or dtype='int64')"
                )
        self.sources = [
            make_source(
                r,
                mode,
                seq_len,
                finite=epochs is not None and not drop_last,
                long_docs=long_docs,
                dtype=self.dtype,
                bos=b,
                pad_id=self.pad_id,
                seed=seed,
                index=k,
                shuffle=bool(shuffle),
                block_rows=block_rows,
            )
            for k, (r, b) in enumerate(zip(readers, starts, strict=True))
        ]
        for k, s in enumerate(self.sources):
            if s.num_rows == 0:
                what = {"packed": f"rows of {seq_len} tokens", "eos": "windows"}.get(
                    mode, "documents" if mode == "unpacked" else "tokens"
                )
                raise InvalidInputError(
                    f"source {k} ({s.reader!r}) has no {what} ({s.num_tokens} tokens); "
                    "lower seq_len or drop the source"
                )
        sizes = exact_weights([s.num_rows for s in self.sources])
        if weights is not None and len(weights) != len(self.sources):
            raise InvalidInputError(
                f"{len(weights)} weights for {len(self.sources)} sources; give one per source"
            )
        mix = sizes if weights is None else exact_weights(list(weights))
        # a finite pass serves every row of every source `epochs` times, all ending together:
        # its proportions are the sources' sizes
        rows = None if epochs is None else self.num_rows * epochs
        self._total = rows
        if drop_last and self._total is not None:  # whole batches only
            self._total -= self._total % global_batch_size
            if not self._total:
                raise InvalidInputError(
                    f"drop_last=True leaves no batch: {rows} rows in the "
                    f"pass, fewer than one global batch of {global_batch_size}; lower "
                    "global_batch_size or pass drop_last=False (the batch is padded)"
                )
        if epochs is not None and mix != sizes:
            raise InvalidInputError(
                "a finite pass (epochs=) over several sources serves every row of each "
                "`epochs` times, so its mixture is the sources' sizes; leave weights=None "
                "(or evaluate each source with its own Loader)"
            )
        try:
            self.mixture = Mixture(mix, global_batch_size, total=self._total)
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
            ("loss_mask",)
            if epochs is not None and not drop_last and mode in ("packed", "eos")
            else ()
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
        """(source, row, valid) of this rank's rows at ``step``; invalid rows are padding. A
        bestfit source's "row" is its stream position (its rows differ from epoch to epoch:
        ``explain`` says what they hold)."""
        b = self.local_batch_size
        return self._slots(step, self.rank * b, b)

    def _slots(self, step: int, lo: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, row, valid) of rows ``lo .. lo + b - 1`` of the global batch of ``step``."""
        g = self.global_batch_size
        c = self.config
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
        if self.sources[k].positional:  # bestfit: the source reads stream positions
            return np.arange(start, start + b, dtype=np.int64)
        kb, at = divmod(start, _BLOCK)
        if self.config.shuffle and at + b <= _BLOCK:
            run = self._block(k, kb, self.sources[k].num_rows)[at : at + b]
            return run.copy() if copy else run
        return self._rows_of(k, np.arange(start, start + b, dtype=np.int64))

    def _rows_of(self, k: int, pos: np.ndarray) -> np.ndarray:
        """Rows at stream positions ``pos`` (increasing) of source ``k``."""
        n = self.sources[k].num_rows
        if self.sources[k].positional:  # bestfit shuffles its own rows (loader/bestfit.py)
            return pos
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

    def layout(self) -> list[dict[str, Any] | None]:
        """Per source, its bestfit layout and padding (``loader/bestfit.py``: rows per
        block, overflow rows, rows per epoch, ``padding`` the share of row tokens that are
        padding); None for sources of other modes."""
        return [s.bestfit.report() if s.bestfit is not None else None for s in self.sources]

    # ---- lineage ---------------------------------------------------------------------------

    def explain(self, step: int, *, ids: bool = True) -> Lineage:
        """Where every row of the global batch of ``step`` came from: for each row its segments
        (source, document, document id where the dataset records one, offset in the document,
        length), in the row's order, over the row's ``targets``. Computed from the order and
        the sequence index, never stored: batches of any step, on any rank."""
        self._check_step(step)
        g = self.global_batch_size
        src, rows, valid = self._slots(int(step), 0, g)
        return lineage(self.sources, int(step), src, rows, valid, ids=ids)

    def _check_step(self, step: Any) -> None:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise InvalidInputError(f"step must be a non-negative integer, got {show(step)}")
        check_reach(self.mixture, int(step), self._total)
        n = self.num_steps
        if n is not None and step >= n:
            raise InvalidInputError(f"step {step} is past the end of this {n}-step finite pass")

    # ---- batches ---------------------------------------------------------------------------

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This rank's batch of ``step``: a dict of ``(local_batch_size, seq_len)`` arrays
        (with ``varlen``, also ``cu_seqlens`` and ``max_seqlen``: see ``packing.varlen``)."""
        out = self._batch(step)
        if self.varlen:
            out["cu_seqlens"], out["max_seqlen"] = varlen(out["segment_ids"])
        return out

    def _batch(self, step: int) -> dict[str, np.ndarray]:
        if self._one and step.__class__ is int and step >= self.mixture.base_step:
            # the common case in few operations (as indices() computes it): at 30 us a
            # batch, each microsecond of Python here is 3% of the loader's speed
            m, b = self.mixture, self.local_batch_size
            start = m.base_rows[0] + (step - m.base_step) * m.global_batch_size + self.rank * b
            if start < MAX_ROWS:
                return self.sources[0].read(self._run_of(0, start, b, copy=False))
        self._check_step(step)
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

    def new_pass(self) -> int:
        """The step an iteration starts at: ``self.step``, except that a finite loader whose
        pass is over starts a new one (step 0): an evaluation loop iterates it every time."""
        n = self.num_steps
        if n is not None and self.step >= n:
            self.mixture = Mixture(self.mixture.weights, self.global_batch_size, total=self._total)
            self.step = 0
        return self.step

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Batches from ``self.step`` on; ``self.step`` counts those handed out (a finite
        loader whose pass is over starts a new pass: ``new_pass``)."""
        refuse_naive_workers()
        self.new_pass()
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
