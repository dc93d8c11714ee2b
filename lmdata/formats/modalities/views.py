"""The dataset views modalities trains from, with its sample counts.

- :class:`ContinuousView` is ``packed_mem_map_dataset_continuous``: fixed windows across
  document boundaries; resuming depends on its exact sample count, so it is reproduced.
- :class:`MegatronView` is what ``packed_mem_map_dataset_megatron`` means to do (the origin's
  reads the wrong bytes): the origin's sample count, with windows in the right place.
- :class:`JsonlTokenDocuments` is ``mem_map_dataset``: documents of the raw JSONL, tokenized
  on access, no EOD added.

Every view is picklable and batch-first: ``batch(indices)`` gathers a 2-D array in one go.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.formats.modalities.reader import PackedTokens, PbinData
from lmdata.formats.modalities_jsonl.reader import JsonlDocuments
from lmdata.protocols import normalize_index, normalize_indices


class _Windows:
    """Fixed-size windows ``tokens[start:start+size]`` of a data segment."""

    size: int
    _data: PbinData
    _dtype: np.dtype | None

    def _start(self, i: int) -> int:
        raise NotImplementedError

    def _starts(self, idx: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def _cast(self, a: np.ndarray) -> np.ndarray:
        return a.astype(self._dtype) if self._dtype is not None else np.array(a)

    def __getitem__(self, index: int) -> np.ndarray:
        s = self._start(normalize_index(index, len(self)))
        return self._cast(self._data.tokens[s : s + self.size])

    def batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Samples ``indices`` stacked into a ``(len(indices), size)`` array (one gather)."""
        idx = normalize_indices(indices, len(self))
        starts = self._starts(idx)
        return self._cast(self._data.tokens[starts[:, None] + np.arange(self.size)])

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        return list(self.batch(indices))

    def __iter__(self) -> Iterator[np.ndarray]:
        block = 1024
        for lo in range(0, len(self), block):
            yield from self.batch(np.arange(lo, min(lo + block, len(self))))

    def info(self) -> dict[str, Any]:
        return {"samples": len(self), "sample_tokens": self.size}

    def close(self) -> None:
        """Nothing to release: the view shares its data file's mapping."""


def _data_of(source: str | os.PathLike[str] | PackedTokens | PbinData) -> PbinData:
    if isinstance(source, PackedTokens):
        return source.data
    if isinstance(source, PbinData):
        return source
    return PbinData(source)  # the index is not needed (and not unpickled, as upstream)


class ContinuousView(_Windows):
    """``packed_mem_map_dataset_continuous``: windows over all tokens, ignoring documents.

    With ``reuse_last_target`` (the default) a sample has ``sequence_length + 1`` tokens and
    consecutive samples share one token, so every token is a target once:
    ``len = (T - 1) // sequence_length``. Without it samples are disjoint blocks of
    ``sequence_length`` tokens: ``len = T // sequence_length``. Tail tokens are dropped.
    ``dtype`` casts samples (for example ``np.int64``); the stored dtype by default.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | PackedTokens | PbinData,
        sequence_length: int,
        *,
        reuse_last_target: bool = True,
        dtype: Any = None,
    ) -> None:
        if isinstance(sequence_length, bool) or not isinstance(sequence_length, (int, np.integer)):
            raise InvalidInputError(f"sequence_length must be an integer, got {sequence_length!r}")
        size = int(sequence_length) + 1 if reuse_last_target else int(sequence_length)
        if size < 2:  # the origin's block_size < 2 error
            raise InvalidInputError(
                f"a sample needs at least 2 tokens; sequence_length {sequence_length} with "
                f"reuse_last_target={reuse_last_target} gives {size}"
            )
        self._data = _data_of(source)
        self._dtype = np.dtype(dtype) if dtype is not None else None
        self.sequence_length = int(sequence_length)
        self.reuse_last_target = reuse_last_target
        self.size = size
        self.stride = self.size - 1 if reuse_last_target else self.size
        t = self._data.header.num_tokens
        if t < self.size:
            raise InvalidInputError(
                f"the file has {t} tokens, fewer than one sample of {self.size}; use a "
                "shorter sequence_length",
                path=self._data.path,
            )
        self._len = (t - self.size) // self.stride + 1

    def __len__(self) -> int:
        return self._len

    def _start(self, i: int) -> int:
        return i * self.stride

    def _starts(self, idx: np.ndarray) -> np.ndarray:
        return idx * self.stride


def megatron_starts(doc_lengths: np.ndarray, block_size: int) -> np.ndarray:
    """Sample starts (in tokens) of modalities' Megatron packing, as its code intends.

    Documents are added until they reach ``block_size``: an exact fit closes a sample; an
    overflow closes one and starts the next at the overflowing document (so a sample never
    starts inside a document it did not begin), except that a document longer than a block
    moves the start on by one block from the current start (the origin's rule, kept so that
    sample counts and resume positions agree). The count equals the origin's ``len``.
    """
    starts: list[int] = []
    cur, acc, pos = 0, 0, 0
    for n in doc_lengths.tolist():
        if acc + n < block_size:
            acc += n
        elif acc + n == block_size:
            starts.append(cur)
            cur += block_size
            acc = 0
        else:
            starts.append(cur)
            if n > block_size:
                cur += block_size
                acc = 0
            else:
                cur, acc = pos, n
        pos += n
    return np.asarray(starts, dtype=np.int64)


class MegatronView(_Windows):
    """``packed_mem_map_dataset_megatron`` done right: blocks of ``block_size`` tokens.

    The origin's version starts at the 12-byte header inside an already header-less mapping
    and reads token counts as byte counts; here the same packing decisions index tokens.
    Needs a contiguous index (documents in file order), which every writer produces.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | PackedTokens,
        block_size: int,
        *,
        dtype: Any = None,
    ) -> None:
        if not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise InvalidInputError(f"block_size must be a positive integer, got {block_size!r}")
        reader = source if isinstance(source, PackedTokens) else PackedTokens(source)
        if not reader.contiguous:
            raise InvalidInputError(
                "the index is not contiguous (reordered or with gaps); rewrite the file with "
                "`lmdata convert` first",
                path=reader.path,
            )
        self._data = reader.data
        self._dtype = np.dtype(dtype) if dtype is not None else None
        self.size = int(block_size)
        self._sample_starts = megatron_starts(reader.doc_lengths, self.size)

    def __len__(self) -> int:
        return len(self._sample_starts)

    def _start(self, i: int) -> int:
        return int(self._sample_starts[i])

    def _starts(self, idx: np.ndarray) -> np.ndarray:
        return self._sample_starts[idx]


class JsonlTokenDocuments:
    """``mem_map_dataset``: document ``i`` of a raw JSONL, tokenized when read (no EOD).

    The text is ``record[text_key]``, or the first result of the jq program ``jq_pattern``
    (modalities' ``jq_pattern``, for example ``.text``; needs the ``jq`` package).
    ``tokenizer`` is anything with ``encode_batch(texts) -> list of arrays``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        tokenizer: Any,
        *,
        text_key: str = "text",
        jq_pattern: str | None = None,
        index_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.documents = JsonlDocuments(path, index_path=index_path)
        self.tokenizer = tokenizer
        self.text_key = text_key
        self.jq_pattern = jq_pattern
        self._jq: Any = None

    def __len__(self) -> int:
        return len(self.documents)

    def text(self, index: int, record: Any = None) -> str:
        i = normalize_index(index, len(self))
        rec = self.documents[i] if record is None else record
        if self.jq_pattern is not None:
            if self._jq is None:
                from lmdata._deps import require

                jq = require("jq", f"the jq program jq_pattern {self.jq_pattern!r}")
                self._jq = jq.compile(self.jq_pattern)
            value = self._jq.input_value(rec).first()
            what = f"jq {self.jq_pattern!r} gives"
        else:
            value = rec.get(self.text_key) if isinstance(rec, dict) else None
            what = f"key {self.text_key!r} is"
        if not isinstance(value, str):
            raise InvalidInputError(
                f"document {i}: {what} {type(value).__name__}, not a string; pick the text "
                "field with text_key / jq_pattern",
                path=self.documents.path,
                position=f"byte {int(self.documents.offsets[i])}",
            )
        return value

    def take(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        idx = normalize_indices(indices, len(self))
        recs = self.documents.take(idx)
        texts = [self.text(i, r) for i, r in zip(idx.tolist(), recs, strict=True)]
        return list(self.tokenizer.encode_batch(texts))

    def __getitem__(self, index: int) -> np.ndarray:
        return self.take([index])[0]

    def __iter__(self) -> Iterator[np.ndarray]:
        block = 256
        for lo in range(0, len(self), block):
            yield from self.take(np.arange(lo, min(lo + block, len(self))))

    def info(self) -> dict[str, Any]:
        return {"documents": len(self)}

    def close(self) -> None:
        self.documents.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_jq"] = None
        return state
