"""Reading a JSONL file through its raw ``.idx``: O(1) random access to each document."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, DatasetNotFoundError
from lmdata.formats.modalities.layout import SpanIndex, load_span_index
from lmdata.formats.modalities_jsonl.lines import LineError, default_index_path, loads, map_file
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import local_path, require_exists


def read_index(
    path: Path, index_path: Path, *, allow_unsafe: bool = False, file_size: int | None = None
) -> SpanIndex:
    """The checked raw index of ``path``: every entry inside the file."""
    if not index_path.is_file():
        raise DatasetNotFoundError(
            f"no raw index at {index_path}; build it with `lmdata index {path}`", path=path
        )
    index = load_span_index(
        index_path.read_bytes(), path=index_path, where="index", allow_unsafe=allow_unsafe
    )
    size = path.stat().st_size if file_size is None else file_size
    bad = np.flatnonzero((index.offsets < 0) | (index.ends > size))
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(
            f"entry {i} points at bytes {index.offsets[i]}..{index.ends[i]} but {path.name} "
            f"has {size} bytes; the file changed after indexing, so rebuild the index with "
            f"`lmdata index --overwrite {path}`",
            path=index_path,
            position=f"entry {i}",
        )
    return index


def check_line_bounds(path: Path, index_path: Path, index: SpanIndex, size: int) -> None:
    """The first entry starts a line and the last one ends one (two bytes read): an index of
    other data (a file replaced or appended to after indexing) rarely passes both."""
    if not len(index):
        return
    first, last = int(index.offsets[0]), int(index.ends[-1])
    with open(path, "rb") as f:
        before = os.pread(f.fileno(), 1, first - 1) if first > 0 else b"\n"
        after = os.pread(f.fileno(), 1, last) if last < size else b"\n"
    for ok, entry, what in ((before == b"\n", 0, "start"), (after == b"\n", -1, "end")):
        if not ok:
            i = len(index) - 1 if entry < 0 else 0
            raise CorruptDataError(
                f"entry {i} does not {what} at a line boundary of {path.name}: the index belongs "
                f"to other data (the file changed after indexing); rebuild it with "
                f"`lmdata index --overwrite {path}`",
                path=index_path,
                position=f"entry {i}",
            )


class JsonlDocuments:
    """A JSONL file with its modalities raw index, as a Records reader.

    ``r[i]`` is the parsed JSON value of indexed line ``i`` (a dict for usual data);
    ``raw(i)`` its bytes. Picklable: the mapping is re-created in the receiving process.
    """

    format = "modalities-jsonl"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        index_path: str | os.PathLike[str] | None = None,
        allow_unsafe_pickle: bool = False,
    ) -> None:
        self.path = require_exists(local_path(path, "modalities-jsonl"))
        self.index_path = Path(index_path) if index_path else default_index_path(self.path)
        self.file_size = self.path.stat().st_size
        index = read_index(
            self.path, self.index_path, allow_unsafe=allow_unsafe_pickle, file_size=self.file_size
        )
        check_line_bounds(self.path, self.index_path, index, self.file_size)
        self.offsets = index.offsets
        self.lengths = index.lengths
        self._buf: Any = None

    def __repr__(self) -> str:
        return f"JsonlDocuments({str(self.path)!r})"

    @property
    def _mapped(self) -> Any:
        if self._buf is None:
            self._buf = map_file(self.path) or b""
        return self._buf

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, index: int) -> bytes:
        """The bytes of document ``index`` (without the newline)."""
        i = normalize_index(index, len(self))
        off = int(self.offsets[i])
        return self._mapped[off : off + int(self.lengths[i])]

    def _parse(self, i: int, data: bytes) -> Any:
        try:
            return loads(data)
        except LineError as e:
            raise CorruptDataError(
                f"document {i} is not valid JSON ({e}); the file changed after indexing? "
                f"Rebuild with `lmdata index --overwrite {self.path}`",
                path=self.path,
                position=f"byte {int(self.offsets[i])}",
            ) from None

    def __getitem__(self, index: int) -> Any:
        i = normalize_index(index, len(self))
        return self._parse(i, self.raw(i))

    def take(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        idx = normalize_indices(indices, len(self))
        buf = self._mapped
        offs = self.offsets[idx].tolist()
        lens = self.lengths[idx].tolist()
        spans = zip(idx.tolist(), offs, lens, strict=True)
        return [self._parse(i, buf[o : o + n]) for i, o, n in spans]

    def __iter__(self) -> Iterator[Any]:
        block = 4096
        for lo in range(0, len(self), block):
            yield from self.take(np.arange(lo, min(lo + block, len(self))))

    def info(self) -> dict[str, Any]:
        return {"documents": len(self), "data_bytes": int(self.file_size)}

    def close(self) -> None:
        if self._buf is not None and not isinstance(self._buf, bytes):
            self._buf.close()
        self._buf = None

    def __enter__(self) -> JsonlDocuments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_buf"] = None
        return state
