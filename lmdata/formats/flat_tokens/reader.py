"""Reading flat-tokens datasets (MatX seqax): one split as a token-sequence reader."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdata._progress import OnProgress, Ticker
from lmdata.errors import CorruptDataError, DatasetNotFoundError, FormatError
from lmdata.formats.flat_tokens import _windows
from lmdata.formats.flat_tokens._windows import (
    aligned_rows,
    copy_windows,
    window_parts,
    windows_into,
)
from lmdata.formats.flat_tokens._zarr import DEFAULT_CACHE_BYTES, ZArray, node_attrs, node_kind
from lmdata.protocols import Parts, normalize_index, normalize_indices
from lmdata.storage import Store, basename, join, resolve

if TYPE_CHECKING:
    from lmdata.protocols import EncodedTokens, SequenceIndex

SPLITS = ("train", "validation")
# The spec's example block calls the array "tokens"; every tool writes "encoded_tokens".
TOKEN_ARRAY_NAMES = ("encoded_tokens", "tokens")
MAX_TOKEN_ID = 2**31 - 1


def find_token_array(store: Store, split_dir: str) -> str | None:
    for name in TOKEN_ARRAY_NAMES:
        if node_kind(store, join(split_dir, name)) is not None:
            return join(split_dir, name)
    return None


def is_split_dir(store: Store, key: str) -> bool:
    return (
        find_token_array(store, key) is not None
        and node_kind(store, join(key, "seq_starts")) is not None
    )


def split_names(store: Store, key: str) -> list[str]:
    """The splits present under a dataset root (or ``[""]`` when ``key`` is one split)."""
    if is_split_dir(store, key):
        return [""]
    return [s for s in SPLITS if is_split_dir(store, join(key, s))]


def resolve_split(store: Store, key: str, split: str | None) -> str:
    if is_split_dir(store, key):
        return key
    split = split or "train"
    if node_kind(store, key) is None and store.is_dir(join(key, split)):
        # the root group is written last: without it the dataset was never committed
        raise FormatError(
            "not a zarr group (no .zgroup or zarr.json): a write that did not finish, or not "
            "a flat-tokens dataset; `lmdata validate` explains",
            path=store.url(key),
        )
    if not store.is_dir(join(key, split)):
        names = ", ".join(split_names(store, key)) or "none"
        raise FormatError(f"no split {split!r}; this dataset has: {names}", path=store.url(key))
    if not is_split_dir(store, join(key, split)):
        raise FormatError(
            f"split {split!r} lacks encoded_tokens or seq_starts arrays",
            path=store.url(join(key, split)),
        )
    return join(key, split)


def read_max_token_id(store: Store, split_dir: str) -> int:
    attrs = node_attrs(store, split_dir)
    m = attrs.get("max_token_id")
    where = store.url(split_dir)
    if m is None:
        raise FormatError(
            "missing attribute max_token_id; `lmdata validate` explains, a re-write fixes it",
            path=where,
        )
    if not isinstance(m, int) or isinstance(m, bool) or not 0 <= m <= MAX_TOKEN_ID:
        raise FormatError(f"max_token_id {m!r} is not an integer in [0, 2^31-1]", path=where)
    return m


class FlatTokens:
    """One split of a flat-tokens dataset as a token-sequence reader.

    ``r[i]`` is sequence ``i`` decoded (uint32 ids); ``span(a, b)`` the decoded flat tokens
    ``a:b``; ``span_encoded``/``packed_rows`` return the stored values (``id*2 + start bit``),
    which is what the Loader expands into inputs and targets.
    """

    format = "flat-tokens"

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str | None = "train",
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        store, key = resolve(path, storage_options)
        store.snapshot(key)  # what is read later is what is there now (one listing)
        if not store.exists(key):
            raise DatasetNotFoundError("no such file or directory", path=store.url(key))
        self.store = store
        self.key = key
        self.root = store.url(key)
        self.dir = resolve_split(store, key, split)
        self.split = basename(self.dir) if self.dir != key else (split or "")
        token_dir = find_token_array(store, self.dir)
        assert token_dir is not None
        self.tokens = ZArray(store, token_dir, cache_bytes)
        if self.tokens.dtype != np.uint32:
            raise FormatError(
                f"encoded_tokens has dtype {self.tokens.meta.dtype}; the flat-tokens spec allows "
                "only uint32 (id*2 + start bit): write its tokens as uint32",
                path=self.tokens.path,
            )
        starts_cache = min(cache_bytes, max(cache_bytes // 8, 1 << 20))
        # sequence starts are read two at a time: by 64 KiB blocks, cached (one block serves
        # 8192 sequences), where reading tokens fetches exact ranges
        self.seq_starts = ZArray(store, join(self.dir, "seq_starts"), starts_cache, 64 << 10)
        self._max_token_id = read_max_token_id(store, self.dir)
        if len(self.seq_starts) < 1:
            raise CorruptDataError(
                "seq_starts is empty; it must hold at least [0]", path=self.seq_starts.path
            )
        self._check_ends()
        self._boundaries: np.ndarray | None = None

    def _check_ends(self) -> None:
        """seq_starts must run from 0 to the token count: two reads, whatever the size.

        A chunk that was never written reads as the fill value (zarr semantics; seqax leaves the
        only chunk of an empty split unwritten), so missing files are judged by the values they
        stand for: a dataset cut short ends below the token count and is refused here.
        """
        ss, n = self.seq_starts, len(self.seq_starts)
        first, last = int(ss.read(0, 1)[0]), int(ss.read(n - 1, n)[0])
        if first == 0 and last == self.num_tokens:
            self._check_no_hole()
            return
        bad, pos, value, want = (
            ("first", 0, first, 0) if first != 0 else ("last", n - 1, last, self.num_tokens)
        )
        unit = pos // ss.unit if ss.unit else 0
        missing = unit not in set(ss.present_units())
        note = (
            f" (its chunk file does not exist, so it reads as the fill value "
            f"{ss.meta.fill_value}; the dataset is incomplete)"
            if missing
            else ""
        )
        raise CorruptDataError(
            f"the {bad} entry of seq_starts is {value}, must be {want}{note}; "
            "run `lmdata validate`",
            path=ss.path,
            position=f"index {pos}",
        )

    def _check_no_hole(self) -> None:
        """A seq_starts chunk missing between present ones would read as fill values, turning
        its sequences into empty ones: refused (one listing). Only seqax's empty split, whose
        single entry ``[0]`` was never written, is complete without its chunk file."""
        ss = self.seq_starts
        present = set(ss.present_chunks())
        if len(present) == ss.nchunks or (len(ss) == 1 and self.num_tokens == 0):
            return
        missing = sorted(set(range(ss.nchunks)) - present)
        raise CorruptDataError(
            f"seq_starts chunk(s) {missing[:8]} have no file, so their sequence starts would read "
            f"as the fill value {ss.meta.fill_value}: the dataset is incomplete; run "
            "`lmdata validate`",
            path=ss.path,
        )

    def __repr__(self) -> str:
        return f"FlatTokens({self.root!r}, split={self.split!r})"

    def close(self) -> None:
        """Drop cached chunks, maps and open files (the reader reopens them if used again)."""
        self.tokens.close()
        self.seq_starts.close()
        self.store.close()

    # ---- the TokenSequences protocol -------------------------------------------------------

    def __len__(self) -> int:
        return len(self.seq_starts) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def max_token_id(self) -> int:
        return self._max_token_id

    @property
    def boundaries_path(self) -> str:
        """Where :attr:`boundaries` are read from (for errors)."""
        return self.seq_starts.path

    @property
    def boundaries(self) -> np.ndarray:
        """``seq_starts`` as uint64, read once on first use."""
        if self._boundaries is None:
            self._boundaries = self.seq_starts.read(0, len(self.seq_starts)).astype(np.uint64)
        return self._boundaries

    def _bounds(self, i: int) -> tuple[int, int]:
        if self._boundaries is not None:
            a, b = int(self._boundaries[i]), int(self._boundaries[i + 1])
        else:
            pair = self.seq_starts.read(i, i + 2)
            a, b = int(pair[0]), int(pair[1])
        if not 0 <= a <= b <= self.num_tokens:
            raise CorruptDataError(
                f"seq_starts[{i}:{i + 2}] = [{a}, {b}] is not a range inside the "
                f"{self.num_tokens} tokens; run `lmdata validate`",
                path=self.seq_starts.path,
                position=f"index {i}",
            )
        return a, b

    def encoded(self, index: int) -> np.ndarray:
        """Sequence ``index`` as stored (``id*2``, plus 1 on its first token)."""
        i = normalize_index(index, len(self))
        a, b = self._bounds(i)
        return self.tokens.read(a, b)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.encoded(index) >> 1

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        idx = normalize_indices(indices, len(self))
        n = len(idx)
        if n > 1 and int(idx[-1]) - int(idx[0]) == n - 1 and bool((np.diff(idx) == 1).all()):
            # consecutive sequences (convert, a full read): their tokens are one range
            pairs = self.sequence_ranges(idx)
            base = int(pairs[0, 0])
            flat = self.tokens.read(base, int(pairs[-1, 1])) >> 1
            return np.split(flat, (pairs[1:, 0] - base).tolist())
        return [self.tokens.read(*self._bounds(int(i))) >> 1 for i in idx]

    def sequence_ranges(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """(start, stop) of each sequence in ``indices`` within the concatenated tokens, shape
        (n, 2) int64: one gather of two ``seq_starts`` entries per sequence, never the whole
        index (the Loader's truncated unpacked rows read only the tokens they keep)."""
        pairs = None
        tried = (
            self._boundaries is None
            and isinstance(indices, np.ndarray)
            and indices.ndim == 1
            and indices.dtype.kind in "iu"
        )
        if tried:  # the C lookup checks each index inside 0 .. len - 1 (else declines)
            idx = indices
            pairs = _windows.pairs(self.seq_starts, idx)
        if pairs is None:
            idx = normalize_indices(indices, len(self))
            if self._boundaries is not None:
                b = self._boundaries
                pairs = np.stack([b[idx], b[idx + 1]], axis=1)
            else:
                again = not (tried and (idx == indices).all())
                pairs = _windows.pairs(self.seq_starts, idx) if again else None
                if pairs is None:
                    pairs = self.seq_starts.gather(idx, 2)
        a, z = pairs[:, 0], pairs[:, 1]
        bad = (a > z) | (z > self.num_tokens)
        if pairs.dtype.kind == "i":  # (unsigned entries are never negative)
            bad |= a < 0
        if bad.any():
            k = int(np.argmax(bad))
            i = int(idx[k])
            raise CorruptDataError(
                f"seq_starts[{i}:{i + 2}] = [{int(a[k])}, {int(z[k])}] is not a range inside "
                f"the {self.num_tokens} tokens; run `lmdata validate`",
                path=self.seq_starts.path,
                position=f"index {i}",
            )
        return pairs.astype(np.int64)

    def sequence_starts(self, lo: int, hi: int) -> np.ndarray:
        """``seq_starts[lo:hi]`` as int64 (0 <= lo <= hi <= len + 1): one contiguous read of
        the index, never the whole of it (the Loader's bestfit blocks read a few hundred
        entries each); entries outside 0 .. the token count are a CorruptDataError."""
        if not 0 <= lo <= hi <= len(self.seq_starts):
            raise IndexError(f"seq_starts[{lo}:{hi}] is outside its {len(self.seq_starts)} entries")
        got = self.seq_starts.read(lo, hi)
        if len(got) and (int(got.max()) > self.num_tokens or int(got.min()) < 0):
            raise CorruptDataError(
                f"seq_starts[{lo}:{hi}] holds entries outside the {self.num_tokens} tokens; "
                "run `lmdata validate`",
                path=self.seq_starts.path,
                position=f"index {lo}",
            )
        return got.astype(np.int64)

    def __iter__(self) -> Iterator[np.ndarray]:
        block = 1 << 16
        for lo in range(0, len(self), block):
            hi = min(lo + block, len(self))
            starts = self.seq_starts.read(lo, hi + 1).astype(np.int64)
            if (
                starts[0] < 0
                or starts[-1] > self.num_tokens
                or (len(starts) > 1 and (np.diff(starts) < 0).any())
            ):
                raise CorruptDataError(
                    f"seq_starts[{lo}:{hi + 1}] is not a non-decreasing range inside the "
                    f"{self.num_tokens} tokens; run `lmdata validate`",
                    path=self.seq_starts.path,
                    position=f"index {lo}",
                )
            flat = self.tokens.read(int(starts[0]), int(starts[-1])) >> 1
            rel = starts - starts[0]
            for j in range(hi - lo):
                yield flat[rel[j] : rel[j + 1]]

    def span(self, start: int, stop: int) -> np.ndarray:
        return self.tokens.read(start, stop) >> 1

    # ---- extras for training ---------------------------------------------------------------

    def span_encoded(self, start: int, stop: int) -> np.ndarray:
        return self.tokens.read(start, stop)

    def num_packed_rows(self, seq_len: int) -> int:
        return self.num_tokens // seq_len

    def packed_rows(
        self,
        rows: Sequence[int] | np.ndarray,
        seq_len: int,
        *,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Encoded packed rows: row ``r`` is tokens ``r*seq_len:(r+1)*seq_len``, shape
        (len(rows), seq_len), written into ``out`` (C-contiguous uint32) when given."""
        n = self.num_packed_rows(seq_len)
        got = aligned_rows(self.tokens, rows, n, seq_len, out)
        if got is not None:
            return got
        idx = normalize_indices(rows, n)
        return self.tokens.gather(idx * seq_len, seq_len, out=out)

    def encoded_window_parts(
        self, starts: np.ndarray, length: int, *, scale: int = 1
    ) -> Parts | None:
        """Where the stored values ``tokens[s * scale : s * scale + length]`` lie in memory,
        for each ``s`` in ``starts`` (each window inside the tokens, else IndexError; a packed
        row by number with ``scale == length``: :meth:`packed_row_parts`): a byte buffer of its
        mapped or cached chunk and the byte offset of the window in it (the Loader lays
        batches out from there, no gather copy; a Blosc chunk read in part holds only the
        windows asked for, its other bytes unset). None where a window needs
        :meth:`encoded_windows` (it straddles two chunks, a chunk is short, or chunks are read
        by range). The lookup is one C call where built, which also declines windows outside
        the tokens: only then are they checked here, to say which."""
        if scale != 1:
            if scale == length:
                return self.packed_row_parts(starts, length)
            starts = np.asarray(starts, dtype=np.int64) * scale
        if not _windows.in_c():
            self._check_windows(starts, length)
            return window_parts(self.tokens, starts, length, self.num_tokens)
        got = window_parts(self.tokens, starts, length, self.num_tokens)
        if got is None:
            self._check_windows(starts, length)
        return got

    def encoded_windows_into(
        self, layout: Any, starts: np.ndarray, width: int, scale: int, *args: Any
    ) -> bool:
        """The stored windows ``tokens[s * scale : s * scale + width]`` for each ``s`` in
        ``starts`` (int64) handed where they lie to ``layout``, a C layout of ``_native.kernel``
        (``packed_at``, ``eos_at``) that finds them in the mapped chunks and writes its outputs
        ``args`` in one call: a Loader batch with nothing built per row. True when done; False
        (outputs untouched) where a window lies outside the tokens, straddles two chunks or
        lies in a short one, or chunks are read by range: :meth:`encoded_window_parts` and
        :meth:`encoded_windows` then say which, or read it."""
        return windows_into(self.tokens, layout, starts, width, self.num_tokens, scale, args)

    def packed_row_parts(self, rows: np.ndarray, seq_len: int) -> Parts | None:
        """:meth:`encoded_window_parts` of packed rows by number (row ``r`` is tokens
        ``r*seq_len : (r+1)*seq_len``, each below :meth:`num_packed_rows`, else IndexError):
        the row numbers go to the C lookup as they are, which checks each before multiplying
        (no numpy product per batch)."""
        n = self.num_packed_rows(seq_len)
        rows = np.asarray(rows)
        if not rows.size:  # (an empty list is float64 to numpy)
            rows = rows.astype(np.int64)
        if rows.dtype.kind not in "iu":
            raise TypeError(f"rows must be integers, not {rows.dtype}")
        if _windows.in_c():
            got = window_parts(self.tokens, rows, seq_len, n * seq_len, seq_len)
            if got is not None:
                return got
        lst = np.asarray(rows).tolist()
        if lst and (min(lst) < 0 or max(lst) >= n):
            raise IndexError(f"a row of {min(lst)} .. {max(lst)} is outside the {n} rows")
        return self.encoded_window_parts(np.asarray(lst, dtype=np.int64) * seq_len, seq_len)

    def _check_windows(self, starts: Sequence[int] | np.ndarray, length: int) -> None:
        """IndexError unless every window ``s : s + length`` lies inside the tokens."""
        lst = np.asarray(starts).tolist()
        if lst and (min(lst) < 0 or max(lst) + length > self.num_tokens):
            raise IndexError(
                f"a window of {length} tokens at {min(lst)} or {max(lst)} is outside "
                f"the {self.num_tokens} tokens"
            )

    def encoded_windows(
        self,
        starts: Sequence[int] | np.ndarray,
        length: int,
        *,
        scale: int = 1,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Stored values ``tokens[s * scale : s * scale + length]`` for each ``s`` in
        ``starts``, shape (n, length), written into ``out`` (C-contiguous uint32) when given
        (packed rows by number with ``scale == length``: :meth:`packed_rows`).

        Reads only token chunks (never ``seq_starts``): packed and EOS-window loading.
        """
        if scale != 1:
            if scale == length:
                return self.packed_rows(starts, length, out=out)
            starts = np.asarray(starts, dtype=np.int64) * scale
        try:
            st = np.asarray(starts, dtype=np.int64).reshape(-1)
        except OverflowError:  # a Python int past int64: outside, said below
            self._check_windows(starts, length)
            raise
        lst = st.tolist()
        if lst and (min(lst) < 0 or max(lst) + length > self.num_tokens):
            raise IndexError(
                f"a window of {length} tokens at {max(lst)} or {min(lst)} is outside "
                f"the {self.num_tokens} tokens"
            )
        got = copy_windows(self.tokens, lst, length, out)
        return got if got is not None else self.tokens.gather(st, length, out=out)

    def info(self) -> dict[str, Any]:
        return {
            "sequences": len(self),
            "tokens": self.num_tokens,
            "max_token_id": self.max_token_id,
            "encoded_tokens": {
                "zarr_format": self.tokens.meta.zarr_format,
                "chunk_tokens": self.tokens.meta.chunk_len,
                "chunks": self.tokens.nchunks,
                "codecs": self.tokens.meta.codecs,
                "dtype": str(self.tokens.meta.dtype),
            },
            "seq_starts": {
                "chunk_len": self.seq_starts.meta.chunk_len,
                "chunks": self.seq_starts.nchunks,
                "codecs": self.seq_starts.meta.codecs,
                "dtype": str(self.seq_starts.meta.dtype),
            },
        }

    def __enter__(self) -> FlatTokens:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dataset_info(
    path: str | os.PathLike[str],
    *,
    scan: bool = True,
    progress: OnProgress | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``lmdata info`` of a flat-tokens dataset: every split's summary and the bytes stored
    (from the metadata: ``scan`` is accepted, nothing here reads the tokens; ``progress``
    counts the bytes of the splits' arrays summarised)."""
    from lmdata.storage import usage

    store, key = resolve(path, storage_options)
    names = split_names(store, key)
    readers = {
        s or basename(key): FlatTokens(path, split=s or None, storage_options=storage_options)
        for s in names
    }
    sizes = {n: r.num_tokens * 4 + (len(r) + 1) * 8 for n, r in readers.items()}
    tick = Ticker(progress, sum(sizes.values()), "info")
    splits = {}
    for n, r in readers.items():
        splits[n] = r.info()
        tick.add(sizes[n])
    out: dict[str, Any] = {
        "format": "flat-tokens",
        "path": store.url(key),
        "splits": splits,
    }
    used = usage(path, storage_options)
    out["bytes_on_disk"], out["apparent_bytes"] = used.disk, used.apparent
    prov = _provenance(store, key) if names and names != [""] else None  # a root, not a split
    if prov is not None:
        out["provenance"] = prov
    return out


def reader_provenance(reader: FlatTokens) -> dict[str, Any] | None:
    """What made the dataset ``reader`` reads (its root group's attributes)."""
    return _provenance(reader.store, reader.key)


def _provenance(store: Store, key: str) -> dict[str, Any] | None:
    """What made the dataset, from the root group's attributes (see lmdata._provenance)."""
    from lmdata._provenance import KEY, parse

    try:
        return parse(node_attrs(store, key).get(KEY))
    except (CorruptDataError, OSError):
        return None


def dataset_splits(path: str | os.PathLike[str]) -> list[str]:
    store, key = resolve(path)
    return [s for s in split_names(store, key) if s]


if TYPE_CHECKING:  # checked statically: the reader offers the Loader's fast path and index

    def _offers(r: FlatTokens) -> tuple[EncodedTokens, SequenceIndex]:
        return r, r
