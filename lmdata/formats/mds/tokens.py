"""MDS datasets of token arrays as a TokenSequences reader (for the Loader and conversions).

``lmdata.open(path, token_column=NAME)`` gives this view of a dataset whose column ``NAME`` is
an integer ``ndarray`` (dtype in the encoding, 1-D or shape stored per sample); without it an
MDS dataset opens as records, as streaming returns them. Document lengths come from the offset
tables and array headers, vectorised per shard, so ``boundaries`` never decodes the tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, FormatError
from lmdata.formats._token_view import span_of
from lmdata.formats.mds.encodings import VALUE_DTYPES, is_integer_ndarray, parse_ndarray
from lmdata.formats.mds.reader import MDSReader
from lmdata.protocols import normalize_indices

# dtype code -> itemsize, 0 where the dtype is not an integer
_ITEMSIZE = np.zeros(256, dtype=np.int64)
for _code, _name in VALUE_DTYPES.items():
    if np.dtype(_name).kind in "iu":
        _ITEMSIZE[_code] = np.dtype(_name).itemsize


def _u32_at(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    b = buf[pos[:, None] + np.arange(4)].astype(np.int64)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


class MDSTokens(MDSReader):
    """An MDS dataset whose samples are token arrays: ``r[i]`` is a 1-D integer array."""

    def __init__(self, path: str | os.PathLike[str], *, token_column: str, **options: Any):
        super().__init__(path, **options)
        self._setup(token_column)

    @classmethod
    def wrap(cls, reader: MDSReader, token_column: str) -> MDSTokens:
        obj = cls.__new__(cls)
        obj.__dict__.update(reader.__getstate__())
        obj._init_runtime()
        obj._setup(token_column)
        return obj

    def _setup(self, column: str) -> None:
        for s in self.index.shards:
            if s.format != "mds":
                raise FormatError(
                    f"shard {s.number} is {s.format}; token columns need MDS shards",
                    path=self.index.path,
                )
            if column not in s.column_names:
                raise FormatError(
                    f"shard {s.number} has no column {column!r}; columns: "
                    f"{', '.join(s.column_names)}",
                    path=self.index.path,
                )
            enc = s.columns[column]
            if enc != "ndarray" and not is_integer_ndarray(enc):
                raise FormatError(
                    f"column {column!r} is {enc!r}; a token column is an integer ndarray",
                    path=self.index.path,
                )
            shape = parse_ndarray(enc)[1]
            if shape is not None and len(shape) != 1:
                raise FormatError(
                    f"column {column!r} has shape {shape}; tokens are 1-D", path=self.index.path
                )
        self.token_column = column
        self.select = (column,)
        self._boundaries: np.ndarray | None = None
        self._max_token_id: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return super().__getstate__()

    def __repr__(self) -> str:
        return f"MDSTokens({self.root!r}, token_column={self.token_column!r})"

    # ---- samples as arrays -------------------------------------------------------------

    def _tokens(self, sample: dict[str, Any], k: int, j: int) -> np.ndarray:
        arr = sample[self.token_column]
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise CorruptDataError(
                f"token column holds a {arr.dtype} array of shape {arr.shape}; tokens are 1-D "
                "integers",
                path=self.index.url(self.index.shards[k].raw_data),
                position=f"shard {k} sample {j}",
            )
        return arr

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        arr = super().__getitem__(index)[self.token_column]
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            self._tokens({self.token_column: arr}, *self.locate(index))  # raises
        return arr

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:  # type: ignore[override]
        idx = normalize_indices(indices, len(self))
        out = [s[self.token_column] for s in super().take(idx)]
        for i, arr in zip(idx.tolist(), out, strict=True):
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                self._tokens({self.token_column: arr}, *self.locate(i))  # raises
        return out

    def __iter__(self) -> Iterator[np.ndarray]:  # type: ignore[override]
        for i, s in enumerate(super().__iter__()):
            arr = s[self.token_column]
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                self._tokens(s, *self.locate(i))  # raises
            yield arr

    # ---- the TokenSequences extras -----------------------------------------------------

    @property
    def boundaries(self) -> np.ndarray:
        if self._boundaries is None:
            lengths = [self._shard_lengths(k) for k in range(len(self.index.shards))]
            flat = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
            b = np.zeros(len(flat) + 1, dtype=np.uint64)
            np.cumsum(flat, out=b[1:])
            self._boundaries = b
        return self._boundaries

    @property
    def num_tokens(self) -> int:
        return int(self.boundaries[-1])

    @property
    def max_token_id(self) -> int:
        if self._max_token_id is None:
            m = 0
            for arr in self:
                if len(arr):
                    m = max(m, int(arr.max()))
            self._max_token_id = m
        return self._max_token_id

    def span(self, start: int, stop: int) -> np.ndarray:
        return span_of(self, start, stop)

    def _shard_lengths(self, k: int) -> np.ndarray:
        """Token count of every sample of shard ``k`` from offsets and array headers."""
        s = self.index.shards[k]
        n = s.samples
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        loaded = self._shard(k)
        offs = np.frombuffer(loaded.table, "<u4", n + 1, 4).astype(np.int64)
        buf = np.frombuffer(loaded.data, np.uint8)
        begins, ends = offs[:-1], offs[1:]
        try:
            lengths = self._lengths(
                s.column_names, s.column_encodings, s.column_sizes, buf, begins, ends
            )
        except (IndexError, ValueError):
            lengths = None
        if lengths is None:  # inconsistent headers: decode one by one for a precise error
            for j in range(n):
                self._tokens(
                    self._decode(self._decoder(k), self._raw(loaded, k, j), loaded, k, j), k, j
                )
            raise CorruptDataError(
                "token array headers disagree with the offsets; run `lmdata validate`",
                path=loaded.data_path,
                position=f"shard {k}",
            )
        return lengths

    def _lengths(
        self,
        names: tuple[str, ...],
        encs: tuple[str, ...],
        sizes: tuple[int | None, ...],
        buf: np.ndarray,
        begins: np.ndarray,
        ends: np.ndarray,
    ) -> np.ndarray | None:
        if len(begins) and (begins.min() < 0 or ends.max() > len(buf) or (ends < begins).any()):
            return None
        nvar = sum(1 for z in sizes if z is None)
        pos = begins + 4 * nvar
        var = 0
        col_start = col_len = None
        for name, size in zip(names, sizes, strict=False):
            if size is None:
                this = _u32_at(buf, begins + 4 * var)
                var += 1
            else:
                this = np.full(len(begins), size, dtype=np.int64)
            if name == self.token_column:
                col_start, col_len = pos.copy(), this
            pos = pos + this
        if col_start is None or col_len is None or not np.array_equal(pos, ends):
            return None
        dtype, shape = parse_ndarray(encs[names.index(self.token_column)])
        if dtype is None:
            itemsize = _ITEMSIZE[buf[col_start]]
            if (itemsize == 0).any():
                return None
            hdr = 1
        else:
            itemsize = np.int64(np.dtype(dtype).itemsize)
            hdr = 0
        if shape is not None:
            counts = np.full(len(begins), shape[0], dtype=np.int64)
            return counts if np.array_equal(counts * itemsize, col_len) else None
        byte = buf[col_start + hdr].astype(np.int64)
        if ((byte >> 2) != 1).any():
            return None
        body = col_len - hdr - 1 - (1 << (byte & 3))
        if (body < 0).any() or (body % itemsize).any():
            return None
        return body // itemsize

    def info(self) -> dict[str, Any]:
        out = super().info()
        out.update(
            {"token_column": self.token_column, "sequences": len(self), "tokens": self.num_tokens}
        )
        return out
