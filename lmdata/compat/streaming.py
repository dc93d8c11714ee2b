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
- ``lmdata_manifest=True`` adds lmdata's integrity manifest (``lmdata-manifest``, which
  streaming ignores); by default the writers leave streaming's exact file set;
- ``StreamingDataset`` reads local datasets only (``local=``, a local ``remote=``, or
  ``streams=`` of such ``Stream``s); a remote URL is an error, never a silent download.
  ``batch_size`` may be omitted (streaming requires it to iterate; lmdata then uses 1).
  ``batching_method`` ``random`` (the default) and ``per_stream`` are implemented
  (``stratified`` and ``device_per_stream`` are errors); every shuffle is: ``py1e`` (the
  default), ``py1s``, ``py1br``, ``py2s`` and ``naive``.
- ``load_state_dict`` checks the state's numbers (integers; ``num_canonical_nodes`` and
  ``initial_physical_nodes`` at most 2^20, as the constructor's ``num_canonical_nodes``), which
  size the epoch's layout: a hostile state is an InvalidInputError, never a huge allocation.

Everything else is streaming's: the sample order of every epoch (with or without shuffling,
for any ``num_canonical_nodes``, ``shuffle_seed``, ``shuffle_block_size``, stream weights
``proportion``/``repeat``/``choose``, ``epoch_size``, ``sampling_method``,
``sampling_granularity``, ranks from ``RANK``/``WORLD_SIZE``/``LOCAL_WORLD_SIZE``,
``replication`` and DataLoader workers), ``ds[i]``, ``len``, ``size`` and the resume state.
The whole epoch's order is computed in each worker, as streaming's local leader does once
per node (8 bytes per sample of the epoch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from lmdata.compat._streaming_dataset import Stream, StreamingDatasetImpl
from lmdata.compat._torch import torch_class
from lmdata.errors import InvalidInputError, OutputExistsError
from lmdata.formats.mds import Writer
from lmdata.formats.mds.index import parse_size_limit

__all__ = [
    "CSVWriter",
    "JSONWriter",
    "MDSWriter",
    "Stream",
    "StreamingDataset",  # noqa: F822 (built on first use by __getattr__)
    "TSVWriter",
    "XSVWriter",
]

# streaming's writers accept these keyword arguments and nothing else
_WRITER_KWARGS = ("progress_bar", "max_workers", "retry", "exist_ok")


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
        lmdata_manifest: bool = False,
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
            manifest=lmdata_manifest,
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


def __getattr__(name: str) -> Any:
    if name == "StreamingDataset":  # a torch IterableDataset when torch is installed
        return torch_class(__name__, name, StreamingDatasetImpl, "IterableDataset")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
