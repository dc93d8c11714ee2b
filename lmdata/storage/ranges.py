"""Byte ranges an object store has fetched, kept in the process cache: a repeated read costs
no request.

An object store fetches exactly the ranges readers ask for (a random read of a 1 KB record
costs 1 KB, where fixed blocks would cost a block), and keeps each fetched range of up to
:data:`KEEP_MAX` bytes as one segment of its object in a :class:`~lmdata.storage.cache.Slot`
of the process-wide cache, within its budget. A later read is put together from the segments
it overlaps and fetches only the gaps between them (close gaps in one request), so the
segments of an object never overlap and no byte is fetched twice while it is cached.
Segments are evicted least-recently-used with every other entry of the cache.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

from lmdata.storage.base import merge_ranges
from lmdata.storage.cache import new_slot

# bytes charged per segment on top of its data: the cache's own bookkeeping of an entry
SEGMENT_OVERHEAD = 128
# Larger ranges are not kept: they are streaming reads (scans, copies, merges) or whole
# compressed chunks and shards, which the readers decode and keep themselves; keeping them
# would flush the records that random reads come back to, and grow every worker's memory.
KEEP_MAX = 1 << 20

_bisect = bisect.bisect_right
Fetch = Callable[[list[tuple[int, int]]], list[bytes]]


class RangeCache:
    """The fetched ranges of every object of one store (a namespace of the process cache)."""

    def __init__(self, merge_gap: int) -> None:
        self.slot = new_slot()
        self._lookup, self._ident = self.slot.cache.lookup, self.slot.ident  # for the hot path
        self.merge_gap = merge_gap
        self._starts: dict[str, list[int]] = {}  # per object, sorted starts of its segments
        self._eof: dict[str, int] = {}  # object sizes learned from short fetches
        self._indexed = 0  # starts held in _starts (some may have been evicted since)
        self._lock = threading.Lock()

    def _get(self, key: str, start: int) -> bytes | None:
        return self.slot.cache.peek(self.slot.ident, (key, start))  # type: ignore[no-any-return]

    def hit(self, key: str, start: int, length: int) -> bytes | None:
        """``length`` bytes from ``start`` if one cached segment holds them all, else None.
        Takes no lock: a segment found is checked to cover the range, and any segment of the
        object holds that object's bytes, so a concurrent insert can only cause a miss."""
        e = self._lookup((self._ident, (key, start)))
        if e is not None and len(e[0]) >= length:  # a record read again: one lookup
            seg = e[0]
            return seg if len(seg) == length else seg[:length]  # type: ignore[no-any-return]
        starts = self._starts.get(key)
        if not starts:
            return None
        try:  # the last segment starting at or before start (the list may shrink meanwhile)
            a = starts[_bisect(starts, start) - 1]
        except IndexError:
            return None
        if a > start:
            return None
        e = self._lookup((self._ident, (key, a)))
        if e is None or a + len(e[0]) < start + length:
            return None
        seg = e[0]
        if a == start and len(seg) == length:
            return seg  # type: ignore[no-any-return]
        return seg[start - a : start - a + length]  # type: ignore[no-any-return]

    def read(self, key: str, ranges: Sequence[tuple[int, int]], fetch: Fetch) -> list[bytes]:
        """``(start, length)`` ranges of object ``key``: from cached segments where they hold
        the bytes, the rest through ``fetch`` (given disjoint, sorted ``(start, length)``
        groups, it returns their bytes, shorter at the end of the object)."""
        with self._lock:
            plans = [self._cover(key, s, n) for s, n in ranges]
        gaps = [g for plan in plans for g in plan if isinstance(g, tuple)]
        if not gaps:
            return [b"".join(plan) for plan in plans]  # type: ignore[arg-type]
        # disjoint missing intervals, fetched in groups of close ones
        missing = [(a, n) for a, n, _ in merge_ranges(gaps, 0)]
        groups = [(a, n) for a, n, _ in merge_ranges(missing, self.merge_gap)]
        blobs = [bytes(b) for b in fetch(groups)]
        self._keep(key, groups, blobs, missing)
        starts = [a for a, _ in groups]
        out = []
        for plan in plans:
            parts = []
            for p in plan:
                if isinstance(p, tuple):
                    s, n = p
                    j = bisect.bisect_right(starts, s) - 1
                    parts.append(blobs[j][s - starts[j] : s - starts[j] + n])
                else:
                    parts.append(p)
            out.append(parts[0] if len(parts) == 1 else b"".join(parts))
        return out

    def _cover(self, key: str, start: int, length: int) -> list[bytes | tuple[int, int]]:
        """The cached pieces of ``start:start+length`` (bytes) and the gaps between them
        (``(start, length)``), in order. Forgets starts whose segments were evicted."""
        end = start + max(0, length)
        eof = self._eof.get(key)
        if eof is not None:
            end = min(end, eof)
        if end <= start:
            return []
        starts = self._starts.get(key)
        out: list[bytes | tuple[int, int]] = []
        pos = start
        if starts:
            i = max(0, bisect.bisect_right(starts, start) - 1)
            stale = []
            while i < len(starts) and starts[i] < end:
                a = starts[i]
                i += 1
                seg = self._get(key, a)
                if seg is None:
                    stale.append(a)
                    continue
                b = a + len(seg)
                if b <= pos:
                    continue
                if a > pos:
                    out.append((pos, a - pos))
                    pos = a
                stop = min(end, b)
                out.append(seg if pos == a and stop == b else seg[pos - a : stop - a])
                pos = stop
            for a in stale:
                starts.remove(a)
                self._indexed -= 1
        if pos < end:
            out.append((pos, end - pos))
        return out

    def _keep(
        self,
        key: str,
        groups: list[tuple[int, int]],
        blobs: list[bytes],
        missing: list[tuple[int, int]],
    ) -> None:
        """Keep what the fetched ``groups`` hold beyond the segments cached already (the bytes
        between the gaps of a group too: fetched anyway, they cost nothing to keep); of a group
        too large to keep, only the ``missing`` ranges that were asked for."""
        limit = min(KEEP_MAX, self.slot.cache.budget // 4)
        with self._lock:
            for (a, n), blob in zip(groups, blobs, strict=True):
                if len(blob) < n:  # the object ends here
                    self._eof[key] = a + len(blob)
                if len(blob) <= limit:
                    pieces = [(a, len(blob))]
                else:
                    pieces = [(s, m) for s, m in missing if a <= s < a + len(blob) and m <= limit]
                for s0, m0 in pieces:
                    for p in self._cover(key, s0, m0):
                        if isinstance(p, tuple):
                            s, m = p
                            self._put(key, s, blob[s - a : s - a + m], limit)
            if self._indexed > 4 * len(self.slot) + 1024:
                self._prune()

    def _put(self, key: str, start: int, blob: bytes, limit: int) -> None:
        nbytes = len(blob) + SEGMENT_OVERHEAD
        if not blob or nbytes > limit + SEGMENT_OVERHEAD:
            return
        if not self.slot.cache.put(self.slot.ident, (key, start), blob, nbytes, None):
            return
        starts = self._starts.setdefault(key, [])
        i = bisect.bisect_left(starts, start)
        if i == len(starts) or starts[i] != start:
            starts.insert(i, start)
            self._indexed += 1

    def _prune(self) -> None:
        """Drop the starts of evicted segments (an index that only grows would leak)."""
        self._indexed = 0
        for key in list(self._starts):
            live = [a for a in self._starts[key] if self._get(key, a) is not None]
            if live:
                self._starts[key] = live
                self._indexed += len(live)
            else:
                del self._starts[key]
                self._eof.pop(key, None)

    def forget(self) -> None:
        """Drop every segment (the store wrote or removed objects)."""
        with self._lock:
            self.slot.clear()
            self._starts.clear()
            self._eof.clear()
            self._indexed = 0
