"""streaming's ``Stream`` and ``StreamingDataset`` over local datasets (see compat.streaming).

The sample order, the epoch length and the resume state are streaming 0.13's exactly: the
epoch is computed by :mod:`lmdata.compat._streaming_epoch` (resampling, partition, shuffle)
for the world read from the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) and
the DataLoader worker, and each worker reads its slice of it. Samples are read through
lmdata's MDS reader instead of streaming's per-sample file opens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import ceil
from numbers import Integral, Real
from typing import Any

import numpy as np

from lmdata.compat import _streaming_epoch as E
from lmdata.errors import InvalidInputError
from lmdata.formats.mds import MDSReader
from lmdata.protocols import normalize_index

_READ_CHUNK = 256  # samples decoded per take() while iterating
# canonical or physical nodes a run (or a resume state) may name: an epoch's layout allocates
# per canonical node, and a million is far beyond streaming's 64 per node on any cluster
MAX_NODES = 1 << 20
_WEIGHTS = ("proportion", "repeat", "choose")


def _count(value: int | str | None, what: str) -> int | None:
    """streaming's sample counts: an int or a string such as ``"10k"``."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        units = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
        mult = units.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in units else text
        try:
            value = int(float(digits) * mult)
        except (ValueError, OverflowError):  # not a number, or inf
            raise InvalidInputError(f"{what} must be an int or a string like '10k'") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{what} must be a non-negative number of samples")
    return value


def _state_int(obj: Any, key: str, lo: int, hi: int) -> int:
    """``obj[key]`` if it is an integer in ``[lo, hi]``, else a clear error (a resume state is
    untrusted: its numbers size the epoch's layout)."""
    v = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(v, bool) or not isinstance(v, Integral) or not lo <= v <= hi:
        if v is None or isinstance(v, (bool, float)) or (isinstance(v, int) and abs(v) < 2**64):
            shown = repr(v)
        elif isinstance(v, str):
            shown = repr(v) if len(v) <= 40 else f"a string of {len(v)} characters"
        else:
            shown = f"a {type(v).__name__[:40]}"
        raise InvalidInputError(
            f"a StreamingDataset state's {key!r} is {shown}, not an integer in [{lo}, {hi}]; "
            "pass the dict StreamingDataset.state_dict() returned"
        )
    return int(v)


def _source(local: str | None, remote: str | None, split: str | None) -> str:
    """The directory to read: ``local`` when it holds the dataset (streaming then downloads
    nothing either), else a ``remote`` that is a local path."""
    if local is not None:
        if remote is None or os.path.isfile(os.path.join(local, split or "", "index.json")):
            return local
    if remote is not None and "://" not in str(remote):
        return remote
    if remote is None:
        raise InvalidInputError("give local= (the dataset directory)")
    raise InvalidInputError(
        f"remote={remote!r}: lmdata.compat.streaming reads local datasets only and "
        f"local={local!r} holds none; download the dataset first and pass its directory "
        "as local="
    )


class Stream:
    """streaming's ``Stream``: one local dataset of a mix and how much of it an epoch draws
    (at most one of ``proportion``, ``repeat``, ``choose``; unset knobs take the dataset's)."""

    def __init__(
        self,
        *,
        remote: str | None = None,
        local: str | None = None,
        split: str | None = None,
        proportion: float | None = None,
        repeat: float | None = None,
        choose: int | None = None,
        download_retry: int | None = None,
        download_timeout: float | None = None,
        validate_hash: str | None = None,
        keep_zip: bool | None = None,
    ) -> None:
        given = {k: v for k, v in zip(_WEIGHTS, (proportion, repeat, choose), strict=True)}
        given = {k: v for k, v in given.items() if v is not None}
        if len(given) > 1:
            raise InvalidInputError(
                "At most one of `proportion`, `repeat`, and `choose` may be specified; the "
                "others are derived"
            )
        for k, v in given.items():
            if isinstance(v, bool) or not isinstance(v, Real) or v < 0:
                raise InvalidInputError(f"`{k}` must be non-negative")
        if remote is None and local is None:
            raise InvalidInputError("`remote` and/or `local` path must be provided")
        self.remote, self.local, self.split = remote, local, split or ""
        self.weight: tuple[str, float] | None = next(iter(given.items()), None)
        self.download_retry, self.download_timeout = download_retry, download_timeout
        self.validate_hash, self.keep_zip = validate_hash, keep_zip
        if self.weight is not None:
            setattr(self, self.weight[0], self.weight[1])

    def __repr__(self) -> str:
        return f"Stream(local={self.local!r}, split={self.split!r}, weight={self.weight})"


@dataclass(frozen=True)
class _World:
    """Who this process is, as streaming's ``World`` (with replication applied)."""

    nodes: int
    ranks_per_node: int
    workers: int
    node: int
    rank_of_node: int
    worker: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _worker() -> tuple[int, int]:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def _world(replication: int | None, workers: bool = True) -> _World:
    ranks = max(1, _env_int("WORLD_SIZE", 1))
    per_node = max(1, _env_int("LOCAL_WORLD_SIZE", 1))
    rank = min(max(0, _env_int("RANK", 0)), ranks - 1)
    worker, n_workers = _worker() if workers else (0, 1)
    nodes = max(1, ranks // per_node)
    if replication is not None:  # groups of `replication` ranks see the same samples
        if ranks % replication:
            raise InvalidInputError(
                f"the world size {ranks} must be divisible by replication={replication}"
            )
        rank, ranks = rank // replication, ranks // replication
        nodes = ranks // per_node if ranks % per_node == 0 else 1
        per_node = ranks // nodes
    return _World(nodes, per_node, n_workers, rank // per_node, rank % per_node, worker)


class StreamingDatasetImpl:
    """streaming's ``StreamingDataset`` over local datasets (see compat.streaming)."""

    def __init__(
        self,
        *,
        streams: Sequence[Stream] | None = None,
        remote: str | None = None,
        local: str | None = None,
        split: str | None = None,
        download_retry: int = 2,
        download_timeout: float = 60,
        validate_hash: str | None = None,
        keep_zip: bool = False,
        epoch_size: int | str | None = None,
        predownload: int | None = None,
        cache_limit: int | str | None = None,
        sampling_method: str = "balanced",
        sampling_granularity: int = 1,
        partition_algo: str = "relaxed",
        num_canonical_nodes: int | None = None,
        batch_size: int | None = None,
        shuffle: bool = False,
        shuffle_algo: str = "py1e",
        shuffle_seed: int = 9176,
        shuffle_block_size: int | None = None,
        batching_method: str = "random",
        allow_unsafe_types: bool = False,
        replication: int | None = None,
        stream_name: str = "stream",
        stream_config: dict[str, Any] | None = None,
    ) -> None:
        if bool(streams) == bool(remote or local):
            raise InvalidInputError(
                "You must provide either `streams` or `remote`/`local`, but not both."
            )
        self._check_knobs(
            sampling_method, sampling_granularity, batching_method, shuffle_seed, shuffle_algo,
            partition_algo, batch_size, replication,
        )  # fmt: skip
        self.local, self.remote, self.split = local, remote, split
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.shuffle_algo = shuffle_algo
        self.shuffle_seed = int(shuffle_seed)
        self.shuffle_block_size = shuffle_block_size
        if num_canonical_nodes is not None and (
            isinstance(num_canonical_nodes, bool)
            or not isinstance(num_canonical_nodes, Integral)
            or not 0 <= num_canonical_nodes <= MAX_NODES
        ):
            raise InvalidInputError(
                f"num_canonical_nodes must be an integer in [1, {MAX_NODES}] (or None), got "
                f"{num_canonical_nodes!r}"[:200]
            )
        self.num_canonical_nodes = num_canonical_nodes
        self.sampling_method = sampling_method
        self.sampling_granularity = int(sampling_granularity)
        self.partition_algo = partition_algo
        self.batching_method = batching_method
        self.replication = replication
        self.allow_unsafe_types = allow_unsafe_types
        self.predownload = predownload if predownload is not None else 8 * (batch_size or 8)
        self.initial_physical_nodes: int | None = None
        if streams:
            self.streams = list(streams)
            for s in self.streams:
                s.split = s.split or split or ""
        else:
            self.streams = [Stream(remote=remote, local=local, split=split)]
        self._readers = []
        for s in self.streams:
            reader = MDSReader(
                _source(s.local, s.remote, s.split or None),
                split=s.split or None,
                allow_unsafe_pickle=allow_unsafe_types,
            )
            if not len(reader):
                raise InvalidInputError(
                    "Stream contains no samples", path=os.path.join(reader.root, "index.json")
                )
            self._readers.append(reader)
        shard_sizes = [[sh.samples for sh in r.index.shards] for r in self._readers]
        self._samples_per_shard = np.array([n for sizes in shard_sizes for n in sizes], np.int64)
        self._shards_per_stream = np.array([len(x) for x in shard_sizes], np.int64)
        self.samples_per_stream = np.array([len(r) for r in self._readers], np.int64)
        self.sample_offset_per_stream = np.cumsum(self.samples_per_stream) - self.samples_per_stream
        self.num_samples = int(self.samples_per_stream.sum())
        self.num_streams = len(self.streams)
        self._choose, self._proportions = E.stream_choices(
            [s.weight for s in self.streams],
            self.samples_per_stream,
            _count(epoch_size, "epoch_size") or None,
            self.shuffle_seed,
        )
        self.epoch_size = int(self._choose.sum())
        self.length = ceil(self.epoch_size / _world(replication, workers=False).ranks)
        self.next_epoch = 0
        self._resume_state: dict[str, Any] | None = None

    @staticmethod
    def _check_knobs(
        sampling_method: str,
        granularity: int,
        batching_method: str,
        seed: int,
        shuffle_algo: str,
        partition_algo: str,
        batch_size: int | None,
        replication: int | None,
    ) -> None:
        if sampling_method not in ("balanced", "fixed"):
            raise InvalidInputError(
                f"Invalid sampling method: {sampling_method}. Must be one of `balanced` or `fixed`."
            )
        if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity < 1:
            raise InvalidInputError("`sampling_granularity` must be a positive integer")
        if batching_method not in ("random", "per_stream"):
            raise InvalidInputError(
                f"batching_method {batching_method!r}: lmdata.compat.streaming implements "
                "streaming's `random` (the default) and `per_stream` batching"
            )
        if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
            raise InvalidInputError("`shuffle_seed` must be a non-negative integer")
        E.check_algos(shuffle_algo, partition_algo)
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, Integral) or batch_size < 1
        ):
            raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size}")
        if replication is not None and replication < 1:
            raise InvalidInputError("Replication factor must be positive.")

    # ---- map-style access ------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Samples in the dataset (all streams, all ranks)."""
        return self.num_samples

    def __len__(self) -> int:
        """Samples this rank sees per epoch, as streaming counts them."""
        return self.length

    def _take(self, ids: np.ndarray) -> list[Any]:
        """Samples by global id (streams' samples numbered one stream after another)."""
        if len(self._readers) == 1:
            return self._readers[0].take(ids)
        which = np.searchsorted(self.sample_offset_per_stream, ids, side="right") - 1
        out: list[Any] = [None] * len(ids)
        for s in np.unique(which).tolist():
            at = np.flatnonzero(which == s)
            local = ids[at] - self.sample_offset_per_stream[s]
            for k, sample in zip(at.tolist(), self._readers[s].take(local), strict=True):
                out[k] = sample
        return out

    def get_item(self, sample_id: int, retry: int = 7) -> Any:
        return self._take(np.array([normalize_index(sample_id, self.num_samples)]))[0]

    def __getitem__(self, at: Any) -> Any:
        if isinstance(at, (int, np.integer)) and not isinstance(at, bool):
            return self.get_item(int(at))
        if isinstance(at, slice):
            return self._take(np.arange(*at.indices(self.num_samples), dtype=np.int64))
        if isinstance(at, (list, np.ndarray)):
            return [self[i] for i in at]
        raise ValueError(f"Unsupported argument type passed to __getitem__: {type(at)}.")

    # ---- iteration -------------------------------------------------------------------------

    def _resume(self, world: _World, epoch: int) -> tuple[int, int]:
        """(epoch, sample_in_epoch) to run: the loaded state's unless it is stale."""
        state = self._resume_state
        if state is None or state["epoch"] < epoch:
            if not self.num_canonical_nodes:
                big = self.shuffle_algo in ("py1s", "py2s")
                self.num_canonical_nodes = world.nodes * (64 if big else 1)
            self._default_block_size()
            return epoch, 0
        self.num_canonical_nodes = int(state["num_canonical_nodes"])
        self.shuffle_seed = int(state["shuffle_seed"])
        self.initial_physical_nodes = state.get("initial_physical_nodes")
        self._default_block_size()
        return int(state["epoch"]), int(state["sample_in_epoch"])

    def _default_block_size(self) -> None:
        if self.shuffle_block_size is None:
            self.shuffle_block_size = max(4_000_000 // (self.num_canonical_nodes or 1), 1 << 18)

    def _order(self) -> E.Order:
        sampling = E.Sampling(
            samples_per_shard=self._samples_per_shard,
            shards_per_stream=self._shards_per_stream,
            choose_per_stream=self._choose,
            seed=self.shuffle_seed,
            granularity=self.sampling_granularity,
            balanced=self.sampling_method == "balanced",
            shuffle=self.shuffle,
        )
        return E.Order(
            sampling=sampling,
            epoch_size=self.epoch_size,
            batch_size=self.batch_size or 1,
            shuffle=self.shuffle,
            algo=self.shuffle_algo,
            block_size=int(self.shuffle_block_size or 1 << 18),
            partition_algo=self.partition_algo,
            batching=self.batching_method,
            proportions=tuple(float(x) for x in self._proportions),
        )

    def work(self, epoch: int, sample_in_epoch: int, world: _World | None = None) -> np.ndarray:
        """The sample ids this process (or ``world``'s) reads in that epoch, in order."""
        w = world or _world(self.replication)
        ids = E.epoch_ids(
            self._order(),
            epoch,
            sample_in_epoch,
            E.Layout(
                int(self.num_canonical_nodes or w.nodes),
                w.nodes,
                w.ranks_per_node,
                w.workers,
                self.initial_physical_nodes,
            ),
        )
        mine = ids[w.node, w.rank_of_node, w.worker].reshape(-1)
        return mine[mine >= 0]

    def __iter__(self) -> Iterator[Any]:
        world = _world(self.replication)
        epoch, sample_in_epoch = self._resume(world, self.next_epoch)
        self.next_epoch = epoch + 1
        ids = self.work(epoch, sample_in_epoch, world)
        for lo in range(0, len(ids), _READ_CHUNK):
            yield from self._take(ids[lo : lo + _READ_CHUNK])

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (DataLoader workers iterate copies of the
        dataset, so with workers the epoch advances only through this or the resume state)."""
        self.next_epoch = int(epoch)

    # ---- resume ----------------------------------------------------------------------------

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        """The resume state after ``num_samples`` samples (all ranks) of the current epoch;
        ``from_beginning`` says whether they count from the epoch's start or this run's."""
        world = _world(self.replication, workers=False)
        epoch, offset = self._resume(world, self.next_epoch - 1)
        return {
            "epoch": epoch,
            "sample_in_epoch": num_samples if from_beginning else offset + num_samples,
            "num_canonical_nodes": self.num_canonical_nodes,
            "shuffle_seed": self.shuffle_seed,
            "initial_physical_nodes": (
                world.nodes if self.initial_physical_nodes is None else self.initial_physical_nodes
            ),
        }

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Resume: the next iteration continues epoch ``obj["epoch"]`` after
        ``obj["sample_in_epoch"]`` samples (unless this instance is already past it)."""
        if not isinstance(obj, dict):
            raise InvalidInputError(
                f"a StreamingDataset state is a dict (from state_dict), not a {type(obj).__name__}"
            )
        state = {  # epoch -1: saved before the first epoch (stale here, as in streaming)
            "epoch": _state_int(obj, "epoch", -1, 2**48),
            "sample_in_epoch": _state_int(obj, "sample_in_epoch", 0, 2**62),
            "num_canonical_nodes": _state_int(obj, "num_canonical_nodes", 1, MAX_NODES),
            "shuffle_seed": _state_int(obj, "shuffle_seed", 0, 2**64 - 1),
        }
        if obj.get("initial_physical_nodes") is not None:
            nodes = _state_int(obj, "initial_physical_nodes", 1, MAX_NODES)
            state["initial_physical_nodes"] = nodes
        self._resume_state = state
