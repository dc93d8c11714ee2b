"""What the Loader is given, turned into token-sequence readers: paths, readers, a mapping of
either to weights; records datasets made by ``lmdata tokenize`` (MDS, Atlas) opened by the
column their provenance names; the start token each source's recorded tokenizer implies."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError
from lmdata.protocols import TokenSpans, missing, satisfies

# special tokens that begin a text, looked up in a recorded tokenizer without a recorded BOS
BOS_NAMES = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>", "<|bos|>")
_WARNED: set[str] = set()


def split_weights(sources: Any, weights: Any) -> tuple[list[Any], list[Any] | None, bool]:
    """(sources, weights, many) from a source, a list of them, or a mapping source -> weight."""
    if isinstance(sources, Mapping):
        if weights is not None:
            raise InvalidInputError(
                "pass the weights once: Loader({path: weight, ...}) or weights=[...]"
            )
        return list(sources.keys()), list(sources.values()), True
    many = isinstance(sources, (list, tuple))
    return (list(sources) if many else [sources]), weights, many


def open_source(source: Any, token_column: str | None, split: str | None) -> Any:
    """A token-sequence reader from a reader or a path: a records dataset is opened by
    ``token_column``, else by the column its provenance names (what ``lmdata tokenize``
    wrote), else it is an error listing the columns that hold token ids."""
    from lmdata._api import open as open_dataset
    from lmdata._api import provenance, token_view

    reader = source
    if isinstance(source, (str, os.PathLike)):
        reader = open_dataset(source, split=split)
    if _is_tokens(reader):  # (token_column= is for the records sources of a mixture)
        return reader
    column = token_column
    if column is None:
        recorded = (provenance(reader) or {}).get("token_column")
        if recorded is None and provenance(reader) is not None:
            recorded = "tokens"  # (datasets tokenized before the column was recorded)
        if recorded is not None and recorded in _columns(reader):
            column = recorded
    if column is not None:
        reader = token_view(reader, column)
    if not _is_tokens(reader):
        cols = _columns(reader)
        if not cols:
            lacks = missing(reader, TokenSpans)[0]
            raise InvalidInputError(
                f"the Loader needs token sequences; {reader!r} has no {lacks!r}: tokenize "
                "the dataset first (`lmdata tokenize`)"
            )
        ids = [c for c, v in cols.items() if v]
        which = f" (here: {', '.join(ids)})" if ids else " (none of its columns holds them)"
        raise InvalidInputError(
            f"the Loader needs token sequences; {reader!r} is a records dataset with columns "
            f"{', '.join(cols)}: pass token_column= naming the column of token ids{which}, or "
            "tokenize its text (`lmdata tokenize`)"
        )
    return reader


def _is_tokens(reader: Any) -> bool:
    return satisfies(reader, TokenSpans)


def _columns(reader: Any) -> dict[str, bool]:
    """The columns of a records reader's first record, each with whether it holds a 1-D
    integer array (token ids); empty when there is no record or it is not a dict."""
    try:
        if not len(reader):
            return {}
        rec = reader[0]
    except Exception:  # not a records reader, or an unreadable first record: no listing
        return {}
    if not isinstance(rec, dict):
        return {}
    out = {}
    for k, v in rec.items():
        try:
            a = np.asarray(v)
            out[str(k)] = a.ndim == 1 and a.dtype.kind in "iu"
        except Exception:  # a value numpy cannot hold: not token ids
            out[str(k)] = False
    return out


def start_token(reader: Any, bos_id: int | None) -> int:
    """The id put before each document in the inputs: ``bos_id``, else the recorded
    tokenizer's BOS (its post-processor's, or a special token named like one), else 0, with
    a warning (once per dataset) where 0 is an ordinary token of the recorded vocabulary."""
    if bos_id is not None:
        return int(bos_id)
    from lmdata._api import provenance

    tok = (provenance(reader) or {}).get("tokenizer") or {}
    if not tok:
        return 0
    if isinstance(tok.get("bos_id"), int):
        return int(tok["bos_id"])
    special = tok.get("special_tokens") or {}
    for name in BOS_NAMES:
        if isinstance(special.get(name), int):
            return int(special[name])
    vocab = tok.get("vocab_size")
    # (lmdata's byte tokenizer keeps id 0 free: byte b is id b + 1, seqax's convention)
    ordinary = tok.get("kind") != "bytes" and 0 not in special.values()
    if isinstance(vocab, int) and vocab > 0 and ordinary:
        key = repr(reader)
        if key not in _WARNED:
            _WARNED.add(key)
            eod = tok.get("eod_id")
            hint = f" (for example its end-of-document id {eod})" if isinstance(eod, int) else ""
            warnings.warn(
                f"{reader!r} was tokenized by a {tok.get('kind')} tokenizer with no BOS token, "
                "in whose vocabulary id 0 is an ordinary token: every document's first input "
                f"is 0 (the flat-tokens convention). Pass bos_id={hint} to start documents "
                "with an id of your choice (bos_id=0 keeps 0 and says nothing)",
                stacklevel=4,  # this, Loader.__init__, its option check, the caller's line
            )
    return 0
