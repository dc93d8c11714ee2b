"""One bounded cache of decoded bytes for the whole process.

Readers used to keep their own caches (decoded zarr chunks, MDS shards, Atlas blocks), so a
DataLoader worker holding several readers held several budgets. Now every reader takes a
:class:`Slot` of this cache: entries are keyed by (slot, key), evicted least-recently-used
against one process-wide budget (``LMDATA_CACHE_BYTES``, or :func:`set_cache_bytes`), and a
slot may be capped lower (a reader's ``cache_bytes=``; 0 keeps nothing).
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from lmdata._units import byte_count

DEFAULT_BUDGET = 512 << 20


def _env_budget() -> int:
    """``LMDATA_CACHE_BYTES`` (a whole number of bytes), or the default; a value that is none
    is warned about (not an error: it is read when lmdata is imported)."""
    raw = os.environ.get("LMDATA_CACHE_BYTES", "").strip()
    if not raw:
        return DEFAULT_BUDGET
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        warnings.warn(
            f"LMDATA_CACHE_BYTES={raw!r} is not a whole number of bytes (0 or more, e.g. "
            f"{64 << 20} for 64 MiB): the default, {DEFAULT_BUDGET} bytes, is used",
            stacklevel=2,
        )
        return DEFAULT_BUDGET
    return n


class ByteCache:
    """An LRU of ``value``s with a declared size each, bounded in total and per slot."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, Hashable], tuple[Any, int]] = OrderedDict()
        # ``lookup((slot, key))``: the entry ``(value, nbytes)`` or None, in one C call (for the
        # hottest paths; like :meth:`peek`, it takes no lock and does not refresh the age)
        self.lookup = self._entries.get
        self._slot_bytes: dict[int, int] = {}
        self._slot_keys: dict[int, OrderedDict[Hashable, None]] = {}
        self._ids = itertools.count(1)
        self._dead: list[int] = []  # slots garbage-collected, dropped at the next put
        # counts removals: a reader holding views of entries drops them when this changes
        self.epoch = 0
        self.total = 0

    def _reset_after_fork(self) -> None:
        self._lock = threading.Lock()

    def slot(self, cap: int | None = None) -> Slot:
        """A new namespace; ``cap`` bounds its bytes below the budget (None: the budget)."""
        return Slot(self, next(self._ids), cap)

    def get(self, slot: int, key: Hashable) -> Any:
        e = self._entries.get((slot, key))
        if e is None:
            return None
        with self._lock:
            if (slot, key) in self._entries:
                self._entries.move_to_end((slot, key))
                self._slot_keys[slot].move_to_end(key)
        return e[0]

    def peek(self, slot: int, key: Hashable) -> Any:
        """Like :meth:`get` without refreshing the entry's age (no lock: for hot paths, where
        first-in-first-out eviction is good enough)."""
        e = self._entries.get((slot, key))
        return None if e is None else e[0]

    def put(self, slot: int, key: Hashable, value: Any, nbytes: int, cap: int | None) -> bool:
        """Keep ``value``; False (nothing kept) if it alone exceeds the budget or the cap."""
        limit = self.budget if cap is None else min(cap, self.budget)
        if nbytes > limit:
            return False
        k = (slot, key)
        with self._lock:
            while self._dead:
                self._drop(self._dead.pop())
            self._pop(k)
            keys = self._slot_keys.setdefault(slot, OrderedDict())
            while cap is not None and self._slot_bytes.get(slot, 0) + nbytes > limit and keys:
                self._pop((slot, next(iter(keys))))
            while self.total + nbytes > self.budget and self._entries:
                self._pop(next(iter(self._entries)))
            self._entries[k] = (value, nbytes)
            keys = self._slot_keys.setdefault(slot, OrderedDict())
            keys[key] = None
            self._slot_bytes[slot] = self._slot_bytes.get(slot, 0) + nbytes
            self.total += nbytes
        return True

    def pop(self, slot: int, key: Hashable) -> Any:
        with self._lock:
            return self._pop((slot, key))

    def _pop(self, k: tuple[int, Hashable]) -> Any:
        e = self._entries.pop(k, None)
        if e is None:
            return None
        self.epoch += 1
        slot, key = k
        self.total -= e[1]
        self._slot_bytes[slot] -= e[1]
        keys = self._slot_keys[slot]
        keys.pop(key, None)
        if not keys:
            del self._slot_keys[slot]
            del self._slot_bytes[slot]
        return e[0]

    def drop(self, slot: int) -> None:
        """Forget every entry of ``slot``."""
        with self._lock:
            self._drop(slot)

    def _drop(self, slot: int) -> None:
        for key in list(self._slot_keys.get(slot, ())):
            self._pop((slot, key))

    def slot_bytes(self, slot: int) -> int:
        return self._slot_bytes.get(slot, 0)

    def resize(self, budget: int) -> None:
        with self._lock:
            self.budget = max(0, budget)
            while self.total > self.budget and self._entries:
                self._pop(next(iter(self._entries)))


class Slot:
    """One reader's namespace in a :class:`ByteCache`. Pickling gives a fresh, empty slot of the
    same cap in the receiving process (caches are never shipped between processes).

    The entry put last is also kept outside the budget, whatever its size and the cap: a reader
    reading on in its current shard, chunk or block never decodes it again per record (what
    the origin tools do too), even with ``cache_bytes=0`` or a budget below one entry.
    """

    def __init__(self, cache: ByteCache, ident: int, cap: int | None) -> None:
        self.cache = cache
        self.ident = ident
        self.cap = cap
        self._last: tuple[Hashable, Any] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (new_slot, (self.cap,))

    def _from_last(self, key: Hashable) -> Any:
        last = self._last  # one read: another thread may replace it
        return last[1] if last is not None and last[0] == key else None

    def get(self, key: Hashable) -> Any:
        got = self.cache.get(self.ident, key)
        return self._from_last(key) if got is None else got

    def peek(self, key: Hashable) -> Any:
        e = self.cache.lookup((self.ident, key))
        return self._from_last(key) if e is None else e[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> bool:
        self._last = (key, value)
        if self.cap == 0:
            return False
        return self.cache.put(self.ident, key, value, nbytes, self.cap)

    def pop(self, key: Hashable) -> Any:
        if self._from_last(key) is not None:
            self._last = None
        return self.cache.pop(self.ident, key)

    def clear(self) -> None:
        self._last = None
        self.cache.drop(self.ident)

    @property
    def nbytes(self) -> int:
        return self.cache.slot_bytes(self.ident)

    def __len__(self) -> int:
        return len(self.cache._slot_keys.get(self.ident, ()))

    def __del__(self) -> None:
        # no lock here: the collector may run this inside a put holding it
        self.cache._dead.append(self.ident)


CACHE = ByteCache(_env_budget())
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=CACHE._reset_after_fork)


def new_slot(cap: int | None = None) -> Slot:
    """A namespace in the process-wide cache (``cap``: this reader's limit, its
    ``cache_bytes=``; 0 = no caching). InvalidInputError for a cap that is no byte count."""
    if cap is None:
        return CACHE.slot(None)
    return CACHE.slot(byte_count(cap, "cache_bytes", "keeps nothing between reads"))


def set_cache_bytes(budget: int) -> None:
    """Set the process-wide cache budget in bytes (evicting down to it at once; 0 caches
    nothing). InvalidInputError for a budget that is no byte count."""
    CACHE.resize(byte_count(budget, "the cache budget", "caches nothing"))


def cache_bytes() -> tuple[int, int]:
    """(bytes held, budget) of the process-wide cache."""
    return CACHE.total, CACHE.budget
