"""Numbers for people: sizes in binary units."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``n`` bytes as ``512 B``, ``1.5 KiB``, ``3.2 GiB``... (TiB at most)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
