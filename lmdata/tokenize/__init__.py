"""Tokenizers behind one small interface, and the parallel documents -> tokens pipeline.

The names below load on first use (``from lmdata.tokenize import ByteTokenizer`` works), so
importing the package, which ``import lmdata`` does, costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmdata.tokenize.tokenizers import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "Tokenizer", "load_tokenizer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from lmdata.tokenize import tokenizers

        return getattr(tokenizers, name)
    raise AttributeError(f"module 'lmdata.tokenize' has no attribute {name!r}")
