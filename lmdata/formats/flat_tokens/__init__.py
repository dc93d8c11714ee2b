"""flat-tokens (MatX seqax): a zarr group with train/validation splits of encoded tokens.

The four verbs every format has: :func:`detect`, :func:`open`, :class:`Writer`, :func:`validate`,
plus :func:`info` for ``lmdata info``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lmdata.formats.flat_tokens.reader import FlatTokens, detect, split_names
from lmdata.formats.flat_tokens.validate import validate
from lmdata.formats.flat_tokens.writer import Writer
from lmdata.storage import apparent_size, disk_usage

KIND = "tokens"
HAS_SPLITS = True

__all__ = ["KIND", "FlatTokens", "Writer", "detect", "info", "open", "validate"]


def open(path: str | os.PathLike[str], split: str | None = None, **options: Any) -> FlatTokens:
    """The token-sequence reader of one split (``train`` unless ``split`` says otherwise)."""
    return FlatTokens(path, split=split or "train", **options)


def info(path: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    p = Path(path)
    splits = {}
    for s in split_names(p):
        splits[s or p.name] = FlatTokens(p, split=s or None, **options).info()
    return {
        "format": "flat-tokens",
        "path": str(p),
        "splits": splits,
        "bytes_on_disk": disk_usage(p),
        "apparent_bytes": apparent_size(p),
    }


def splits(path: str | os.PathLike[str]) -> list[str]:
    return [s for s in split_names(Path(path)) if s]
