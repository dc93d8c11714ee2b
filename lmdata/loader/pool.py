"""Recycled batch memory: a block is reused only once nothing can see it any more.

A fresh megabyte per batch costs a page fault per 4 KiB page on first touch (the allocator
returns freed blocks of that size to the OS): more than the whole batch computation on a
virtual machine. Each thread keeps a few blocks per size; a block is handed out again only
when its reference count shows that no array made from it is alive (every numpy view,
``torch.from_numpy`` tensor or memoryview of a batch keeps its block referenced, as anything
sharing memory through the buffer protocol does). A batch the caller still holds, or that
sits in a prefetch queue, is never overwritten.

A block also keeps the arrays it is carved into for each layout (:func:`carved`): never handed
out themselves, only iterated into fresh views per batch, which costs a fraction of making
the arrays anew (an ``np.ndarray`` over a buffer is about a microsecond each).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable

import numpy as np

KEEP = 6  # blocks kept per thread and size: a prefetch queue plus the batch in use
_LOCAL = threading.local()
_LAYOUTS_KEPT = 4  # carvings kept per block


class _Kept:
    """A pooled block and the arrays carved from it, by layout (each references the block)."""

    __slots__ = ("block", "carved", "free")

    def __init__(self, block: np.ndarray) -> None:
        self.block = block
        self.carved: dict[Hashable, tuple[np.ndarray, ...]] = {}
        self.free = _FREE

    def recount(self) -> None:
        """The reference count the block has when only the pool holds it (and its carvings)."""
        self.free = _FREE + sum(len(c) for c in self.carved.values())


def _refs(k: _Kept) -> int:
    return sys.getrefcount(k.block)


_FREE = 0
_FREE = _refs(_Kept(np.empty(1, dtype=np.uint8)))  # a block only the pool holds (calibrated)


def _take(nbytes: int) -> _Kept:
    """A kept entry of ``nbytes`` whose block no live array shares (or a new one)."""
    pools: dict[int, list[_Kept]] | None = getattr(_LOCAL, "pools", None)
    if pools is None:
        pools = _LOCAL.pools = {}
    kept = pools.get(nbytes)
    if kept is None:
        if len(pools) >= 4:  # another batch shape: forget the old ones
            pools.clear()
        kept = pools[nbytes] = []
    for k in kept:
        if _refs(k) == k.free:
            return k
    k = _Kept(np.empty(nbytes, dtype=np.uint8))
    if len(kept) < KEEP:
        kept.append(k)
    return k


def block(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` that no live array shares (contents undefined)."""
    return _take(nbytes).block


def carved(
    nbytes: int, layout: Hashable, carve: Callable[[np.ndarray], tuple[np.ndarray, ...]]
) -> tuple[np.ndarray, ...]:
    """``carve(block)`` of a block of ``nbytes`` that no live array shares, made once per
    block and layout: arrays over the block that the caller iterates into fresh views and
    never hands out (a caller could reshape an array in place; its views are its own)."""
    k = _take(nbytes)
    got = k.carved.get(layout)
    if got is None:
        if len(k.carved) >= _LAYOUTS_KEPT:
            k.carved.clear()
        got = k.carved[layout] = carve(k.block)
        k.recount()
    return got
