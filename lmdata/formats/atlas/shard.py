"""One Atlas shard being written: blocks pickled, checked, compressed (or spilled to disk
until a dictionary is trained), then data.bin, index.npy and meta.json."""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from lmdata._pickle import safe_loads
from lmdata.errors import InvalidInputError, LmdataError
from lmdata.formats.atlas import codec
from lmdata.formats.atlas.meta import (
    DATA,
    DICT,
    INDEX,
    META,
    ShardMeta,
    Strategy,
    index_dtype,
    replace_bytes,
)

SPILL = ".pickled-blocks.tmp"  # strategy-3 shards keep raw blocks here until close
_BATCH_BYTES = 8 << 20  # compress this much at a time across the worker threads


class ShardWriter:
    """One shard folder. ``train`` says whether to train this shard's own dictionary at close
    (strategy 3, and shard 0 of a new strategy-2 dataset); otherwise blocks stream to data.bin
    compressed with ``compressor`` (None: stored raw)."""

    def __init__(
        self,
        folder: Path,
        *,
        block_size: int,
        strategy: Strategy,
        level: int,
        dict_fraction: float,
        compressor: codec.BlockCompressor | None,
        train: bool,
        workers: int,
        dict_sample_bytes: int,
        protocol: int,
        allow_unsafe_pickle: bool = False,
        open_data: Callable[[Path], BinaryIO] | None = None,
    ) -> None:
        folder.mkdir()
        # how data.bin is opened (the dataset's manifest hashes it as it is written)
        self._open_data = open_data or (lambda p: open(p, "wb"))
        self.folder = folder
        self.block_size = block_size
        self.strategy = strategy
        self.level = level
        self.dict_fraction = dict_fraction
        self.compressor = compressor
        self.train = train
        self.workers = workers
        self.dict_sample_bytes = dict_sample_bytes
        self.protocol = protocol
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.count = 0
        self.block: list[Any] = []
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.offsets = [0]
        self.raw_lengths: list[int] = []
        self._data: Any = None  # data.bin (or the spill file when training), opened lazily

    def add(self, example: Any) -> None:
        self.block.append(example)
        self.count += 1
        if len(self.block) == self.block_size:
            self._emit()

    def _emit(self) -> None:
        try:
            raw, builtin = codec.pickle_examples(self.block, self.protocol)
        except Exception as e:  # pickle raises many kinds; name the example
            raise InvalidInputError(
                f"cannot pickle example(s) {self.count - len(self.block)}..{self.count - 1} "
                f"of shard {self.folder.name}: {type(e).__name__}: {e}"
            ) from e
        if not (self.allow_unsafe_pickle or builtin):
            self._check_plain(raw)
        self.block = []
        self.raw_lengths.append(len(raw))
        if self._data is None:
            if self.train:
                self._data = open(self.folder / SPILL, "wb")
            else:
                self._data = self._open_data(self.folder / DATA)
        if self.train:
            self._data.write(raw)
            return
        self.pending.append(raw)
        self.pending_bytes += len(raw)
        if self.pending_bytes >= _BATCH_BYTES:
            self._flush_pending()

    def _check_plain(self, raw: bytes) -> None:
        """Refuse a block the readers would refuse by default: run the readers' allow-list
        unpickler on it, and on failure find and name the first offending example."""
        try:
            with codec.paused_gc():  # the objects are dropped at once; see paused_gc
                safe_loads(raw)
            return
        except LmdataError as e:
            problem = e
        first = self.count - len(self.block)
        for k, example in enumerate(self.block):
            try:
                safe_loads(pickle.dumps(example, protocol=self.protocol))
            except LmdataError as e:
                first, problem = first + k, e
                break
        m = re.search(r"refers to (\S+), which", str(problem))
        what = f"a {m.group(1)}" if m else f"data the readers refuse ({problem})"
        raise InvalidInputError(
            f"example {first} of shard {self.folder.name} holds {what}, which is not plain "
            "data (dict, list, tuple, set, str, bytes, int, float, complex, None, numpy "
            "arrays and scalars), so readers refuse it unless given allow_unsafe_pickle=True; "
            "convert it (e.g. to str), or pass allow_unsafe_pickle=True to the Writer to store "
            "it anyway"
        )

    def _flush_pending(self) -> None:
        if not self.pending:
            return
        blocks = self.pending
        if self.compressor is not None:
            blocks = self.compressor.compress_many(blocks)
        for b in blocks:
            self._data.write(b)
            self.offsets.append(self.offsets[-1] + len(b))
        self.pending, self.pending_bytes = [], 0

    def _train_and_compress(self) -> tuple[Strategy, bytes | None]:
        """Train on the spilled blocks and compress them into data.bin; fall back to plain
        zstd (strategy 1) below 7 blocks or when zstd cannot train, as the origin does."""
        spill = self.folder / SPILL
        if self._data is not None:
            self._data.close()
            self._data = None
        starts = np.concatenate([[0], np.cumsum(self.raw_lengths, dtype=np.int64)])
        dict_bytes: bytes | None = None
        if len(self.raw_lengths) >= codec.MIN_DICT_BLOCKS:
            picks = codec.choose_samples(self.raw_lengths, self.dict_sample_bytes)
            with open(spill, "rb") as f:
                fd = f.fileno()
                samples = [os.pread(fd, n, int(starts[i])) for i, n in picks]
            size = codec.dict_size_for(int(starts[-1]), self.dict_fraction)
            dict_bytes = codec.train_dictionary(samples, size, self.level, self.workers)
            del samples
        strategy = Strategy.DICTIONARY_COMPRESSION if dict_bytes else Strategy.STANDARD_COMPRESSION
        self.compressor = codec.BlockCompressor(self.level, dict_bytes, self.workers)
        self.train = False
        if self.raw_lengths:
            self._data = self._open_data(self.folder / DATA)
            with open(spill, "rb") as f:
                fd = f.fileno()
                for i, n in enumerate(self.raw_lengths):
                    self.pending.append(os.pread(fd, n, int(starts[i])))
                    self.pending_bytes += n
                    if self.pending_bytes >= _BATCH_BYTES:
                        self._flush_pending()
            self._flush_pending()
            spill.unlink()
        self.compressor.close()
        if dict_bytes is not None:
            (self.folder / DICT).write_bytes(dict_bytes)
        return strategy, dict_bytes

    def close(self) -> ShardMeta:
        """Finish the shard: last partial block, dictionary, data.bin, index.npy, meta last."""
        if self.block:
            self._emit()
        strategy = self.strategy
        if self.train:
            strategy, _ = self._train_and_compress()
        else:
            self._flush_pending()
        if self._data is not None:
            self._data.close()
            self._data = None
        # An empty shard has no data.bin and index [0] (uint8), like the origin's.
        index = np.asarray(self.offsets, dtype=index_dtype(self.offsets[-1]))
        np.save(self.folder / INDEX, index, allow_pickle=False)
        meta = ShardMeta(
            block_size=self.block_size,
            stored_examples=self.count,
            compression_strategy=strategy,
            compression_level=self.level,
            compression_dict_size=self.dict_fraction,
        )
        replace_bytes(self.folder / META, meta.to_json())
        return meta

    def abort(self) -> None:
        if self._data is not None:
            self._data.close()
            self._data = None
        if self.compressor is not None:
            self.compressor.close()
