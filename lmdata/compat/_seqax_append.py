"""Appending to an existing flat-tokens dataset in place, as seqax's ``Writer`` does (mode
``a`` or ``r+``): each split's arrays grow as zarr-python 2's ``append`` grows them.

A split that exists keeps its own chunking and codecs (the ``Config`` only shapes a split
that is created); its last, partial chunk is decoded, extended and re-encoded, later chunks are
new files; ``max_token_id`` rises to the largest chunk's. Every file is replaced atomically and
the metadata goes last (chunks, then ``.zattrs``, then ``encoded_tokens``' and ``seq_starts``'
``.zarray``), so a reader sees the old dataset until the append is finished; an abandoned append
removes the chunk files it added and leaves the dataset's content as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, InvalidInputError
from lmdata.formats.flat_tokens._blosc import BadChunk
from lmdata.formats.flat_tokens._codecs import v2_decoder
from lmdata.formats.flat_tokens.writer import dump_json

_BLOSC = {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2, "blocksize": 0}
_DELTA = {"id": "delta", "dtype": "<i8", "astype": "<i8"}


def _replace(path: Path, data: bytes) -> None:
    """Write ``path`` atomically (a reader sees the old bytes or the new, never a mix)."""
    tmp = path.with_name(f".{path.name}.lmdata-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _new_meta(chunk_len: int, dtype: str, fill: int | None, filters: list | None) -> dict:
    """The ``.zarray`` seqax's writer creates (zarr-python 2's spelling)."""
    return {
        "chunks": [chunk_len],
        "compressor": dict(_BLOSC),
        "dimension_separator": ".",
        "dtype": dtype,
        "fill_value": fill,
        "filters": filters,
        "order": "C",
        "shape": [0],
        "zarr_format": 2,
    }


class _ArrayAppend:
    """One 1-D zarr v2 array grown in place; nothing is written until something is appended."""

    def __init__(self, folder: Path, dtype: str, new_meta: dict[str, Any] | None = None) -> None:
        import numcodecs

        self.folder = folder
        meta_path = folder / ".zarray"
        if new_meta is not None:
            self.meta, self.changed = new_meta, True
        else:
            try:
                self.meta = json.loads(meta_path.read_bytes())
            except (OSError, ValueError) as e:
                raise CorruptDataError(
                    f"cannot read the array metadata: {e}", path=meta_path
                ) from None
            self.changed = False
        m = self.meta
        if (
            m.get("zarr_format") != 2
            or m.get("dtype") != dtype
            or len(m.get("shape", ())) != 1
            or len(m.get("chunks", ())) != 1
        ):
            raise InvalidInputError(
                f"seqax's Writer appends to 1-D zarr v2 arrays of {dtype}; this one is not "
                "(write a new dataset instead)",
                path=meta_path,
            )
        self.dtype = np.dtype(dtype)
        self.chunk_len = int(m["chunks"][0])
        self.length = int(m["shape"][0])
        # the reader's checks first: only codecs whose decode is a pure function of bytes (a
        # "pickle" filter would run code), every decompression bounded by the chunk's size
        self._decode, _ = v2_decoder(m, self.dtype, self.chunk_len, str(folder))
        comp = m.get("compressor")
        self._comp = numcodecs.get_codec(dict(comp)) if comp else None
        self._filters = [numcodecs.get_codec(dict(f)) for f in m.get("filters") or []]
        self.chunk, self.fill = divmod(self.length, self.chunk_len)
        self.buf = self._load(self.chunk) if self.fill else np.zeros(self.chunk_len, self.dtype)
        self.first_new = self.chunk + (1 if self.fill else 0)  # chunks from here on are new
        self.written: list[Path] = []

    def _load(self, index: int) -> np.ndarray:
        """Chunk ``index`` decoded (a missing chunk holds zeros, as zarr-python 2 reads it)."""
        path = self.folder / str(index)
        if not path.exists():
            return np.zeros(self.chunk_len, self.dtype)
        data = path.read_bytes()
        try:
            plain = data if self._decode is None else self._decode(data)
            out = np.frombuffer(memoryview(plain).cast("B"), self.dtype)
        except (BadChunk, ValueError) as e:  # bad bytes (BadChunk), or not whole items
            raise CorruptDataError(f"cannot decode chunk {index}: {e}", path=path) from None
        if len(out) != self.chunk_len:
            raise CorruptDataError(
                f"chunk {index} holds {len(out)} values, not {self.chunk_len}", path=path
            )
        return out.copy()

    def last(self) -> int:
        """The array's last value."""
        if self.fill:
            return int(self.buf[self.fill - 1])
        return int(self._load(self.chunk - 1)[-1])

    def append(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.changed = True
        pos = 0
        while pos < len(values):
            take = min(len(values) - pos, self.chunk_len - self.fill)
            self.buf[self.fill : self.fill + take] = values[pos : pos + take]
            self.fill += take
            pos += take
            if self.fill == self.chunk_len:
                self._flush()
        self.length += len(values)

    def _flush(self) -> None:
        if self.fill == 0:
            return
        self.buf[self.fill :] = 0  # beyond the shape zarr-python 2 keeps zeros
        data: Any = self.buf
        for f in self._filters:
            data = f.encode(data)
        if self._comp is not None:
            data = self._comp.encode(data)
        path = self.folder / str(self.chunk)
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.chunk >= self.first_new:
            self.written.append(path)
        _replace(path, bytes(memoryview(np.ascontiguousarray(data)).cast("B")))
        self.chunk += 1
        self.fill = 0

    def flush(self) -> None:
        """Write the partial last chunk (every chunk is then on disk)."""
        if self.changed:
            self._flush()

    def write_meta(self) -> None:
        if self.changed:
            self.meta["shape"] = [self.length]
            _replace(self.folder / ".zarray", dump_json(self.meta))

    def abort(self) -> None:
        for path in self.written:
            path.unlink(missing_ok=True)


class SplitAppend:
    """One split of an existing dataset (created, as seqax does, when it is absent)."""

    def __init__(self, root: Path, split: str, tokens_chunk: int, starts_chunk: int) -> None:
        self.group = root / split
        self.created = not (self.group / ".zgroup").exists()
        self._new_folder = not self.group.exists()
        if self.created:
            self.tokens = _ArrayAppend(
                self.group / "encoded_tokens", "<u4", _new_meta(tokens_chunk, "<u4", None, None)
            )
            self.starts = _ArrayAppend(
                self.group / "seq_starts", "<u8", _new_meta(starts_chunk, "<u8", 0, [_DELTA])
            )
            self.starts.length = self.starts.fill = 1  # seqax's zeros(shape=(1,)): no chunk yet
            self.starts.changed = False
            self.attrs: dict[str, Any] = {"max_token_id": 0}
            return
        self.tokens = _ArrayAppend(self.group / "encoded_tokens", "<u4")
        self.starts = _ArrayAppend(self.group / "seq_starts", "<u8")
        attrs_path = self.group / ".zattrs"
        try:
            self.attrs = json.loads(attrs_path.read_bytes()) if attrs_path.exists() else {}
        except ValueError as e:
            raise CorruptDataError(
                f"cannot read the split's attributes: {e}", path=attrs_path
            ) from None
        if not self.starts.length or self.starts.last() != self.tokens.length:
            raise CorruptDataError(
                f"seq_starts does not end at the {self.tokens.length} tokens of "
                "encoded_tokens; the dataset is damaged (lmdata validate shows where)",
                path=self.group,
            )
        self.attrs_changed = "max_token_id" not in self.attrs
        self.attrs.setdefault("max_token_id", 0)

    def write(self, encoded: np.ndarray, seq_starts: np.ndarray, max_token_id: int) -> None:
        """seqax's ``write``: the chunk's tokens as given and its starts after the ones there."""
        if max_token_id > self.attrs["max_token_id"]:
            self.attrs["max_token_id"] = int(max_token_id)
            self.attrs_changed = True
        base = self.tokens.length
        self.tokens.append(encoded)
        self.starts.append((seq_starts[1:] + np.uint64(base)).astype(np.uint64))

    def finish(self) -> None:
        self.tokens.flush()
        self.starts.flush()
        if self.created:
            self.group.mkdir(parents=True, exist_ok=True)
            _replace(self.group / ".zgroup", dump_json({"zarr_format": 2}))
            self.starts.changed = True  # its .zarray exists from the start in seqax's split
            self.tokens.changed = True
            self.attrs_changed = True
        if self.attrs_changed:
            _replace(self.group / ".zattrs", dump_json(self.attrs))
        self.tokens.write_meta()
        self.starts.write_meta()

    def abort(self) -> None:
        self.tokens.abort()
        self.starts.abort()
        if self._new_folder:
            shutil.rmtree(self.group, ignore_errors=True)

    attrs_changed = False
