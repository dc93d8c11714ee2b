"""Reading a JSONL file through its raw ``.idx``: O(1) random access to each document."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import PurePath, PurePosixPath
from typing import Any

import numpy as np
import orjson

from lmdata._json import exact
from lmdata.errors import CorruptDataError, DatasetNotFoundError
from lmdata.formats._span_index import SpanIndex, load_span_index
from lmdata.formats.modalities_jsonl.lines import (
    LineError,
    data_object,
    default_index_path,
    loads,
    parse_many,
    release,
    shown_path,
)
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import Store, resolve


def read_index(
    store: Store,
    key: str,
    index_store: Store,
    index_key: str,
    *,
    allow_unsafe: bool = False,
    file_size: int | None = None,
) -> SpanIndex:
    """The checked raw index of object ``key``: every entry inside the data."""
    path, index_path = shown_path(store, key), shown_path(index_store, index_key)
    if not index_store.exists(index_key) or index_store.is_dir(index_key):
        raise DatasetNotFoundError(
            f"no raw index at {index_path}; build it with `lmdata index {path}`", path=path
        )
    data = index_store.read(index_key)
    if not data:  # modalities' index of no lines is still a pickle (of an empty list)
        raise CorruptDataError(
            f"the raw index is empty (0 bytes), not a pickled list: a write cut short? "
            f"Rebuild it with `lmdata index --overwrite {path}`",
            path=index_path,
        )
    index = load_span_index(data, path=index_path, where="index", allow_unsafe=allow_unsafe)
    size = store.size(key) if file_size is None else file_size
    bad = np.flatnonzero((index.offsets < 0) | (index.ends > size))
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(
            f"entry {i} points at bytes {index.offsets[i]}..{index.ends[i]} but "
            f"{PurePosixPath(str(path)).name} "
            f"has {size} bytes; the file changed after indexing, so rebuild the index with "
            f"`lmdata index --overwrite {path}`",
            path=index_path,
            position=f"entry {i}",
        )
    return index


def check_line_bounds(
    store: Store, key: str, index_path: PurePath | str, index: SpanIndex, size: int
) -> None:
    """The first entry starts a line and the last one ends one (two bytes read): an index of
    other data (a file replaced or appended to after indexing) rarely passes both."""
    if not len(index):
        return
    path = shown_path(store, key)
    first, last = int(index.offsets[0]), int(index.ends[-1])
    b, a = store.read_ranges(key, [(max(first - 1, 0), 1 if first > 0 else 0), (last, 1)])
    before = b if first > 0 else b"\n"
    after = a if last < size else b"\n"
    for ok, entry, what in ((before == b"\n", 0, "start"), (after == b"\n", -1, "end")):
        if not ok:
            i = len(index) - 1 if entry < 0 else 0
            raise CorruptDataError(
                f"entry {i} does not {what} at a line boundary of "
                f"{PurePosixPath(str(path)).name}: the index belongs "
                f"to other data (the file changed after indexing); rebuild it with "
                f"`lmdata index --overwrite {path}`",
                path=index_path,
                position=f"entry {i}",
            )


def open_data(
    path: str | os.PathLike[str],
    index_path: str | os.PathLike[str] | None,
    storage_options: dict[str, Any] | None,
) -> tuple[Store, str, Store, str]:
    """(store, key) of a JSONL file and of its index (``foo.idx`` beside it by default)."""
    store, key = data_object(path, storage_options)
    if index_path is not None:
        index_store, index_key = resolve(index_path, storage_options)
    else:
        index_store, index_key = store, str(default_index_path(key))
    return store, key, index_store, index_key


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
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.store, self.key, istore, ikey = open_data(path, index_path, storage_options)
        self.index_store, self.index_key = istore, ikey
        self.path = shown_path(self.store, self.key)
        self.index_path = shown_path(istore, ikey)
        self.file_size = self.store.size(self.key)
        index = read_index(
            self.store,
            self.key,
            istore,
            ikey,
            allow_unsafe=allow_unsafe_pickle,
            file_size=self.file_size,
        )
        check_line_bounds(self.store, self.key, self.index_path, index, self.file_size)
        self.offsets = index.offsets
        self.lengths = index.lengths
        self._buf: Any = None

    def __repr__(self) -> str:
        return f"JsonlDocuments({str(self.path)!r})"

    @property
    def _mapped(self) -> Any:
        """The file memory-mapped (local disk), or None where reads are ranged (object stores)."""
        if self._buf is None and self.store.can_mmap:
            self._buf = self.store.mmap(self.key)
        return self._buf

    def _spans(self, spans: list[tuple[int, int]]) -> list[bytes]:
        buf = self._mapped
        if buf is not None:
            return [buf[o : o + n] for o, n in spans]
        return self.store.read_ranges(self.key, spans)

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, index: int) -> bytes:
        """The bytes of document ``index`` (without the newline)."""
        i = normalize_index(index, len(self))
        off = int(self.offsets[i])
        buf = self._mapped
        if buf is not None:
            return buf[off : off + int(self.lengths[i])]  # type: ignore[no-any-return]
        return self.store.read_range(self.key, off, int(self.lengths[i]))

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
        i = normalize_index(index, len(self.offsets))
        off, n = self.offsets.item(i), self.lengths.item(i)  # plain ints, no numpy scalars
        buf = self._buf if self._buf is not None else self._mapped
        data = buf[off : off + n] if buf is not None else self.store.read_range(self.key, off, n)
        try:  # what _parse does, a call less on the common path
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self._parse(i, data)
        return value if exact(value, data) else self._parse(i, data)

    def take(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        idx = normalize_indices(indices, len(self))
        offs = self.offsets[idx].tolist()
        lens = self.lengths[idx].tolist()
        raws = self._spans(list(zip(offs, lens, strict=True)))
        return parse_many(raws, lambda j, r: self._parse(int(idx[j]), r))

    def __iter__(self) -> Iterator[Any]:
        block = 4096
        for lo in range(0, len(self), block):
            yield from self.take(np.arange(lo, min(lo + block, len(self))))

    def info(self) -> dict[str, Any]:
        return {"documents": len(self), "data_bytes": int(self.file_size)}

    def close(self) -> None:
        release(self._buf)
        self._buf = None

    def __enter__(self) -> JsonlDocuments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_buf"] = None
        return state
