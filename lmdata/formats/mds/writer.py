"""Writers of streaming datasets: MDS, CSV, TSV and JSONL shards plus index.json.

The arguments mean what they mean in streaming's ``MDSWriter``/``CSVWriter``/``TSVWriter``/
``JSONWriter``: ``columns`` (name -> encoding), ``compression``, ``hashes`` and
``size_limit``. Shards are cut with streaming's exact accounting, so uncompressed output is
byte-identical to streaming's for the same samples. The dataset appears at ``path`` only when
the writer closes without an exception.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from lmdata._options import checked
from lmdata._provenance import KEY as PROVENANCE_KEY
from lmdata.errors import InvalidInputError
from lmdata.formats.mds import compression as comp
from lmdata.formats.mds.encodings import infer_encoding
from lmdata.formats.mds.hashing import check_hashes, hexdigest
from lmdata.formats.mds.index import INDEX, SHARD_FORMATS, dump_index, parse_size_limit
from lmdata.formats.mds.mds import EXTRA_BYTES_PER_SAMPLE, SampleEncoder, shard_config
from lmdata.formats.mds.text_shards import JSONEncoder, XSVEncoder
from lmdata.storage import AtomicWriter, manifest_output, resolve

DEFAULT_SIZE_LIMIT = 1 << 26


def _infer_text_columns(sample: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in sample.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise InvalidInputError(
                f"column {k!r} holds a {type(v).__name__}; csv/tsv/jsonl columns are str, int "
                "or float. Pass columns= to choose, or write mds"
            )
        out[k] = {str: "str", int: "int", float: "float"}[type(v)]
    return out


class Writer(AtomicWriter):
    """Write samples (dicts) into a new streaming dataset directory at ``path``.

    ``format``: ``mds`` (default), ``mds-csv``, ``mds-tsv`` or ``mds-jsonl``. ``columns`` maps
    column names to encodings; when omitted they are inferred from the first sample (never
    ``pkl``: pickle columns are written only when asked for). ``compression``: ``zstd``,
    ``zstd:N``, ``gz``, ``bz2``, ``br``, ``snappy`` or None. ``hashes``: sorted hash names
    recorded per shard file. ``size_limit``: bytes per shard (an int or ``"64mb"``; None for one
    shard). ``separator`` makes an ``xsv`` dataset with another separator. Samples with keys
    that are not columns are refused unless ``drop_extra_keys=True``. A sample that is not a
    dict (a token array) is stored in the column ``token_column``. ``zstd_checksum=False``
    leaves out the checksum lmdata adds to zstd frames (streaming's exact bytes).
    ``provenance`` (what made the tokens, see :mod:`lmdata._provenance`) is stored as an
    extra key of index.json, which streaming ignores. ``manifest`` (default True) writes the
    dataset's manifest (``lmdata-manifest``: every file's size, samples and hashes) last.
    """

    @checked("lmdata.formats.mds.writer.Writer")
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        columns: Mapping[str, str] | None = None,
        format: str = "mds",
        compression: str | None = None,
        hashes: list[str] | None = None,
        size_limit: int | str | None = DEFAULT_SIZE_LIMIT,
        separator: str | None = None,
        newline: str = "\n",
        overwrite: bool = False,
        exist_ok: bool = False,
        drop_extra_keys: bool = False,
        token_column: str = "tokens",
        zstd_checksum: bool = True,
        storage_options: dict[str, Any] | None = None,
        provenance: dict[str, Any] | None = None,
        manifest: bool = True,
        # streaming's writers take these; they mean nothing for an atomic writer
        keep_local: bool = False,
        progress_bar: bool = False,
        max_workers: int | None = None,
        retry: int = 2,
    ) -> None:
        if format not in SHARD_FORMATS:
            raise InvalidInputError(f"format must be one of {', '.join(SHARD_FORMATS)}")
        self.format = format
        self._shard_format = SHARD_FORMATS[format]
        if separator is not None and self._shard_format != "json":
            fixed = {"csv": ",", "tsv": "\t"}.get(self._shard_format)
            if separator != fixed:
                self._shard_format = "xsv"  # streaming's XSVWriter with its own separator
        self._separator = separator or {"csv": ",", "tsv": "\t"}.get(self._shard_format)
        self._newline = newline
        self._compression = comp.parse(compression)
        self._hashes = check_hashes(hashes)
        self._size_limit = parse_size_limit(size_limit)
        self._drop_extra = drop_extra_keys
        self._token_column = token_column
        self._zstd_checksum = zstd_checksum
        self._extra = {PROVENANCE_KEY: provenance} if provenance is not None else None
        self._encoder: Any = None
        self._columns: dict[str, str] | None = None
        store, key = resolve(path, storage_options)
        self._out = manifest_output(
            store,
            key,
            directory=True,
            overwrite=overwrite or exist_ok,
            manifest=manifest,
            format=format,
        )
        self.path = store.url(self._out.dest)
        self.shards: list[dict[str, Any]] = []
        self._samples: list[bytes] = []
        self._shard_size = 0
        self.count = 0
        try:
            if columns is not None:
                self._set_columns(dict(columns))
        except BaseException:
            self._out.abort()
            raise

    # ---- setup -------------------------------------------------------------------------

    def _set_columns(self, columns: dict[str, str]) -> None:
        if not columns:
            raise InvalidInputError("columns must name at least one column")
        for k, v in columns.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidInputError("columns must map column names to encoding names")
        spec = self._compression.spec if self._compression else None
        if self._shard_format == "mds":
            self._encoder = SampleEncoder(
                shard_config(columns, spec, self._hashes, self._size_limit)
            )
            self._extra_sample = EXTRA_BYTES_PER_SAMPLE
        elif self._shard_format == "json":
            self._encoder = JSONEncoder(
                columns, self._newline, spec, self._hashes, self._size_limit
            )
            self._extra_sample = 0
        else:
            self._encoder = XSVEncoder(
                self._shard_format,
                columns,
                self._separator or ",",
                self._newline,
                spec,
                self._hashes,
                self._size_limit,
            )
            self._extra_sample = 0
        self._columns = columns
        self._shard_size = self._extra_shard

    @property
    def _extra_shard(self) -> int:
        return getattr(self._encoder, "extra_bytes_per_shard", 0)

    @property
    def columns(self) -> dict[str, str] | None:
        return dict(self._columns) if self._columns is not None else None

    # ---- writing -----------------------------------------------------------------------

    def write(self, sample: Any) -> None:
        """Append one sample (a dict of column values, or a token array)."""
        if self._out.done:
            raise InvalidInputError("this writer is closed")
        if not isinstance(sample, Mapping):
            if isinstance(sample, (np.ndarray, list, tuple)):
                first = self._columns is None and not isinstance(sample, np.ndarray)
                sample = {self._token_column: np.asarray(sample) if first else sample}
            else:
                raise InvalidInputError(
                    f"a sample must be a dict of column values, got {type(sample).__name__}"
                )
        if self._columns is None:
            if self._shard_format == "mds":
                self._set_columns({k: infer_encoding(v) for k, v in sample.items()})
            else:
                self._set_columns(_infer_text_columns(sample))
        assert self._columns is not None
        if not self._drop_extra and len(sample) != len(self._columns):
            extra = [k for k in sample if k not in self._columns]
            if extra:
                raise InvalidInputError(
                    f"sample has keys that are not columns: {', '.join(map(repr, extra[:5]))}; "
                    "add them to columns= or pass drop_extra_keys=True"
                )
        data = self._encoder.encode(sample)
        size = len(data) + self._extra_sample
        # streaming flushes *before* a sample that would pass the limit, even into an empty
        # shard when the very first sample is too big
        if self._size_limit and self._size_limit < self._shard_size + size:
            self._flush()
        self._samples.append(data)
        self._shard_size += size
        self.count += 1

    def _write_file(
        self, raw: bytes, raw_name: str, samples: int | None = None
    ) -> tuple[dict[str, Any], dict | None]:
        raw_info = {
            "basename": raw_name,
            "bytes": len(raw),
            "hashes": {a: hexdigest(a, raw) for a in self._hashes},
        }
        data, name, zip_info = raw, raw_name, None
        if self._compression is not None:
            data = comp.compress(self._compression, raw, zstd_checksum=self._zstd_checksum)
            name = f"{raw_name}.{self._compression.extension}"
            zip_info = {
                "basename": name,
                "bytes": len(data),
                "hashes": {a: hexdigest(a, data) for a in self._hashes},
            }
        self._out.write(name, data)
        if samples is not None:
            self._out.count(samples, name)
        return raw_info, zip_info

    def _flush(self) -> None:
        stem = f"shard.{len(self.shards):05}.{self._shard_format}"
        entry: dict[str, Any] = {"samples": len(self._samples)}
        if self._shard_format == "mds":
            raw = self._encoder.shard(self._samples)
            entry["raw_data"], entry["zip_data"] = self._write_file(raw, stem, len(self._samples))
        else:
            data, meta = self._encoder.shard(self._samples)
            entry["raw_data"], entry["zip_data"] = self._write_file(data, stem, len(self._samples))
            entry["raw_meta"], entry["zip_meta"] = self._write_file(meta, f"{stem}.meta")
        entry.update(self._encoder.config)
        self.shards.append(entry)
        self._samples = []
        self._shard_size = self._extra_shard

    def close(self) -> None:
        """Write the last shard and index.json, then move the dataset into place."""
        if self._out.done:
            return
        try:
            if self._samples:
                self._flush()
            self._out.write_last(INDEX, dump_index(self.shards, self._extra))  # after every shard
            self._out.commit()
        except BaseException:
            self._out.abort()
            raise

    finish = close  # streaming's name

    def abort(self) -> None:
        self._out.abort()
