"""Block codecs: bounded zstd decoding, dictionary training, and compression on several cores.

A block is ``pickle.dumps(list_of_examples)``, optionally one zstd frame of it. The origin's
one-shot ``decompress`` allocates whatever size the frame header declares, so we check the
declared size against a bound before allocating.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import zstandard

from lmdata._pickle import safe_loads
from lmdata.errors import CorruptDataError, InvalidInputError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DICT_MAGIC = b"\x37\xa4\x30\xec"
MAX_BLOCK_BYTES = 1 << 30  # default bound on one decompressed block
MIN_DICT_BLOCKS = 7  # fastCover needs 5 training + 1 test samples at split 0.75 (see research)
# Train on at most this much (the origin trains on every block of the shard, and fastCover
# fails at >= 4 GiB): on 25 MB of JSON-like blocks, 8 MiB trains in 0.4x the time for a
# data.bin 0.13% larger; smaller samples lose more (1 MiB: 2%).
DICT_SAMPLE_BYTES = 8 << 20
PICKLE_PROTOCOL = 4  # the origin's default pickle protocol on Python 3.8-3.13


def dict_size_for(pickled_bytes: int, fraction: float) -> int:
    """The origin's dictionary size: ``max(int(fraction * pickled bytes) + 1, 1024)``."""
    return max(int(fraction * pickled_bytes) + 1, 1024)


def choose_samples(
    lengths: Sequence[int], budget: int = DICT_SAMPLE_BYTES
) -> list[tuple[int, int]]:
    """(block, bytes to use) of the training samples: every block whole when they fit in
    ``budget`` (so the dictionary is the origin's, byte for byte), else an evenly spaced
    subset, each cut to at most ``budget // 8`` bytes so that there are always enough samples.

    Training time grows faster than the sample, so a bounded sample is most of what makes a
    dictionary shard quick to write; it also lets a shard of more than 4 GiB train, where the
    origin's trainer fails on the total size.
    """
    total = sum(lengths)
    if total <= budget:
        return [(i, n) for i, n in enumerate(lengths)]
    cap = max(budget // 8, 1)
    capped = [min(n, cap) for n in lengths]
    stride = max(1, -(-sum(capped) // budget))
    out: list[tuple[int, int]] = []
    used = 0
    for offset in range(stride):  # later passes fill the budget left by a skewed first pass
        for i in range(offset, len(capped), stride):
            if used + capped[i] <= budget:
                out.append((i, capped[i]))
                used += capped[i]
        if used >= budget - cap:
            break
    return sorted(out)


def train_dictionary(
    samples: list[bytes], dict_size: int, level: int, threads: int = 1
) -> bytes | None:
    """A zstd dictionary trained the origin's way, or None when zstd cannot train one.

    With ``threads > 1`` the parameter search runs in parallel with the same d=8/steps=4
    search python-zstandard uses by default, which gives the same dictionary.
    """
    if len(samples) < MIN_DICT_BLOCKS:
        return None
    try:
        if threads > 1:
            d = zstandard.train_dictionary(
                dict_size, samples, level=level, threads=threads, d=8, steps=4
            )
        else:
            d = zstandard.train_dictionary(dict_size, samples, level=level)
    except zstandard.ZstdError:
        return None
    return d.as_bytes()


def load_dict(data: bytes, where: str) -> zstandard.ZstdCompressionDict:
    try:
        return zstandard.ZstdCompressionDict(data)
    except zstandard.ZstdError as e:
        raise CorruptDataError(f"cannot load the zstd dictionary: {e}", position=where) from None


class BlockCompressor:
    """Compresses blocks with one zstd frame each (content size in the header, as the origin's
    reader needs), on ``workers`` threads: python-zstandard releases the GIL while compressing.
    """

    def __init__(self, level: int, dict_data: bytes | None = None, workers: int = 1) -> None:
        if not -(1 << 17) <= level <= zstandard.MAX_COMPRESSION_LEVEL:
            raise InvalidInputError(
                f"compression_level must be at most {zstandard.MAX_COMPRESSION_LEVEL}, got {level}"
            )
        self.level = level
        self.dict = zstandard.ZstdCompressionDict(dict_data) if dict_data is not None else None
        if self.dict is not None:
            self.dict.precompute_compress(level=level)
        self.workers = max(1, workers)
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None

    def _compressor(self) -> zstandard.ZstdCompressor:
        c = getattr(self._local, "c", None)
        if c is None:
            c = zstandard.ZstdCompressor(level=self.level, dict_data=self.dict)
            self._local.c = c
        return c

    def _one(self, raw: bytes) -> bytes:
        return self._compressor().compress(raw)

    def compress_many(self, blocks: Sequence[bytes]) -> list[bytes]:
        if self.workers == 1 or len(blocks) < 2:
            return [self._one(b) for b in blocks]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="atlas-zstd")
        return list(self._pool.map(self._one, blocks))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def decompress_block(
    raw: bytes,
    dctx: zstandard.ZstdDecompressor,
    max_bytes: int,
    where: str,
    path: str,
    dict_id: int = 0,
    dict_path: str | None = None,
) -> bytes:
    """The pickled bytes of one zstd block.

    The frame must declare its content size (the origin's writer and lmdata's always do, and
    the origin cannot read a frame that does not), at most ``max_bytes``, so nothing is
    decompressed before the size is known. A frame that names a dictionary must name
    ``dict_id``, the one loaded from ``dict_path``: decoding with another dictionary yields
    other bytes without any error.
    """
    if raw[:4] != ZSTD_MAGIC:
        raise CorruptDataError(
            "block is not a zstd frame (bad magic); the shard's data.bin or index.npy is damaged",
            path=path,
            position=where,
        )
    try:
        params = zstandard.get_frame_parameters(raw)
    except zstandard.ZstdError as e:
        raise CorruptDataError(f"bad zstd frame header: {e}", path=path, position=where) from None
    declared = params.content_size
    if declared == zstandard.CONTENTSIZE_UNKNOWN or declared < 0:
        raise CorruptDataError(
            "zstd frame does not declare its content size; Atlas writers always declare it "
            "(the origin cannot read such a block), so the block is damaged or foreign",
            path=path,
            position=where,
        )
    if declared > max_bytes:
        raise CorruptDataError(
            f"zstd frame declares {declared} bytes of content, more than max_block_bytes="
            f"{max_bytes}; if the dataset is genuine, open it with a larger max_block_bytes",
            path=path,
            position=where,
        )
    if params.dict_id and params.dict_id != dict_id:
        have = f"zstd_dict.bin has id {dict_id}" if dict_id else "no dictionary is loaded"
        raise CorruptDataError(
            f"block was compressed with zstd dictionary id {params.dict_id}, but {have}; "
            "the dictionary file is damaged or belongs to another dataset",
            path=dict_path or path,
            position=where,
        )
    try:
        out = dctx.decompress(raw)
    except zstandard.ZstdError as e:
        raise CorruptDataError(
            f"cannot decompress block: {e} (a truncated block, or the wrong dictionary)",
            path=path,
            position=where,
        ) from None
    if len(out) != declared:
        raise CorruptDataError(
            f"block decompressed to {len(out)} bytes, header says {declared}",
            path=path,
            position=where,
        )
    return out


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector paused for the duration (left off if the caller had turned it off).

    Unpickling a block allocates hundreds of containers, and a collection triggered among them
    walks every object the program keeps (a loop holding 200k examples spent 3/4 of its decoding
    time there). The allocations still count, so the next collection comes once this is done.
    """
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def unpickle_block(
    data: bytes,
    expected: int,
    where: str,
    path: str,
    allow_unsafe: bool,
    memo_checked: bool = False,
) -> list[Any]:
    """The examples of one block: a pickled list of exactly ``expected`` items (unpickled with
    the collector paused; ``memo_checked``: these bytes passed the memo-bomb walk before)."""
    paused = gc.isenabled()  # paused_gc() spelled out (its generator costs about 3 us a call)
    if paused:
        gc.disable()
    try:
        block = safe_loads(
            data, where=where, path=path, allow_unsafe=allow_unsafe, memo_checked=memo_checked
        )
    finally:
        if paused:
            gc.enable()
    if not isinstance(block, list):
        raise CorruptDataError(
            f"block holds a pickled {type(block).__name__}, not the list of examples Atlas stores",
            path=path,
            position=where,
        )
    if len(block) != expected:
        raise CorruptDataError(
            f"block holds {len(block)} examples, the shard's meta.json implies {expected}",
            path=path,
            position=where,
        )
    return block


class _NotingPickler(pickle.Pickler):
    """A pickler that notes whether any object went past the built-in types: the C pickler
    asks ``reducer_override`` only about objects that are not None, bool, int, float, str,
    bytes, bytearray, list, tuple, dict, set or frozenset of exactly those types."""

    reduced = False

    def reducer_override(self, obj: Any) -> Any:
        self.reduced = True
        return NotImplemented  # pickle it as pickle.dumps would


def pickle_examples(block: list[Any], protocol: int) -> tuple[bytes, bool]:
    """(the bytes ``pickle.dumps(block, protocol=protocol)`` gives, whether it holds only
    built-in types). A pickle of built-in types names no global beyond the readers' allow-list
    and, made here, no stray memo slot, so the readers' checks would pass it: the writer can
    skip unpickling it to find out (numpy arrays, complex numbers and the like still are)."""
    f = io.BytesIO()
    p = _NotingPickler(f, protocol)
    p.dump(block)
    return f.getvalue(), p.reduced is False


def batched(items: Iterable[bytes], max_bytes: int, max_count: int) -> Iterable[list[bytes]]:
    """Groups of consecutive items of at most ``max_bytes`` (or one item) and ``max_count``."""
    batch: list[bytes] = []
    size = 0
    for it in items:
        batch.append(it)
        size += len(it)
        if size >= max_bytes or len(batch) >= max_count:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
