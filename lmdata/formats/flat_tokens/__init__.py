"""flat-tokens (MatX seqax): a zarr group with train/validation splits of encoded tokens.

Exports :data:`SPEC` (the registry's entry) and the verbs behind it: :func:`detect`,
:func:`open`, :class:`Writer`, :func:`validate`, :func:`info`. The reader, writer and
validator are imported on first use: detecting the format lists a folder or two.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lmdata._lazy import lazy_exports
from lmdata.errors import CorruptDataError
from lmdata.formats._spec import (
    FormatSpec,
    TokenSink,
    TokenTarget,
    detector,
    lazy,
)

if TYPE_CHECKING:
    from lmdata.formats.flat_tokens.reader import FlatTokens
    from lmdata.formats.flat_tokens.writer import Writer
    from lmdata.storage import Store

__all__ = ["SPEC", "FlatTokens", "Writer", "detect", "info", "open", "validate"]

SPLITS = ("train", "validation")  # the reader's own tuple is this one
_TOKEN_ARRAYS = ("encoded_tokens", "tokens")

__getattr__ = lazy_exports(
    __name__,
    {
        "FlatTokens": "lmdata.formats.flat_tokens.reader",
        "Writer": "lmdata.formats.flat_tokens.writer",
    },
)


def _is_node(store: Store, key: str) -> bool:
    names = store.list(key)
    if "zarr.json" in names:  # v3: the metadata says group or array (bounded parse)
        from lmdata.formats.flat_tokens._zarr import node_kind

        return node_kind(store, key) is not None
    return ".zarray" in names or ".zgroup" in names


def _is_split(store: Store, key: str) -> bool:
    from lmdata.storage import join

    return any(_is_node(store, join(key, a)) for a in _TOKEN_ARRAYS) and _is_node(
        store, join(key, "seq_starts")
    )


def detect(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> bool:
    """A zarr group holding a split (token array + ``seq_starts``), or a split itself."""
    from lmdata.storage import join, resolve

    try:
        store, key = resolve(path, storage_options)
        if not store.is_dir(key):
            return False
        if _is_split(store, key):
            return True
        return _is_node(store, key) and any(_is_split(store, join(key, s)) for s in SPLITS)
    except (CorruptDataError, OSError):
        return False


def open(
    path: str | os.PathLike[str],
    split: str | None = None,
    *,
    cache_bytes: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> FlatTokens:
    """The token-sequence reader of one split (``train`` unless ``split`` says otherwise);
    ``cache_bytes``: decoded chunks kept in memory (default 256 MiB)."""
    from lmdata.formats.flat_tokens.reader import DEFAULT_CACHE_BYTES, FlatTokens

    return FlatTokens(
        path,
        split=split or "train",
        cache_bytes=DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes,
        storage_options=storage_options,
    )


def _token_sink(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    options: dict[str, Any] | None = None,
) -> TokenSink:
    # starts are the start bit of each sequence's first token: no EOD, nothing to record
    from lmdata.formats.flat_tokens.writer import Writer

    return Writer(path, overwrite=overwrite, **dict(options or {}))


validate = lazy("lmdata.formats.flat_tokens.validate:validate")
info = lazy("lmdata.formats.flat_tokens.reader:dataset_info")
splits = lazy("lmdata.formats.flat_tokens.reader:dataset_splits")

SPEC = FormatSpec(
    name="flat-tokens",
    kind="tokens",
    summary="token sequences in a zarr group with train/validation splits (MatX seqax)",
    detect=detector(detect, "flat-tokens"),
    open=open,
    writer=lazy("lmdata.formats.flat_tokens.writer:Writer"),
    validate=validate,
    info=info,
    aliases=("flat_tokens", "flat", "zarr", "seqax"),
    has_splits=True,
    splits=SPLITS,
    list_splits=splits,
    tokens=TokenTarget(open=_token_sink, options=frozenset({"chunk_tokens", "compression"})),
    provenance=lazy("lmdata.formats.flat_tokens.reader:reader_provenance"),
)
