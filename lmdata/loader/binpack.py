"""Best-fit decreasing bin packing, the step that packs a bestfit block's documents into rows
(in C by ``lmdata/_native/kernel_bestfit.h`` where built, the same rule in Python otherwise)."""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from lmdata._native import load

_C = load("kernel")  # lmdata/_native/kernel.c; None: the same packing in Python below
_best_fit_c = _C.best_fit if _C is not None else None


def best_fit(sizes: np.ndarray, capacity: int, max_rows: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Best-fit decreasing of items ``sizes`` (each in 1 .. capacity) into at most ``max_rows``
    rows: (rows opened R, starts, members) where row r's items are
    ``members[starts[r]:starts[r+1]]`` (in the order placed) and ``members[starts[R]:]`` are
    the items left over. In C where built (``lmdata/_native/kernel_bestfit.h`` says the rule), else
    the same rule in Python."""
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    n = len(sizes)
    starts = np.empty(n + 1, dtype=np.int64)
    members = np.empty(n, dtype=np.int32)
    if _best_fit_c is not None:
        opened = _best_fit_c(sizes, int(capacity), int(max_rows), starts, members)
        return opened, starts, members
    return _best_fit_py(sizes, int(capacity), int(max_rows), starts, members)


def _best_fit_py(
    sizes: np.ndarray, capacity: int, max_rows: int, starts: np.ndarray, members: np.ndarray
) -> tuple[int, np.ndarray, np.ndarray]:
    """:func:`best_fit` in Python: the same rule, step by step (for builds without C)."""
    n = len(sizes)
    if n and (int(sizes.min()) < 1 or int(sizes.max()) > capacity):
        raise ValueError(f"item sizes must be in 1 .. {capacity}")
    order = np.lexsort((np.arange(n), -sizes)).tolist()
    rooms: list[int] = []  # the rooms some row has, sorted
    stacks: dict[int, list[int]] = {}  # room -> rows with it (the last to reach it on top)
    room: list[int] = []
    row_of = [-1] * n
    size = sizes.tolist()
    for i in order:
        s = size[i]
        k = bisect_left(rooms, s)
        if k < len(rooms):
            r = rooms[k]
            stack = stacks[r]
            b = stack.pop()
            if not stack:
                del stacks[r]
                rooms.pop(k)
        elif len(room) < max_rows:
            b = len(room)
            room.append(capacity)
        else:
            continue
        row_of[i] = b
        room[b] -= s
        r = room[b]
        if r > 0:
            if r in stacks:
                stacks[r].append(b)
            else:
                stacks[r] = [b]
                insort(rooms, r)
    opened = len(room)
    rows = np.asarray(row_of, dtype=np.int64)
    counts = np.bincount(rows[rows >= 0], minlength=opened) if n else np.zeros(0, np.int64)
    starts[: opened + 1] = np.concatenate([[0], np.cumsum(counts)])
    starts[opened + 1 :] = starts[opened]
    placed = [i for i in order if row_of[i] >= 0]
    placed.sort(key=lambda i: row_of[i])  # (stable: each row keeps the order placed)
    members[:] = placed + [i for i in range(n) if row_of[i] < 0]
    return opened, starts, members
