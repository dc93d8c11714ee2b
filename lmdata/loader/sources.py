"""One token source as the loader sees it, picked by what its reader offers: an
:class:`~lmdata.loader.encoded.EncodedSource` for a reader that stores ``id*2 + start bit``
(:class:`lmdata.protocols.EncodedTokens`), else a :class:`~lmdata.loader.spans.Source`, which
reads any reader with what packing needs through ``span`` and ``boundaries``."""

from __future__ import annotations

from typing import Any

from lmdata.loader.encoded import EncodedSource
from lmdata.loader.spans import LONG_DOCS, MODES, Source
from lmdata.protocols import EncodedTokens, satisfies

__all__ = ["LONG_DOCS", "MODES", "EncodedSource", "Source", "make_source"]


def make_source(reader: Any, mode: str, seq_len: int, **options: Any) -> Source:
    """The source of ``reader`` in ``mode`` (options as :class:`~lmdata.loader.spans.Source`
    takes them): its fast path when the reader offers :class:`EncodedTokens` (checked by
    the protocol's names, evaluating no property)."""
    kind = EncodedSource if satisfies(reader, EncodedTokens) else Source
    return kind(reader, mode, seq_len, **options)
