"""Drop-in for mosaicml-streaming (0.13): its writers and a ``StreamingDataset`` for local data.

Change ``from streaming import MDSWriter, StreamingDataset`` to
``from lmdata.compat.streaming import MDSWriter, StreamingDataset``; the arguments, defaults
and files written stay the same (shards, ``.meta`` files and ``index.json`` byte for byte,
zstd frames included). What you gain: writes are atomic, reads are several times faster, and
a pickle column never runs code unless ``allow_unsafe_types=True``.

Where it differs from streaming, on purpose:

- a writer whose ``with`` block raises leaves nothing behind (streaming finishes the dataset
  with the samples written so far); gzip shards carry mtime 0 instead of the current time;
- ``exist_ok=True`` replaces the output directory as a whole instead of writing into it;
- ``StreamingDataset`` reads local datasets only (``local=``, or a local ``remote=``); a
  remote URL or ``streams=`` is an error, never a silent download. ``shuffle=True`` uses
  lmdata's stateless permutation, so the shuffled order differs from streaming's ``py1e``;
  the unshuffled order, ``ds[i]``, ``len``, ``size`` and the resume state are the same.
  ``batch_size`` may be omitted (streaming requires it to iterate).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from math import ceil
from typing import Any

import numpy as np

from lmdata.compat._torch import torch_class
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats.mds import MDSReader, Writer
from lmdata.formats.mds.index import parse_size_limit
from lmdata.loader.shuffle import Permutation

__all__ = [
    "CSVWriter",
    "JSONWriter",
    "MDSWriter",
    "StreamingDataset",  # noqa: F822 (built on first use by __getattr__)
    "TSVWriter",
    "XSVWriter",
]

# streaming's writers accept these keyword arguments and nothing else
_WRITER_KWARGS = ("progress_bar", "max_workers", "retry", "exist_ok")
_READ_CHUNK = 256  # samples decoded per take() while iterating


def _local_out(out: Any) -> str:
    """The local directory of streaming's ``out`` (a path, or a ``(local, remote)`` pair)."""
    remote = None
    if isinstance(out, (tuple, list)):
        if len(out) != 2:
            raise InvalidInputError(f"out must be a path or a (local, remote) pair, got {out!r}")
        out, remote = out
    if remote is not None or not isinstance(out, (str, os.PathLike)) or "://" in str(out):
        raise InvalidInputError(
            f"out={out!r}: lmdata.compat.streaming writes local directories only; write "
            "locally and upload the finished directory (it is complete once the writer closes)"
        )
    return os.fspath(out)


class _Writer:
    """What streaming's writers share: ``write``, ``finish``, a context manager."""

    format = "mds"  # lmdata's format name

    def __init__(
        self,
        *,
        columns: Mapping[str, str],
        out: Any,
        keep_local: bool = False,
        compression: str | None = None,
        hashes: list[str] | None = None,
        size_limit: int | str | None = 1 << 26,
        **kwargs: Any,
    ) -> None:
        invalid = [k for k in kwargs if k not in _WRITER_KWARGS]
        if invalid:
            raise InvalidInputError(f"Invalid Writer argument(s): {invalid}")
        self.local = _local_out(out)
        self.remote: str | None = None
        self.keep_local = keep_local
        self.compression = compression
        self.hashes = list(hashes or [])
        exist_ok = bool(kwargs.get("exist_ok", False))
        if os.path.isdir(self.local) and os.listdir(self.local) and not exist_ok:
            raise OutputExistsError(
                "Directory is not empty (pass exist_ok=True to replace it)", path=self.local
            )
        self._w = Writer(
            self.local,
            columns=dict(columns),
            format=self.format,
            compression=compression,
            hashes=self.hashes,
            size_limit=size_limit,
            drop_extra_keys=True,  # streaming encodes the columns and ignores other keys
            overwrite=True,  # an empty or (exist_ok) existing directory is replaced
            zstd_checksum=False,
            **self._format_options(kwargs),
        )
        self.size_limit = parse_size_limit(size_limit)

    def _format_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {}

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The index entries of the shards written so far."""
        return self._w.shards

    def write(self, sample: dict[str, Any]) -> None:
        """Add one sample (a dict with a value for every column; other keys are ignored)."""
        missing = [k for k in self._w.columns or () if k not in sample]
        if missing:
            raise KeyError(missing[0])
        self._w.write(sample)

    def finish(self) -> None:
        """Write the last shard and index.json; the dataset appears at ``out`` now."""
        self._w.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self._w.abort()


class MDSWriter(_Writer):
    """streaming's ``MDSWriter``: ``columns`` maps names to MDS encodings (``str``, ``int``,
    ``bytes``, ``ndarray:uint32``, ``jpeg``, ``pkl``, ``json``, ...)."""

    format = "mds"


class JSONWriter(_Writer):
    """streaming's ``JSONWriter``: JSON-lines shards plus ``.meta`` offsets; ``newline``."""

    format = "mds-jsonl"

    def __init__(self, *, columns: Mapping[str, str], out: Any, newline: str = "\n", **kw: Any):
        self.newline = newline
        super().__init__(columns=columns, out=out, **kw)

    def _format_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"newline": self.newline}


class XSVWriter(_Writer):
    """streaming's ``XSVWriter``: text shards with any ``separator`` (``str``/``int``/``float``
    columns)."""

    format = "mds-csv"
    _fixed: str | None = None

    def __init__(
        self,
        *,
        columns: Mapping[str, str],
        out: Any,
        separator: str | None = None,
        newline: str = "\n",
        **kw: Any,
    ) -> None:
        if self._fixed is None and separator is None:
            raise InvalidInputError("XSVWriter needs separator= (CSVWriter and TSVWriter fix it)")
        self.separator = self._fixed or separator
        self.newline = newline
        super().__init__(columns=columns, out=out, **kw)

    def _format_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"separator": self.separator, "newline": self.newline}


class CSVWriter(XSVWriter):
    """streaming's ``CSVWriter`` (separator ``,``)."""

    format = "mds-csv"
    _fixed = ","

    def __init__(self, *, columns: Mapping[str, str], out: Any, newline: str = "\n", **kw: Any):
        super().__init__(columns=columns, out=out, newline=newline, **kw)


class TSVWriter(XSVWriter):
    """streaming's ``TSVWriter`` (separator tab)."""

    format = "mds-tsv"
    _fixed = "\t"

    def __init__(self, *, columns: Mapping[str, str], out: Any, newline: str = "\n", **kw: Any):
        super().__init__(columns=columns, out=out, newline=newline, **kw)


# ---- reading -------------------------------------------------------------------------------


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


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
        except ValueError:
            raise InvalidInputError(f"{what} must be an int or a string like '10k'") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{what} must be a non-negative number of samples")
    return value


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


class _StreamingDataset:
    """streaming's ``StreamingDataset`` over a local dataset (see the module docstring)."""

    def __init__(
        self,
        *,
        streams: Any = None,
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
        if streams is not None:
            raise InvalidInputError(
                "streams= is not supported by lmdata.compat.streaming; open each local "
                "dataset with local= (lmdata.Loader mixes token datasets)"
            )
        source = _source(local, remote, split)
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size}")
        self.local, self.remote, self.split = local, remote, split
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.shuffle_algo = shuffle_algo
        self.shuffle_seed = int(shuffle_seed)
        self.num_canonical_nodes = num_canonical_nodes or 1
        self.allow_unsafe_types = allow_unsafe_types
        self.initial_physical_nodes: int | None = None
        self._reader = MDSReader(source, split=split, allow_unsafe_pickle=allow_unsafe_types)
        self.num_samples = len(self._reader)
        self.epoch_size = _count(epoch_size, "epoch_size")
        if self.epoch_size is None:
            self.epoch_size = self.num_samples
        self.length = ceil(self.epoch_size / self._world()[1])
        self.next_epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, sample_in_epoch) to start from
        self._offset = 0  # sample_in_epoch the current epoch started at

    # ---- map-style access ------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Samples in the dataset (all ranks)."""
        return self.num_samples

    def __len__(self) -> int:
        """Samples this rank sees per epoch, as streaming counts them."""
        return self.length

    def get_item(self, sample_id: int, retry: int = 7) -> Any:
        return self._reader[int(sample_id)]

    def __getitem__(self, at: Any) -> Any:
        if isinstance(at, (int, np.integer)) and not isinstance(at, bool):
            return self._reader[int(at)]
        if isinstance(at, slice):
            return self._reader.take(range(*at.indices(self.num_samples)))
        if isinstance(at, (list, np.ndarray)):
            return [self[i] for i in at]
        raise ValueError(f"Unsupported argument type passed to __getitem__: {type(at)}.")

    # ---- iteration -------------------------------------------------------------------------

    def _world(self) -> tuple[int, int]:
        """(rank, ranks) from the environment variables torch's launchers set."""
        ranks = max(1, _env_int("WORLD_SIZE", 1))
        return min(max(0, _env_int("RANK", 0)), ranks - 1), ranks

    @staticmethod
    def _worker() -> tuple[int, int]:
        try:
            from torch.utils.data import get_worker_info
        except ImportError:
            return 0, 1
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def _sample_ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Sample ids at these positions of epoch ``epoch``'s global order."""
        n = self.num_samples
        pos = positions % max(self.epoch_size or 1, 1)
        if not self.shuffle:
            return pos % n
        out = np.empty_like(pos)
        block = pos // n
        for b in np.unique(block):
            sel = block == b
            seed = (self.shuffle_seed * 0x9E3779B1 + epoch * 0x85EBCA77 + int(b)) & (2**63 - 1)
            out[sel] = Permutation(n, seed)(pos[sel] % n)
        return out

    def _rank_positions(self, rank: int, ranks: int) -> np.ndarray:
        """Global positions of this rank's samples, in order: global batches of
        ``ranks * batch_size`` split by rank, then an even split of the partial tail."""
        b = self.batch_size or 1
        per = self.length
        full = per // b  # whole batches every rank gets
        k = np.arange(full * b, dtype=np.int64)
        head = ((k // b) * ranks + rank) * b + k % b
        tail_len = per - full * b
        tail = full * b * ranks + rank * tail_len + np.arange(tail_len, dtype=np.int64)
        return np.concatenate([head, tail])

    def _start_epoch(self) -> tuple[int, int]:
        if self._resume is not None:
            epoch, offset = self._resume
            self._resume = None
        else:
            epoch, offset = self.next_epoch, 0
        self.next_epoch = epoch + 1
        self._offset = offset
        return epoch, offset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        epoch, offset = self._start_epoch()
        if not self.num_samples:
            return
        rank, ranks = self._world()
        positions = self._rank_positions(rank, ranks)
        positions = positions[positions >= offset]
        worker, workers = self._worker()
        b = self.batch_size or 1
        mine = positions[(np.arange(len(positions)) // b) % workers == worker]
        for lo in range(0, len(mine), _READ_CHUNK):
            ids = self._sample_ids(epoch, mine[lo : lo + _READ_CHUNK])
            yield from self._reader.take(ids)

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (DataLoader workers iterate copies of the
        dataset, so with workers the epoch advances only through this or the resume state)."""
        self.next_epoch = int(epoch)

    # ---- resume ----------------------------------------------------------------------------

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        """The resume state after ``num_samples`` samples (all ranks) of the current epoch;
        ``from_beginning`` says whether they count from the epoch's start or this run's."""
        epoch = max(self.next_epoch - 1, 0)
        sample_in_epoch = num_samples if from_beginning else self._offset + num_samples
        return {
            "epoch": epoch,
            "sample_in_epoch": sample_in_epoch,
            "num_canonical_nodes": self.num_canonical_nodes,
            "shuffle_seed": self.shuffle_seed,
            "initial_physical_nodes": self.initial_physical_nodes or 1,
        }

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Resume: the next iteration continues epoch ``obj["epoch"]`` after
        ``obj["sample_in_epoch"]`` samples."""
        try:
            epoch, sample = int(obj["epoch"]), int(obj["sample_in_epoch"])
        except (KeyError, TypeError, ValueError):
            raise InvalidInputError(
                "a StreamingDataset state needs integer 'epoch' and 'sample_in_epoch'"
            ) from None
        if "shuffle_seed" in obj:
            self.shuffle_seed = int(obj["shuffle_seed"])
        self.initial_physical_nodes = obj.get("initial_physical_nodes")
        self._resume = (epoch, sample)
        self.next_epoch = epoch


def __getattr__(name: str) -> Any:
    if name == "StreamingDataset":  # a torch IterableDataset when torch is installed
        return torch_class(__name__, name, _StreamingDataset, "IterableDataset")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
