"""Decoded Atlas blocks kept between reads, the two ways a training loop reads them.

In order: each thread keeps the block it is reading of every shard decoded (the origin's
one-block cache per shard) and hands each example out once, so a pass costs one decode per
block and a list lookup per example, whatever the cache budget. At random: a block left with
examples not yet read goes to the process-wide byte cache as one pickle per example, so a
later read unpickles a few hundred bytes instead of the whole block, and the cache holds bytes
rather than millions of objects for the garbage collector to walk. Pickling a block costs about
half a decode, so it is done only while recent reads keep coming back to blocks seen before.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmdata.formats.atlas.ahead import Stream
    from lmdata.storage.cache import Slot

TAKEN = object()  # an example already handed to a caller: a later read makes a fresh one
MAX_HOT = 64  # blocks a thread keeps decoded (one per shard, the least recent dropped)
_CHECKED = 1 << 17  # digests of safely unpickled blocks remembered (about 9 MiB)
_SEEN_KEYS = 1 << 16  # at most this many recent blocks remembered (keys only) for Reuse
KEEP_RATE = 0.25  # pickle blocks for the cache while at least this share of reads reuse
_EMPTY: list[Any] = []
INDEXES = "indexes"  # the cache key of a reader's Indexes
_INDEX_OVERHEAD = 128  # bytes an index costs beyond itself (its key and the dict's entry)
_INDEX_STEP = 64 << 10  # Indexes grows in the cache by this much at a time (at most)
_INDEX_REFRESH = 64  # indexes made between refreshes of the Indexes entry's age


class Hot:
    """A block a thread is reading: its examples (TAKEN once handed out) and the pickles of
    handed-out examples made while blocks were worth keeping."""

    __slots__ = ("block", "items", "kept", "lo")

    def __init__(self, block: int, lo: int, items: list[Any]) -> None:
        self.block = block
        self.lo = lo  # dataset index of its first example
        self.items = items
        self.kept: dict[int, bytes] = {}


class PerThread(threading.local):
    """What one thread keeps: the block it read last (the fast path of ``r[i]``), its current
    block of each shard, blocks read ahead per shard, and its zstd decompressors."""

    def __init__(self) -> None:
        self.last: tuple[int, int, list[Any]] = (0, 0, _EMPTY)  # (lo, examples, items)
        self.nexts: dict[int, int] = {}  # shard -> the index after the last r[i] read there
        self.hot: OrderedDict[int, Hot] = OrderedDict()
        self.ahead: OrderedDict[int, Stream] = OrderedDict()  # shard -> its blocks read ahead
        self.by_shard: dict[int, Any] = {}
        self.dctx: dict[Any, Any] = {}


class Checked:
    """Digests of stored blocks that unpickled safely, so that decoding the same bytes again
    (random reads return to blocks the cache lost; a second epoch) skips the memo-bomb walk.
    Keyed by the stored bytes and shard (whose dictionary is fixed); changed bytes are walked
    again. Inactive (empty digests) where no walk runs. Bounded: forgotten all at once."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self._seen: set[bytes] = set()

    def digest(self, s: int, stored: bytes) -> bytes:
        if not self.active:
            return b""
        return hashlib.blake2b(stored, digest_size=16, key=s.to_bytes(8, "little")).digest()

    def __contains__(self, d: bytes) -> bool:
        return bool(d) and d in self._seen

    def add(self, d: bytes) -> None:
        if d:
            if len(self._seen) >= _CHECKED:
                self._seen.clear()
            self._seen.add(d)


class Reuse:
    """The share of recent block look-ups that the cache could have served: ones that came back
    to a block seen within the last as many blocks as the cache holds (so on a dataset far
    larger than the cache, where kept blocks would be evicted before they are read again, the
    share stays low and nothing is pickled for nothing). A moving average over about 64
    look-ups (single random reads note one in four: the bookkeeping cost 5% of such a read).
    Callers of :meth:`note` hold the reader's lock; :meth:`decoded` needs none (a lost update
    of the average only delays it by one block)."""

    def __init__(self, cache_bytes: int) -> None:
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._block_bytes = 0.0  # average pickled size of a block, learnt from decodes
        self._reach = 1  # blocks the cache holds, by that average
        self.rate = 0.0

    def decoded(self, nbytes: int) -> None:
        """Note the pickled size of a block just decoded."""
        b = self._block_bytes
        b = self._block_bytes = float(nbytes) if b == 0 else b + (nbytes - b) / 64
        self._reach = max(1, min(_SEEN_KEYS, int(self._cache_bytes // max(b, 1.0))))

    def note(self, key: Hashable, cached: bool) -> None:
        known = key in self._seen
        if known:
            self._seen.move_to_end(key)
        else:
            self._seen[key] = None
            while len(self._seen) > self._reach:
                self._seen.popitem(last=False)
        self.rate += ((1.0 if cached or known else 0.0) - self.rate) / 64

    @property
    def worth_keeping(self) -> bool:
        return self.rate >= KEEP_RATE


def pickle_one(item: Any) -> bytes | None:
    """``item`` as the cache keeps it, or None if it cannot be pickled again (objects of a
    trusted file may refuse)."""
    try:
        return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None


def pickle_block(items: list[Any], kept: dict[int, bytes]) -> tuple[list[bytes | None], int]:
    """(one pickle per example, None where none is at hand, total bytes) of a block."""
    out: list[bytes | None] = []
    total = 0
    for j, x in enumerate(items):
        b = kept.get(j) if x is TAKEN else pickle_one(x)
        out.append(b)
        total += len(b) if b is not None else 0
    return out, total


def unpickle(data: bytes) -> Any:
    """An example from the cache's pickle of it (made here from examples already checked)."""
    return pickle.loads(data)


class Indexes:
    """The indexes of blocks (see ``lmdata._pickle.block_index``) a reader keeps for single
    reads, as one entry of its cache: a random read of a block seen before then walks only
    its example's bytes. The entry's size is reserved in steps ahead of use (one cache put per
    step, not one per block, as a put costs a tenth of a read), so every index is counted in
    ``cache_bytes``; when the cache drops the entry, its indexes go with it. Where no step more
    fits, the oldest indexes make room."""

    __slots__ = ("map", "misses", "reserved", "used")

    def __init__(self) -> None:
        self.map: dict[tuple[int, int], bytes] = {}
        self.used = 0  # bytes of the indexes kept, with their entries' overhead
        self.reserved = 0  # bytes the cache counts for this entry
        self.misses = 0  # indexes made since the entry was last refreshed in the cache


def keep_index(slot: Slot, indexes: Indexes | None, key: tuple[int, int], index: bytes) -> None:
    """Keep a block's index in ``slot``'s Indexes entry (a new one if the cache dropped it),
    reserving its bytes a step ahead; the oldest indexes go where no step more fits (callers
    hold the reader's lock)."""
    if indexes is None:
        indexes = Indexes()
    stale = indexes.map.pop(key, None)  # made from other bytes, or by another thread
    if stale is not None:
        indexes.used -= len(stale) + _INDEX_OVERHEAD
    n = len(index) + _INDEX_OVERHEAD
    if indexes.used + n > indexes.reserved:
        cap = slot.cap  # None: the process-wide budget
        want = indexes.reserved + max(n, min(_INDEX_STEP, (cap or 1 << 40) // 16))
        want = want if cap is None else min(want, cap)
        if want >= indexes.used + n and slot.put(INDEXES, indexes, want):
            indexes.reserved, indexes.misses = want, 0
        else:
            old = indexes.map
            while old and indexes.used + n > indexes.reserved:
                indexes.used -= len(old.pop(next(iter(old)))) + _INDEX_OVERHEAD
            if indexes.used + n > indexes.reserved:
                return
    elif indexes.misses >= _INDEX_REFRESH:  # read now and then: the cache keeps it longer
        slot.get(INDEXES)
        indexes.misses = 0
    indexes.misses += 1
    indexes.map[key] = index
    indexes.used += n
