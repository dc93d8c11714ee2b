"""flat-tokens (MatX seqax): a zarr group with train/validation splits of encoded tokens.

The four verbs every format has: :func:`detect`, :func:`open`, :class:`Writer`, :func:`validate`,
plus :func:`info` for ``lmdata info``.
"""

from __future__ import annotations

import os
from typing import Any

from lmdata.formats.flat_tokens.reader import FlatTokens, dataset_info, dataset_splits, detect
from lmdata.formats.flat_tokens.validate import validate
from lmdata.formats.flat_tokens.writer import Writer

KIND = "tokens"
HAS_SPLITS = True

__all__ = ["KIND", "FlatTokens", "Writer", "detect", "info", "open", "validate"]


def open(path: str | os.PathLike[str], split: str | None = None, **options: Any) -> FlatTokens:
    """The token-sequence reader of one split (``train`` unless ``split`` says otherwise)."""
    return FlatTokens(path, split=split or "train", **options)


def info(path: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    return dataset_info(path, **options)


def splits(path: str | os.PathLike[str]) -> list[str]:
    return dataset_splits(path)
