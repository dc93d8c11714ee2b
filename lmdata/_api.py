"""``lmdata.open`` and friends: dispatch to the format modules through the registry."""

from __future__ import annotations

import os
from typing import Any

from lmdata import formats
from lmdata.errors import InvalidInputError
from lmdata.storage import require_exists


def detect(path: str | os.PathLike[str]) -> str:
    """The format name of the dataset at ``path``."""
    return formats.detect(require_exists(path))


def open(
    path: str | os.PathLike[str],
    format: str | None = None,
    split: str | None = None,
    **options: Any,
) -> Any:
    """Open the dataset at ``path`` and return a reader.

    ``format`` skips detection. ``split`` picks a split where the format has them
    (flat-tokens: ``train`` by default, or ``validation``). Other options go to the format's
    reader (for example ``allow_unsafe_pickle=True`` for formats that store pickles).
    """
    p = require_exists(path)
    name = formats.canonical(format) if format else formats.detect(p)
    mod = formats.module(name)
    if split is not None:
        if not getattr(mod, "HAS_SPLITS", False):
            raise InvalidInputError(f"{name} datasets have no splits; drop --split / split=")
        options["split"] = split
    if getattr(mod, "NAMES_SHARE_MODULE", False):
        options.setdefault("format", name)
    return mod.open(p, **options)


def writer(path: str | os.PathLike[str], format: str, **options: Any) -> Any:
    """A new writer of ``format`` at ``path`` (a context manager: ``with lmdata.writer(...)``)."""
    name = formats.canonical(format)
    mod = formats.module(name)
    if getattr(mod, "NAMES_SHARE_MODULE", False):
        options.setdefault("format", name)
    return mod.Writer(path, **options)


def validate(path: str | os.PathLike[str], format: str | None = None, **options: Any) -> list[str]:
    """Every problem found in the dataset at ``path``; an empty list means valid."""
    p = require_exists(path)
    name = formats.canonical(format) if format else formats.detect(p)
    return list(formats.module(name).validate(p, **options))


def info(path: str | os.PathLike[str], format: str | None = None, **options: Any) -> dict[str, Any]:
    """A summary of the dataset at ``path`` (format, counts, sizes, codecs)."""
    p = require_exists(path)
    name = formats.canonical(format) if format else formats.detect(p)
    return formats.module(name).info(p, **options)
