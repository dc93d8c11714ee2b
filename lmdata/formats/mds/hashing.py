"""Shard hashes as streaming records them: any hashlib name (except shake_*) or xxhash name."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from lmdata.errors import InvalidInputError


def _table() -> dict[str, Callable[[bytes], Any]]:
    import xxhash

    out: dict[str, Callable[[bytes], Any]] = {}
    for algo in hashlib.algorithms_available:
        if hasattr(hashlib, algo) and not algo.startswith("shake_"):
            out[algo] = getattr(hashlib, algo)
    for algo in xxhash.algorithms_available:
        out[algo] = getattr(xxhash, algo)
    return out


_HASHES: dict[str, Callable[[bytes], Any]] | None = None


def algorithms() -> dict[str, Callable[[bytes], Any]]:
    global _HASHES
    if _HASHES is None:
        _HASHES = _table()
    return _HASHES


def is_hash(algo: str) -> bool:
    return algo in algorithms()


def check_hashes(hashes: list[str] | tuple[str, ...] | None) -> list[str]:
    """The list as streaming stores it; it must be sorted, unique and known."""
    hashes = list(hashes or [])
    if hashes != sorted(set(hashes)):
        raise InvalidInputError(
            f"hashes must be unique and sorted (streaming requires it): use {sorted(set(hashes))}"
        )
    for algo in hashes:
        if not is_hash(algo):
            raise InvalidInputError(
                f"unknown hash {algo!r}; use hashlib names (sha1, md5, blake2b, ...) or "
                "xxhash names (xxh64, xxh3_64, xxh128, ...)"
            )
    return hashes


def hexdigest(algo: str, data: bytes | memoryview) -> str:
    return algorithms()[algo](data).hexdigest()
