"""Tokenizers behind one small interface, and (later) the parallel documents -> tokens pipeline."""

from __future__ import annotations

from lmdata.tokenize.tokenizers import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "Tokenizer", "load_tokenizer"]
