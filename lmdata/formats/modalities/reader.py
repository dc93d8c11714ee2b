"""Reading ``.pbin`` files: the header and token data memory-mapped, the index checked."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdata._progress import OnProgress, Ticker
from lmdata.errors import CorruptDataError, DatasetNotFoundError, FormatError
from lmdata.formats._span_index import SpanIndex, load_span_index
from lmdata.formats.modalities.layout import (
    HEADER_SIZE,
    PbinHeader,
    parse_header,
)
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import resolve

if TYPE_CHECKING:  # imported where used: `validate` reads the index without a sidecar
    from lmdata.formats.modalities import sidecar

# modalities' merge_packed_data shifts the index of every later file by (data_len - 12) instead
# of data_len, so each file boundary shows up as an overlap of 12 bytes (24 after an empty file).
ORIGIN_MERGE_SHIFT = HEADER_SIZE


def _open_store(path: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> Any:
    """(store, key, shown path) of a ``.pbin``: a local Path is shown as a Path, a URL as is."""
    store, key = resolve(path, storage_options)
    if not store.exists(key):
        raise DatasetNotFoundError("no such file or object", path=store.url(key))
    if store.is_dir(key):
        raise FormatError("a .pbin dataset is one file, not a directory", path=store.url(key))
    shown: Path | str = Path(key) if store.can_mmap else store.url(key)
    return store, key, shown


def read_header(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> PbinHeader:
    """The checked header of the ``.pbin`` at ``path`` (one ranged read, no mapping)."""
    store, key, shown = _open_store(path, storage_options)
    return parse_header(store.read_range(key, 0, HEADER_SIZE), store.size(key), shown)


class PbinData:
    """The header and the token data of a ``.pbin``, reached through its store: memory-mapped
    on local disk, fetched by ranges on object stores.

    Picklable: the mapping is dropped and re-created in the receiving process.
    """

    def __init__(
        self, path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> None:
        self.store, self.key, self.path = _open_store(path, storage_options)
        size = self.store.size(self.key)
        self.header = parse_header(self.store.read_range(self.key, 0, HEADER_SIZE), size, self.path)
        self._tokens: np.ndarray | None = None

    @property
    def token_width(self) -> int:
        return self.header.token_width

    @property
    def dtype(self) -> np.dtype:
        return self.header.dtype

    @property
    def mapped(self) -> bool:
        """True if token reads are slices of a memory map (local files)."""
        return bool(self.store.can_mmap)

    @property
    def tokens(self) -> np.ndarray:
        """The whole data segment as a read-only array of the stored dtype (zero copy on local
        disk; fetched whole, once, from object stores)."""
        if self._tokens is None:
            h = self.header
            buf = self.store.mmap(self.key) if h.data_len else None
            if h.data_len == 0:
                self._tokens = np.zeros(0, dtype=h.dtype)
            elif buf is not None:
                self._tokens = np.frombuffer(
                    buf, dtype=h.dtype, count=h.num_tokens, offset=HEADER_SIZE
                )
            else:
                raw = self.store.read_range(self.key, HEADER_SIZE, h.num_tokens * h.token_width)
                self._tokens = self._array(raw, h.num_tokens)
        return self._tokens

    def _array(self, raw: bytes, count: int) -> np.ndarray:
        if len(raw) < count * self.token_width:
            raise CorruptDataError(
                f"the token data ends early ({len(raw)} bytes where {count} tokens were "
                "expected); was the file truncated?",
                path=self.path,
            )
        return np.frombuffer(raw, dtype=self.dtype, count=count)

    def read_tokens(self, spans: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """Tokens ``a:b`` of the data segment for each ``(a, b)``, as fresh arrays: slices of
        the mapping locally, ranged reads (merged when close) on object stores."""
        if self.mapped or self._tokens is not None:
            t = self.tokens
            return [np.array(t[a:b]) for a, b in spans]
        w = self.token_width
        raws = self.store.read_ranges(
            self.key, [(HEADER_SIZE + a * w, (b - a) * w) for a, b in spans]
        )
        return [self._array(r, b - a).copy() for r, (a, b) in zip(raws, spans, strict=True)]

    def read_span(self, a: int, b: int) -> np.ndarray:
        """Tokens ``a:b`` of the data segment as a fresh array: one ranged read on object
        stores (a random record read; a range-cache hit when warm), else a slice."""
        if self._tokens is None and not self.store.can_mmap:
            h = self.header
            n = (b - a) * h.token_width
            raw = self.store.read_range(self.key, HEADER_SIZE + a * h.token_width, n)
            if len(raw) < n:
                return self._array(raw, b - a)  # raises: the data ends early
            return np.frombuffer(raw, h.dtype).copy()
        return np.array(self.tokens[a:b])

    def read_index_bytes(self) -> bytes:
        h = self.header
        return self.store.read_range(self.key, h.index_start, h.file_size - h.index_start)

    def close(self) -> None:
        self._tokens = None  # the mapping closes when the last array viewing it goes

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tokens"] = None
        return state


def undo_origin_merge_shift(index: SpanIndex, data_len: int) -> SpanIndex | None:
    """The corrected index of a file written by modalities' merge, or None if it is not one.

    Only the exact pattern the origin's bug produces is repaired: every discontinuity is an
    overlap of a multiple of 12 bytes, and shifting by them ends the index at ``data_len``.
    """
    if len(index) == 0:
        return None
    offs, ends = index.offsets, index.ends
    overlap = ends[:-1] - offs[1:]
    breaks = overlap != 0
    if offs[0] > 0 or (-offs[0]) % ORIGIN_MERGE_SHIFT or (offs[0] == 0 and not breaks.any()):
        return None
    if (overlap[breaks] < 0).any() or (overlap[breaks] % ORIGIN_MERGE_SHIFT).any():
        return None
    shift = np.concatenate([[-offs[0]], -offs[0] + np.cumsum(overlap)])
    fixed = SpanIndex(offs + shift, index.lengths.copy())
    if fixed.offsets[0] != 0 or int(fixed.ends[-1]) != data_len:
        return None
    return fixed


def check_spans(index: SpanIndex, header: PbinHeader, path: Path) -> None:
    """Every span aligned to the token width and inside the data segment, or CorruptDataError."""
    w = header.token_width
    offs, lens = index.offsets, index.lengths
    bad = np.flatnonzero((offs % w != 0) | (lens % w != 0))
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(
            f"document {i} has offset {offs[i]} and length {lens[i]} bytes, which are not "
            f"multiples of the token width {w}; run `lmdata validate`",
            path=path,
            position="index",
        )
    bad = np.flatnonzero((offs < 0) | (offs + lens > header.data_len))
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(
            f"document {i} spans bytes {offs[i]}..{offs[i] + lens[i]}, outside the "
            f"{header.data_len} bytes of token data; run `lmdata validate`",
            path=path,
            position="index",
        )


def _read_index(
    data: PbinData, allow_unsafe: bool, repair: bool, raw: bytes | None = None
) -> sidecar.IndexArrays:
    """The checked index of ``data`` from its pickle (repaired when ``repair`` and needed);
    ``raw`` is the index bytes if the caller has read them."""
    from lmdata.formats.modalities import sidecar

    h = data.header
    if raw is None:
        raw = data.read_index_bytes()
    index = load_span_index(raw, path=data.path, where="index", allow_unsafe=allow_unsafe)
    repaired = False
    if repair:
        fixed = undo_origin_merge_shift(index, h.data_len)
        if fixed is not None:
            index, repaired = fixed, True
    check_spans(index, h, data.path)
    return sidecar.from_spans(index.offsets, index.lengths, h.token_width, repaired)


class PackedTokens:
    """A ``.pbin`` file as a token-sequence reader.

    Document ``i`` is its tokens as stored (end-of-document token included), in the stored
    dtype (uint8, uint16 or uint32). Boundaries come from the index, never from EOD tokens.
    Files written by modalities' buggy ``merge_packed_data`` are read with corrected offsets
    (``repaired_origin_merge`` tells); ``repair_origin_merge=False`` reads the index as stored,
    wrong spans included, as modalities itself does.
    """

    format = "modalities"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        allow_unsafe_pickle: bool = False,
        repair_origin_merge: bool = True,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        from lmdata.formats.modalities import sidecar

        self.data = PbinData(path, storage_options)
        self.path = self.data.path

        def build(raw: bytes | None) -> sidecar.IndexArrays:
            return _read_index(self.data, allow_unsafe_pickle, repair_origin_merge, raw)

        # a sidecar holds the repaired index; a trusted (unsafe) pickle is never saved as one
        idx = sidecar.index_arrays(
            self.data,
            build,
            reuse=repair_origin_merge,
            save=repair_origin_merge and not allow_unsafe_pickle,
        )
        self._options = (allow_unsafe_pickle, repair_origin_merge)
        self._use(idx)
        self._max_token_id: int | None = None

    def _use(self, idx: sidecar.IndexArrays) -> None:
        self.repaired_origin_merge = idx.repaired
        self._starts = idx.starts
        self._lens = idx.lengths
        self._boundaries = idx.boundaries
        self.contiguous = idx.contiguous
        self._mapped = (idx.sidecar, idx.digest) if idx.sidecar is not None else None

    def __getstate__(self) -> dict[str, Any]:
        """A mapped index travels as its sidecar's path (the receiver maps it again), not as
        arrays of 24 bytes per document."""
        state = self.__dict__.copy()
        if self._mapped is not None:
            state["_starts"] = state["_lens"] = state["_boundaries"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._starts is None:
            from lmdata.formats.modalities import sidecar

            path, digest = self._mapped
            idx = sidecar.load(path, self.data, digest)  # checked again: it may have changed
            if idx is None:  # gone or replaced: the index itself
                idx = _read_index(self.data, *self._options)
            self._use(idx)

    def __repr__(self) -> str:
        return f"PackedTokens({str(self.path)!r})"

    @property
    def header(self) -> PbinHeader:
        return self.data.header

    @property
    def store(self) -> Any:
        """The store the file is read through (what it pinned at open serves other checks)."""
        return self.data.store

    @property
    def token_width(self) -> int:
        return self.data.token_width

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def tokens(self) -> np.ndarray:
        """The whole token data segment (zero copy), index or not."""
        return self.data.tokens

    @property
    def doc_starts(self) -> np.ndarray:
        """Where each document starts in the data segment, in tokens (int64)."""
        return self._starts

    @property
    def doc_lengths(self) -> np.ndarray:
        """Each document's length in tokens (int64)."""
        return self._lens

    # ---- the TokenSequences protocol -------------------------------------------------------

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def num_tokens(self) -> int:
        return int(self._boundaries[-1])

    @property
    def boundaries(self) -> np.ndarray:
        return self._boundaries

    @property
    def max_token_id(self) -> int:
        """The largest id stored (scans the data once, then cached)."""
        return self.find_max_token_id()

    def find_max_token_id(self, progress: OnProgress | None = None) -> int:
        """:attr:`max_token_id`, reporting the token bytes scanned to ``progress`` (nothing
        when it is cached already)."""
        if self._max_token_id is None:
            t = self.tokens
            tick = Ticker(progress, len(t) * t.itemsize, "info")
            m = 0
            step = 1 << 24
            for lo in range(0, len(t), step):
                block = t[lo : lo + step]
                m = max(m, int(block.max()))
                tick.add(len(block) * t.itemsize)
            self._max_token_id = m
        return self._max_token_id

    def doc_range(self, index: int) -> tuple[int, int]:
        """(start, stop) of document ``index`` in token positions of the data segment."""
        i = normalize_index(index, len(self))
        a = int(self._starts[i])
        return a, a + int(self._lens[i])

    def __getitem__(self, index: int) -> np.ndarray:
        a, b = self.doc_range(index)
        t = self.data._tokens  # the local mapping once made: slice it (the hot path)
        return np.array(t[a:b]) if t is not None else self.data.read_span(a, b)

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        idx = normalize_indices(indices, len(self))
        starts = self._starts[idx]
        stops = starts + self._lens[idx]
        if len(idx) > 1 and bool((starts[1:] == stops[:-1]).all()):
            # documents stored back to back (a sequential read): one read, sliced
            base = int(starts[0])
            block = self.data.read_tokens([(base, int(stops[-1]))])[0]
            rel = zip((starts - base).tolist(), (stops - base).tolist(), strict=True)
            return [block[a:b] for a, b in rel]
        return self.data.read_tokens(list(zip(starts.tolist(), stops.tolist(), strict=True)))

    def __iter__(self) -> Iterator[np.ndarray]:
        block = 4096
        for lo in range(0, len(self), block):
            yield from self.take(np.arange(lo, min(lo + block, len(self))))

    def span(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of the concatenation of the documents in index order."""
        n = self.num_tokens
        if not 0 <= start <= stop <= n:
            raise IndexError(f"span [{start}, {stop}) is outside the {n} tokens")
        if self.contiguous:
            return self.data.read_tokens([(start, stop)])[0]
        # the index is reordered or has gaps: gather the pieces document by document
        b = self._boundaries.astype(np.int64)
        first = int(np.searchsorted(b, start, side="right")) - 1
        out = []
        pos = start
        d = first
        while pos < stop:
            lo, hi = int(b[d]), int(b[d + 1])
            a = int(self._starts[d]) + (pos - lo)
            take = min(stop, hi) - pos
            out.append(self.tokens[a : a + take])
            pos += take
            d += 1
        return np.concatenate(out) if out else np.zeros(0, dtype=self.dtype)

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self.data.close()

    def __enter__(self) -> PackedTokens:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def info(self) -> dict[str, Any]:
        h = self.header
        lens = self._lens
        return {
            "documents": len(self),
            "tokens": self.num_tokens,
            "token_width": h.token_width,
            "dtype": str(h.dtype),
            "max_token_id": self.max_token_id,
            "data_bytes": h.data_len,
            "index_bytes": h.file_size - h.index_start,
            "tokens_outside_documents": h.num_tokens - int(lens.sum()) if self.contiguous else None,
            "longest_document": int(lens.max()) if len(lens) else 0,
            "empty_documents": int((lens == 0).sum()),
            "contiguous_index": self.contiguous,
            "repaired_origin_merge_offsets": self.repaired_origin_merge,
        }
