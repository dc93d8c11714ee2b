"""Work units and unit functions shared by the executor tests: module-level so workers can
import them by name. Also :func:`rss`, the driver's memory those tests watch."""

from __future__ import annotations

import os
from dataclasses import dataclass

from lmdata import parallel


@dataclass(frozen=True)
class Blob:
    """A unit whose result is `size` bytes that name its index."""

    index: int
    size: int


def make_blob(u: Blob) -> bytes:
    return u.index.to_bytes(4, "little") * (u.size // 4)


def count_docs(n: int) -> int:
    """Reports `n` documents one at a time, then returns `n`."""
    for _ in range(n):
        parallel.report(1)
    return n


def rss() -> int:
    """This process's resident memory in bytes (Linux: reads /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
