"""Reading flat-tokens datasets (MatX seqax): one split as a token-sequence reader."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import CorruptDataError, FormatError
from lmdata.formats.flat_tokens._zarr import DEFAULT_CACHE_BYTES, ZArray, node_attrs, node_kind
from lmdata.protocols import normalize_index, normalize_indices
from lmdata.storage import require_exists

SPLITS = ("train", "validation")
# The spec's example block calls the array "tokens"; every tool writes "encoded_tokens".
TOKEN_ARRAY_NAMES = ("encoded_tokens", "tokens")
MAX_TOKEN_ID = 2**31 - 1


def find_token_array(split_dir: Path) -> Path | None:
    for name in TOKEN_ARRAY_NAMES:
        if node_kind(split_dir / name) is not None:
            return split_dir / name
    return None


def is_split_dir(path: Path) -> bool:
    return find_token_array(path) is not None and node_kind(path / "seq_starts") is not None


def detect(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    if not p.is_dir():
        return False
    try:
        if is_split_dir(p):
            return True
        return node_kind(p) is not None and any(is_split_dir(p / s) for s in SPLITS)
    except (CorruptDataError, OSError):
        return False


def split_names(path: Path) -> list[str]:
    """The splits present under a dataset root (or ``[""]`` when ``path`` is one split)."""
    if is_split_dir(path):
        return [""]
    return [s for s in SPLITS if is_split_dir(path / s)]


def resolve_split(path: Path, split: str | None) -> Path:
    if is_split_dir(path):
        return path
    split = split or "train"
    if not (path / split).is_dir():
        raise FormatError(
            f"no split {split!r}; this dataset has: {', '.join(split_names(path)) or 'none'}",
            path=path,
        )
    if not is_split_dir(path / split):
        raise FormatError(
            f"split {split!r} lacks encoded_tokens or seq_starts arrays", path=path / split
        )
    return path / split


def read_max_token_id(split_dir: Path) -> int:
    attrs = node_attrs(split_dir)
    m = attrs.get("max_token_id")
    if m is None:
        raise FormatError(
            "missing attribute max_token_id; `lmdata validate` explains, a re-write fixes it",
            path=split_dir,
        )
    if not isinstance(m, int) or isinstance(m, bool) or not 0 <= m <= MAX_TOKEN_ID:
        raise FormatError(f"max_token_id {m!r} is not an integer in [0, 2^31-1]", path=split_dir)
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
    ) -> None:
        root = require_exists(path)
        self.root = root
        self.dir = resolve_split(root, split)
        self.split = self.dir.name if self.dir != root else (split or "")
        token_dir = find_token_array(self.dir)
        assert token_dir is not None
        self.tokens = ZArray(token_dir, cache_bytes)
        self.seq_starts = ZArray(self.dir / "seq_starts", max(cache_bytes // 8, 1 << 20))
        self._max_token_id = read_max_token_id(self.dir)
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

    def __repr__(self) -> str:
        return f"FlatTokens({str(self.root)!r}, split={self.split!r})"

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
        return [self.tokens.read(*self._bounds(int(i))) >> 1 for i in idx]

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

    def packed_rows(self, rows: Sequence[int] | np.ndarray, seq_len: int) -> np.ndarray:
        """Encoded packed rows: row ``r`` is tokens ``r*seq_len:(r+1)*seq_len`` (one read)."""
        idx = normalize_indices(rows, self.num_packed_rows(seq_len))
        return self.tokens.gather(idx * seq_len, seq_len)

    def encoded_windows(self, starts: Sequence[int] | np.ndarray, length: int) -> np.ndarray:
        """Stored values ``tokens[s:s+length]`` for each ``s`` in ``starts``, shape (n, length).

        Reads only token chunks (never ``seq_starts``): packed and EOS-window loading.
        """
        st = np.asarray(starts, dtype=np.int64).reshape(-1)
        if len(st) and (int(st.min()) < 0 or int(st.max()) + length > self.num_tokens):
            raise IndexError(
                f"a window of {length} tokens at {int(st.max())} or {int(st.min())} is outside "
                f"the {self.num_tokens} tokens"
            )
        return self.tokens.gather(st, length)

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

    def close(self) -> None:
        """Drop cached chunks; the reader reopens what it needs if used again."""
        for arr in (self.tokens, self.seq_starts):
            close = getattr(arr, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> FlatTokens:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
