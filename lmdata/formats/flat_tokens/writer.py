"""Writing flat-tokens datasets that seqax, zarr-python 2 and zarr-python 3 all read.

The layout is the one seqax's own writer produces (zarr format v2, ``.`` separator, the
``max_token_id`` attribute on each split group, chunks padded to full size), written directly
without zarr-python so that it is fast and works the same with any zarr version installed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from lmdata._options import checked
from lmdata._provenance import KEY as PROVENANCE_KEY
from lmdata.errors import InvalidInputError
from lmdata.formats.flat_tokens.reader import MAX_TOKEN_ID, SPLITS
from lmdata.storage import AtomicWriter, Output, join, manifest_output, resolve

DEFAULT_CHUNK_TOKENS = 1 << 22  # 16 MiB of uint32 per chunk file, as seqax's configs
DEFAULT_SEQ_STARTS_CHUNK = 1 << 20

# name -> (compressor config for both arrays); seq_starts also gets seqax's Delta filter.
COMPRESSIONS: dict[str, dict[str, Any]] = {
    "blosc": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2, "blocksize": 0},
    "blosc-lz4": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2, "blocksize": 0},
    "blosc-zstd": {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2, "blocksize": 0},
    "zstd": {"id": "zstd", "level": 3},
    "gzip": {"id": "gzip", "level": 5},
}
_DELTA = {"id": "delta", "dtype": "<i8", "astype": "<i8"}


def dump_json(obj: Any) -> bytes:
    """JSON exactly as zarr-python 2 writes metadata (4-space indent, sorted, no newline)."""
    return json.dumps(
        obj, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": ")
    ).encode()


def parse_compression(compression: str | None) -> dict[str, Any] | None:
    if compression is None or compression == "none":
        return None
    name, _, level = compression.partition(":")
    if name not in COMPRESSIONS:
        raise InvalidInputError(
            f"unknown compression {compression!r}; choose none or one of "
            f"{', '.join(COMPRESSIONS)} (optionally with :LEVEL)"
        )
    conf = dict(COMPRESSIONS[name])
    if level:
        try:
            conf["clevel" if conf["id"] == "blosc" else "level"] = int(level)
        except ValueError:
            raise InvalidInputError(f"compression level {level!r} is not an integer") from None
    return conf


class _ArrayWriter:
    """Appends to one 1-D zarr v2 array, writing each chunk when it is full."""

    def __init__(
        self,
        out: Output,
        path: str,
        dtype: str,
        chunk_len: int,
        fill_value: int | None,
        compressor: dict[str, Any] | None,
        filters: list[dict[str, Any]] | None,
    ) -> None:
        self.out = out
        self.path = path  # the array's name inside the output
        self.dtype = np.dtype(dtype)
        self.chunk_len = chunk_len
        self.meta = {
            "chunks": [chunk_len],
            "compressor": compressor,
            "dimension_separator": ".",
            "dtype": dtype,
            "fill_value": fill_value,
            "filters": filters,
            "order": "C",
            "shape": [0],
            "zarr_format": 2,
        }
        self._comp: Any = None
        self._filters: list[Any] = []
        if compressor or filters:  # numcodecs only then: a tenth of a second of imports
            import numcodecs

            self._comp = numcodecs.get_codec(dict(compressor)) if compressor else None
            self._filters = [numcodecs.get_codec(dict(f)) for f in filters or []]
        self.buf = np.zeros(chunk_len, dtype=self.dtype)
        self.fill = 0
        self.chunk = 0
        self.length = 0

    def append(self, values: np.ndarray) -> None:
        pos = 0
        n = len(values)
        while pos < n:
            take = min(n - pos, self.chunk_len - self.fill)
            self.buf[self.fill : self.fill + take] = values[pos : pos + take]
            self.fill += take
            pos += take
            if self.fill == self.chunk_len:
                self._flush()
        self.length += n

    def _flush(self) -> None:
        if self.fill == 0:
            return
        if self.fill < self.chunk_len:
            self.buf[self.fill :] = 0  # zarr v2 chunks are always full size
        f = join(self.path, str(self.chunk))
        if self._comp is None and not self._filters:
            with self.out.open_write(f) as fh:
                fh.write(memoryview(self.buf[: self.fill]).cast("B"))
                if self.out.sparse:
                    fh.truncate(self.chunk_len * self.dtype.itemsize)  # sparse zero padding
                else:
                    fh.write(memoryview(self.buf[self.fill :]).cast("B"))
        else:
            data: Any = self.buf
            for flt in self._filters:
                data = flt.encode(data)
            if self._comp is not None:
                data = self._comp.encode(data)
            self.out.write(f, memoryview(data).cast("B") if not isinstance(data, bytes) else data)
        self.chunk += 1
        self.fill = 0

    def close(self) -> None:
        self._flush()
        self.meta["shape"] = [self.length]
        self.out.write_last(join(self.path, ".zarray"), dump_json(self.meta))


class _SplitWriter:
    def __init__(
        self,
        out: Output,
        path: str,
        chunk_tokens: int,
        seq_starts_chunk: int,
        compressor: dict[str, Any] | None,
    ) -> None:
        self.out = out
        self.path = path
        self.tokens = _ArrayWriter(
            out, join(path, "encoded_tokens"), "<u4", chunk_tokens, None, compressor, None
        )
        self.starts = _ArrayWriter(
            out,
            join(path, "seq_starts"),
            "<u8",
            seq_starts_chunk,
            0,
            compressor,
            [_DELTA] if compressor else None,
        )
        self.starts.append(np.zeros(1, dtype=np.uint64))
        self.max_id = 0
        self.sequences = 0

    def close(self) -> None:
        self.tokens.close()
        self.starts.close()
        self.out.write_last(
            join(self.path, ".zattrs"), dump_json({"max_token_id": int(self.max_id)})
        )
        self.out.write_last(join(self.path, ".zgroup"), dump_json({"zarr_format": 2}))


def encode_sequence(tokens: Any) -> tuple[np.ndarray, int]:
    """(encoded uint32 array, max id) for one sequence, or InvalidInputError."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidInputError(f"a token sequence must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint32), 0
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "b" or arr.dtype == object:
            raise InvalidInputError(f"token ids must be integers, got {arr.dtype}")
        raise InvalidInputError(f"token ids must be integers, got {arr.dtype}")
    lo = int(arr.min()) if arr.dtype.kind == "i" else 0  # unsigned ids are never negative
    hi = int(arr.max())
    if lo < 0:
        raise InvalidInputError(f"token id {lo} is negative")
    if hi > MAX_TOKEN_ID:
        raise InvalidInputError(
            f"token id {hi} is larger than 2^31-1, the most flat-tokens can store "
            "(seqax would silently corrupt it)"
        )
    # one pass, widened and shifted (the ids are checked to fit: an unsafe cast loses nothing)
    enc = np.left_shift(arr, 1, dtype=np.uint32, casting="unsafe")
    enc[0] |= 1
    return enc, hi


class Writer(AtomicWriter):
    """Writes token sequences into the ``train`` and ``validation`` splits of a new dataset.

    ``chunk_tokens``: tokens per chunk file (default 4 Mi, seqax's value).
    ``compression``: ``None`` (default: chunks are memory-mapped on read, the fastest random
    access), ``"blosc"`` (seqax's own layout: Blosc lz4 level 5 with bit shuffle, and a Delta
    filter on seq_starts), ``"blosc-zstd"``, ``"zstd"`` or ``"gzip"``, each optionally
    ``:LEVEL``. Both splits always exist, empty if nothing was written to one. The dataset
    appears at ``path`` (a local path or a URL such as ``memory://``) only when the writer
    closes without an exception: the zarr metadata objects are written last, the root group's
    at the very end. ``provenance`` (what made the tokens, see :mod:`lmdata._provenance`) goes
    into the root group's attributes. ``manifest`` (default True) writes the dataset's
    manifest (``lmdata-manifest``, every file's size and hashes) last.
    """

    @checked("lmdata.formats.flat_tokens.writer.Writer")
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        seq_starts_chunk: int = DEFAULT_SEQ_STARTS_CHUNK,
        compression: str | None = None,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        provenance: dict[str, Any] | None = None,
        manifest: bool = True,
    ) -> None:
        if chunk_tokens < 1 or seq_starts_chunk < 1:
            raise InvalidInputError("chunk_tokens and seq_starts_chunk must be at least 1")
        self._compressor = parse_compression(compression)
        self._provenance = provenance
        store, key = resolve(path, storage_options)
        self._out = manifest_output(
            store, key, directory=True, overwrite=overwrite, manifest=manifest, format="flat-tokens"
        )
        self.path = store.url(self._out.dest)
        self._splits = {
            s: _SplitWriter(self._out, s, chunk_tokens, seq_starts_chunk, self._compressor)
            for s in SPLITS
        }

    def write(self, tokens: Any, split: str = "train") -> None:
        """Append one sequence of token ids (any 1-D integer array or list) to ``split``."""
        w = self._splits.get(split)
        if w is None:
            raise InvalidInputError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        enc, hi = encode_sequence(tokens)
        if hi > w.max_id:
            w.max_id = hi
        w.tokens.append(enc)
        w.starts.append(np.array([w.tokens.length], dtype=np.uint64))
        w.sequences += 1

    def write_many(self, flat: Any, lengths: Any, split: str = "train") -> None:
        """Append many sequences at once: ``flat`` is their concatenation, ``lengths`` their
        sizes (the vectorised form of :meth:`write`)."""
        w = self._splits.get(split)
        if w is None:
            raise InvalidInputError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        lengths = np.asarray(lengths, dtype=np.int64)
        if (lengths < 0).any() or int(lengths.sum()) != len(flat):
            raise InvalidInputError("lengths must be non-negative and sum to len(flat)")
        enc, hi = encode_sequence(flat)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        nonempty = starts[lengths > 0]
        if len(enc):
            enc[0] &= ~np.uint32(1)  # encode_sequence marked position 0; mark the real starts
            enc[nonempty] |= np.uint32(1)
        w.max_id = max(w.max_id, hi)
        base = w.tokens.length
        w.tokens.append(enc)
        w.starts.append((ends + base).astype(np.uint64))
        w.sequences += len(lengths)

    def counts(self) -> dict[str, tuple[int, int]]:
        """(sequences, tokens) written so far per split."""
        return {s: (w.sequences, w.tokens.length) for s, w in self._splits.items()}

    def close(self) -> None:
        if self._out.done:
            return
        try:
            for w in self._splits.values():
                w.close()
            if self._provenance is not None:  # root attributes: seqax reads only the splits
                self._out.write_last(".zattrs", dump_json({PROVENANCE_KEY: self._provenance}))
            self._out.write_last(".zgroup", dump_json({"zarr_format": 2}))
            self._out.count(sum(w.sequences for w in self._splits.values()))
            self._out.commit()
        except BaseException:
            self._out.abort()
            raise

    def abort(self) -> None:
        self._out.abort()
