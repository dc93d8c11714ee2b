"""flat-tokens (MatX seqax): a zarr group with train/validation splits of encoded tokens.

Exports :data:`SPEC` (the registry's entry) and the verbs behind it: :func:`detect`,
:func:`open`, :class:`Writer`, :func:`validate`, :func:`info`.
"""

from __future__ import annotations

import os
from typing import Any

from lmdata.formats._spec import FormatSpec, TokenSink, TokenTarget, detector
from lmdata.formats.flat_tokens.reader import (
    SPLITS,
    FlatTokens,
    dataset_info,
    dataset_splits,
    detect,
)
from lmdata.formats.flat_tokens.validate import validate
from lmdata.formats.flat_tokens.writer import Writer

__all__ = ["SPEC", "FlatTokens", "Writer", "detect", "info", "open", "validate"]


def open(path: str | os.PathLike[str], split: str | None = None, **options: Any) -> FlatTokens:
    """The token-sequence reader of one split (``train`` unless ``split`` says otherwise)."""
    return FlatTokens(path, split=split or "train", **options)


def info(path: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    return dataset_info(path, **options)


def splits(path: str | os.PathLike[str]) -> list[str]:
    return dataset_splits(path)


def _token_sink(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    options: dict[str, Any] | None = None,
) -> TokenSink:
    # starts are the start bit of each sequence's first token: no EOD, nothing to record
    return Writer(path, overwrite=overwrite, **dict(options or {}))


SPEC = FormatSpec(
    name="flat-tokens",
    kind="tokens",
    summary="token sequences in a zarr group with train/validation splits (MatX seqax)",
    detect=detector(detect, "flat-tokens"),
    open=open,
    writer=Writer,
    validate=validate,
    info=info,
    aliases=("flat_tokens", "flat", "zarr", "seqax"),
    has_splits=True,
    splits=tuple(SPLITS),
    list_splits=splits,
    tokens=TokenTarget(open=_token_sink, options=frozenset({"chunk_tokens", "compression"})),
)
