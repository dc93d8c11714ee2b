"""Shard-level I/O of an Atlas reader: the index, data.bin's size, the zstd dictionaries and
decompressors, and one block's stored and pickled bytes, each checked against the files.

:class:`ShardFiles` is mixed into :class:`lmdata.formats.atlas.reader.Atlas`, which sets the
state it uses (``shards``, ``root``, ``store``, ``max_block_bytes``, ``compression_dict`` and the
per-reader caches ``_names``, ``_index``, ``_sizes``, ``_data_paths``, ``_dict_dir``, ``_dicts``,
``_codecs``, ``_offsets``, ``_local``, ``_lock``).
"""

from __future__ import annotations

import io
from pathlib import PurePath
from typing import Any

import numpy as np
import zstandard

from lmdata.errors import CorruptDataError, LmdataError
from lmdata.formats.atlas import codec
from lmdata.formats.atlas.meta import DICT, INDEX, Strategy, shown

_MAGIC = codec.ZSTD_MAGIC
_UNKNOWN = zstandard.CONTENTSIZE_UNKNOWN
_frame_parameters = zstandard.get_frame_parameters


class ShardFiles:
    """The per-shard file reads of :class:`~lmdata.formats.atlas.reader.Atlas`."""

    shards: Any
    root: Any
    store: Any
    max_block_bytes: int
    compression_dict: Any
    _names: Any
    _index: Any
    _sizes: Any
    _data_paths: Any
    _dict_dir: Any
    _dicts: Any
    _codecs: Any
    _offsets: Any
    _local: Any
    _lock: Any

    def _shown(self, p: PurePath | str) -> PurePath | str:
        """How file ``p`` is named in messages (its URL on an object store)."""
        return shown(self.store, p)

    def _where(self, s: int, b: int | None = None) -> str:
        name = self._names[s]
        return f"shard {name}" if b is None else f"shard {name} block {b}"

    def _shard_index(self, s: int) -> np.ndarray:
        idx = self._index.get(s)
        if idx is not None:
            return idx
        sh = self.shards[s]
        p = sh.folder / INDEX
        idx, _ = self._load_index(s)
        if idx.ndim != 1 or idx.dtype.kind not in "ui":
            raise CorruptDataError(
                f"index.npy must be a 1-D integer array, got {idx.dtype} of shape {idx.shape}",
                path=self._shown(p),
                position=self._where(s),
            )
        if len(idx) != sh.meta.num_blocks + 1:
            raise CorruptDataError(
                f"index.npy has {len(idx)} offsets; {sh.meta.stored_examples} examples in "
                f"blocks of {sh.meta.block_size} need {sh.meta.num_blocks + 1}",
                path=self._shown(p),
                position=self._where(s),
            )
        self._index[s] = idx
        return idx

    def _load_index(self, s: int) -> tuple[np.ndarray, int]:
        """Shard ``s``'s index.npy as stored: its array and the count of bytes after the array
        (numpy and the origin's reader ignore them; validate reports them)."""
        p = self.shards[s].folder / INDEX
        try:
            data = self.store.read(str(p))
            f = io.BytesIO(data)
            idx = np.load(f, allow_pickle=False)  # reads exactly the header and the array
        except (FileNotFoundError, IsADirectoryError):
            raise CorruptDataError(
                "missing index.npy", path=self._shown(p), position=self._where(s)
            ) from None
        except LmdataError:  # the store's own error (a replaced object, a dead server)
            raise
        except Exception as e:  # numpy's header parser raises many kinds (even TokenError)
            raise CorruptDataError(
                f"cannot load index.npy: {type(e).__name__}: {e}",
                path=self._shown(p),
                position=self._where(s),
            ) from None
        if not isinstance(idx, np.ndarray):  # an .npz archive loads as an NpzFile
            raise CorruptDataError(
                f"index.npy is a {type(idx).__name__}, not an .npy array",
                path=self._shown(p),
                position=self._where(s),
            )
        return idx, len(data) - f.tell()

    def _size(self, s: int) -> int:
        """Bytes in shard ``s``'s data.bin (looked up once)."""
        size = self._sizes.get(s)
        if size is None:
            try:
                size = self._sizes[s] = self.store.size(self._data_paths[s])
            except (FileNotFoundError, IsADirectoryError):
                raise CorruptDataError(
                    "missing data.bin",
                    path=self._shown(self._data_paths[s]),
                    position=self._where(s),
                ) from None
        return size

    def _dict_path(self, s: int) -> PurePath:
        shared = self.shards[s].meta.compression_strategy == Strategy.SHARED_DICTIONARY_COMPRESSION
        return ((self._dict_dir or self.root) if shared else self.shards[s].folder) / DICT

    def _dict_for(self, s: int) -> zstandard.ZstdCompressionDict | None:
        strategy = self.shards[s].meta.compression_strategy
        if strategy == Strategy.SHARED_DICTIONARY_COMPRESSION:
            key: Any = "shared"
            p = (self._dict_dir or self.root) / DICT
        elif strategy == Strategy.DICTIONARY_COMPRESSION:
            key = s
            p = self.shards[s].folder / DICT
        else:
            return None
        d = self._dicts.get(key)
        if d is None and key == "shared" and self.compression_dict is not None:
            d = self._dicts[key] = codec.load_dict(self.compression_dict, "compression_dict")
        if d is None:
            try:
                data = self.store.read(str(p))
            except (FileNotFoundError, IsADirectoryError):
                raise CorruptDataError(
                    f"missing zstd_dict.bin, which compression strategy {int(strategy)} needs",
                    path=self._shown(p),
                    position=self._where(s),
                ) from None
            d = codec.load_dict(data, self._where(s))
            self._dicts[key] = d
        return d

    def _decompressor(self, s: int) -> zstandard.ZstdDecompressor:
        """This thread's decompressor for shard ``s`` (instances are not thread-safe)."""
        by_shard = self._local.by_shard
        dctx = by_shard.get(s)
        if dctx is None:
            with self._lock:
                dctx = by_shard[s] = self._new_decompressor(s)
        return dctx

    def _new_decompressor(self, s: int) -> zstandard.ZstdDecompressor:
        # One per thread and dictionary, shared by the shards using that dictionary.
        d = self._dict_for(s)
        key = None if d is None else id(d)
        per_thread = self._local.dctx
        dctx = per_thread.get(key)
        if dctx is None:
            try:
                dctx = zstandard.ZstdDecompressor(dict_data=d)
            except zstandard.ZstdError as e:
                raise CorruptDataError(
                    f"cannot use the zstd dictionary: {e}",
                    path=self._shown(self._dict_path(s)),
                    position=self._where(s),
                ) from None
            per_thread[key] = dctx
        return dctx

    def _block_range(self, s: int, b: int) -> tuple[int, int]:
        """(start, stop) of block ``b`` of shard ``s``, checked against data.bin (caller
        holds the lock)."""
        idx = self._shard_index(s)
        size = self._size(s)
        start, stop = int(idx[b]), int(idx[b + 1])
        if not 0 <= start <= stop:
            raise CorruptDataError(
                f"index.npy offsets {start}..{stop} go backwards",
                path=self._shown(self.shards[s].folder / INDEX),
                position=self._where(s, b),
            )
        if stop > size:
            raise CorruptDataError(
                f"block ends at byte {stop} but data.bin has {size} bytes (cut short)",
                path=self._shown(self._data_paths[s]),
                position=self._where(s, b),
            )
        if stop - start > self.max_block_bytes:
            raise CorruptDataError(
                f"block is {stop - start} bytes, more than max_block_bytes="
                f"{self.max_block_bytes}; open with a larger bound if it is genuine",
                path=self._shown(self._data_paths[s]),
                position=self._where(s, b),
            )
        return start, stop

    def _shard_offsets(self, s: int) -> tuple[list[int], int]:
        """Shard ``s``'s block offsets as plain ints (numpy calls cost µs and release the GIL)
        and its data.bin's size, cached together (a missing data.bin caches neither)."""
        got = self._offsets.get(s)
        if got is None:
            with self._lock:
                got = self._offsets[s] = (self._shard_index(s).tolist(), self._size(s))
        return got

    def _read_raw(self, s: int, b: int) -> bytes:
        """The stored bytes of block ``b`` of shard ``s`` (one ranged read)."""
        got = self._offsets.get(s)
        if got is not None and 0 <= b < len(got[0]) - 1:  # the usual block, checked quickly
            offsets, size = got
            start = offsets[b]
            stop = offsets[b + 1]
            if not 0 <= start <= stop <= size or stop - start > self.max_block_bytes:
                with self._lock:
                    start, stop = self._block_range(s, b)
        else:
            with self._lock:
                start, stop = self._block_range(s, b)
            self._shard_offsets(s)
        raw = self.store.read_range(self._data_paths[s], start, stop - start)
        if len(raw) != stop - start:
            raise CorruptDataError(
                f"read {len(raw)} of the block's {stop - start} bytes",
                path=self._shown(self._data_paths[s]),
                position=self._where(s, b),
            )
        return raw

    def _codec(self, s: int) -> tuple[bool, int, str | None]:
        """(compressed, dictionary id, dictionary path) of shard ``s``, worked out once."""
        c = self._codecs.get(s)
        if c is None:
            if self.shards[s].meta.compression_strategy == Strategy.NO_COMPRESSION:
                c = (False, 0, None)
            else:
                d = self._dict_for(s)
                dp = str(self._shown(self._dict_path(s)))
                c = (True, 0, None) if d is None else (True, d.dict_id(), dp)
            self._codecs[s] = c
        return c

    def _pickled(self, s: int, b: int, raw: bytes) -> bytes:
        """The pickled bytes of block ``b`` of shard ``s`` from its stored bytes."""
        compressed, dict_id, dict_path = self._codecs.get(s) or self._codec(s)
        if not compressed:
            return raw
        dctx = self._local.by_shard.get(s) or self._decompressor(s)
        # The checks of codec.decompress_block, spelled out for the usual frame (a random read
        # pays this per example); anything unusual goes there for the precise error.
        if raw[:4] == _MAGIC:
            try:
                params = _frame_parameters(raw)
                size = params.content_size
                if (
                    0 <= size <= self.max_block_bytes
                    and size != _UNKNOWN
                    and params.dict_id in (0, dict_id)
                ):
                    out = dctx.decompress(raw)
                    if len(out) == size:
                        return out
            except zstandard.ZstdError:
                pass
        return codec.decompress_block(
            raw,
            dctx,
            self.max_block_bytes,
            self._where(s, b),
            self._shown(self._data_paths[s]),
            dict_id=dict_id,
            dict_path=dict_path,
        )
