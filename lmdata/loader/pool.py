"""Recycled batch memory: a block is reused only once nothing can see it any more.

A fresh megabyte per batch costs a page fault per 4 KiB page on first touch (the allocator
returns freed blocks of that size to the OS): more than the whole batch computation on a
virtual machine. Each thread keeps a few blocks per size; a block is handed out again only
when its reference count shows that no array made from it is alive (every numpy view,
``torch.from_numpy`` tensor or memoryview of a batch keeps its block referenced, as anything
sharing memory through the buffer protocol does). A batch the caller still holds, or that
sits in a prefetch queue, is never overwritten.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

KEEP = 6  # blocks kept per thread and size: a prefetch queue plus the batch in use
_LOCAL = threading.local()


def _refs(kept: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(kept[i])


_FREE = _refs([np.empty(1, dtype=np.uint8)], 0)  # a block only the pool holds (calibrated)


def block(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` that no live array shares (contents undefined)."""
    pools: dict[int, list[np.ndarray]] | None = getattr(_LOCAL, "pools", None)
    if pools is None:
        pools = _LOCAL.pools = {}
    kept = pools.get(nbytes)
    if kept is None:
        if len(pools) >= 4:  # another batch shape: forget the old ones
            pools.clear()
        kept = pools[nbytes] = []
    for i in range(len(kept)):
        if _refs(kept, i) == _FREE:
            return kept[i]
    b = np.empty(nbytes, dtype=np.uint8)
    if len(kept) < KEEP:
        kept.append(b)
    return b
