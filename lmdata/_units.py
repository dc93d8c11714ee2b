"""Numbers: sizes in binary units for people, byte counts given as options, and the size of
a job's byte ranges."""

from __future__ import annotations

import operator
from typing import Any

from lmdata.errors import InvalidInputError


def human_bytes(n: int) -> str:
    """``n`` bytes as ``512 B``, ``1.5 KiB``, ``3.2 GiB``... (TiB at most)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def byte_count(value: Any, name: str, zero: str) -> int:
    """``value`` (an option such as ``cache_bytes=``) as a count of bytes: any integer type
    (a numpy one too) but a bool, 0 or more; else an InvalidInputError naming the option and
    saying what 0 means (``zero``)."""
    try:
        n = -1 if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = -1
    if n < 0:
        raise InvalidInputError(
            f"{name} must be a whole number of bytes, 0 or more (got {value!r}); 0 {zero}"
        )
    return n


def spread_size(total: int, units: int, least: int, most: int) -> int:
    """Bytes per range for a job of ``total`` splittable bytes: ``total`` over ``units``, so a
    small job still makes about that many units and its workers finish together, but within
    ``[least, most]`` (``most`` where they cross). It depends on the inputs only, never on the
    workers: a resumed job plans the same units with any number of them."""
    return min(most, max(least, -(-total // units)))
