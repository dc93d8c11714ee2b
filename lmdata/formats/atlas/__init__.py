"""atlas (torch-atlas-ds): examples pickled in blocks, blocks in shards, optional zstd.

The verbs every format has: :func:`detect`, :func:`open`, :class:`Writer`, :func:`validate`,
:func:`info`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmdata.formats.atlas.meta import MAX_META_BYTES, Strategy
from lmdata.formats.atlas.reader import Atlas
from lmdata.formats.atlas.validate import info, validate
from lmdata.formats.atlas.writer import Writer

KIND = "records"

__all__ = ["KIND", "Atlas", "Strategy", "Writer", "detect", "info", "open", "validate"]


def detect(path: str | os.PathLike[str]) -> bool:
    """A folder whose meta.json is an Atlas root meta (version, shard_sizes, strategy)."""
    p = Path(path) / "meta.json"
    try:
        if not p.is_file() or p.stat().st_size > MAX_META_BYTES:
            return False
        d = json.loads(p.read_bytes())
    except (OSError, ValueError, UnicodeError):
        return False
    return isinstance(d, dict) and {"version", "shard_sizes", "compression_strategy"} <= d.keys()


def open(path: str | os.PathLike[str], **options: Any) -> Atlas:
    """The records reader of the Atlas dataset (or single shard folder) at ``path``.

    Options: ``allow_unsafe_pickle`` (trust the file), ``max_block_bytes``, ``cache_bytes``.
    """
    return Atlas(path, **options)
