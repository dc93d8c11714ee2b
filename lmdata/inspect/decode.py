"""Token ids back to text: whole sequences, batches, and per-token pieces for display.

A tokenizer is what ``lmdata tokenize --tokenizer`` takes (``"bytes"`` or a local file) or an
already-built object with a ``decode(ids)`` method (a Hugging Face ``tokenizers.Tokenizer``,
a tiktoken ``Encoding``, an lmdata tokenizer).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmdata._options import checked
from lmdata.errors import InvalidInputError
from lmdata.tokenize.tokenizers import load_tokenizer

# a token that ends inside a UTF-8 character decodes to U+FFFD until the rest arrives; a piece
# takes at most this many tokens before it is shown as it is
_MAX_MERGE = 8
# how many earlier tokens give context when a piece is decoded (sentencepiece drops a leading
# space at the start of a decode, so the diff against a decoded prefix is what a token adds)
_CONTEXT = 4


def resolve_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object from a spec (``None``/``"bytes"``, a file) or an object with decode."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer)
    if not callable(getattr(tokenizer, "decode", None)):
        raise InvalidInputError(
            f"cannot decode with a {type(tokenizer).__name__}: pass 'bytes', a tokenizer file, "
            "or an object with a decode(ids) method"
        )
    return tokenizer


def _candidates(prov: Mapping[str, Any], dataset: str | None) -> list[Path]:
    """Where the recorded tokenizer file may be: where it was, then beside the dataset."""
    from lmdata.storage import is_url

    t = prov.get("tokenizer") or {}
    out = [Path(t["path"])] if t.get("path") else []
    name = t.get("name")
    if name and dataset and not is_url(dataset):
        d = Path(dataset)
        out += [d / name, d.parent / name]
    return out


def _describe(t: Mapping[str, Any]) -> str:
    if t.get("kind") == "bytes":
        return "the built-in byte tokenizer ('bytes')"
    digest = f", sha256 {t['sha256'][:12]}..." if t.get("sha256") else ""
    return f"the {t.get('kind')} tokenizer {t.get('name')!r} (at {t.get('path')}{digest})"


def recorded_tokenizer(summary: Mapping[str, Any]) -> str | None:
    """The tokenizer that made a dataset (``lmdata.info(path)``), from its provenance:
    ``"bytes"``, or the recorded file (where it was, or beside the dataset) if its content
    hash still matches. None when the dataset records no tokenizer; InvalidInputError when
    it records a file that is not found unchanged."""
    from lmdata._provenance import file_sha256

    prov = summary.get("provenance")
    if not isinstance(prov, Mapping) or not isinstance(prov.get("tokenizer"), Mapping):
        return None
    t = prov["tokenizer"]
    if t.get("kind") == "bytes":
        return "bytes"
    seen = []
    for c in _candidates(prov, summary.get("path")):
        if c.is_file() and str(c) not in seen:
            seen.append(str(c))
            if t.get("sha256") and file_sha256(c) == t["sha256"]:
                return str(c)
    found = f"; {', '.join(seen)} differ" if seen else ""
    raise InvalidInputError(
        f"the dataset was made with {_describe(t)}, which is not found unchanged{found}; "
        "pass the tokenizer file with --tokenizer"
    )


def tokenizer_mismatch(summary: Mapping[str, Any], spec: Any) -> str | None:
    """A warning when ``spec`` (a tokenizer given by hand) is not the one the dataset records."""
    from lmdata._provenance import file_sha256

    prov = summary.get("provenance")
    if not isinstance(prov, Mapping) or not isinstance(prov.get("tokenizer"), Mapping):
        return None
    t = prov["tokenizer"]
    if spec == "bytes" or spec is None:
        same = t.get("kind") == "bytes"
    elif isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec) and t.get("sha256"):
        same = file_sha256(spec) == t["sha256"]
    else:
        return None  # a tokenizer object or folder: nothing to compare
    if same:
        return None
    given = os.fspath(spec) if spec else "bytes"
    return f"warning: the dataset was made with {_describe(t)}, not {given}"


ShownTokenizer = tuple[Any, str | None, str | None]  # (tokenizer or None, its name, a note)


def dataset_tokenizer(
    summary: Mapping[str, Any], tokenizer: Any, *, required: bool = False
) -> ShownTokenizer:
    """The tokenizer to show a dataset's ids as text with (its ``lmdata.info`` is
    ``summary``): ``tokenizer`` if given (a spec or an object; the note warns when the dataset
    records another), else the one the dataset records when its file is found unchanged.
    Without one: ``(None, None, why)``, or with ``required`` an InvalidInputError. Resolved
    before any data is read, so a bad tokenizer fails at once."""
    note = None
    if tokenizer is None:
        try:
            tokenizer = recorded_tokenizer(summary)
        except InvalidInputError as e:
            if required:
                raise
            return None, None, str(e)
        if tokenizer is None:
            if required:
                raise InvalidInputError(
                    "the dataset does not record the tokenizer that made it; pass 'bytes' or "
                    "the tokenizer file with --tokenizer"
                )
            return None, None, None
    else:
        note = tokenizer_mismatch(summary, tokenizer)
    name = (
        os.fspath(tokenizer)
        if isinstance(tokenizer, (str, os.PathLike))
        else getattr(tokenizer, "spec", type(tokenizer).__name__)
    )
    return resolve_tokenizer(tokenizer), name, note


def is_token_array(v: Any) -> bool:
    """Whether a record's value is a sequence of token ids: a 1-D integer numpy array."""
    return isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu"


def split_read(summary: Mapping[str, Any], reader: Any, split: str | None) -> str | None:
    """The name of the split ``reader`` reads (``split`` if one was asked for), for output
    lines; None where the dataset has no splits to tell apart (``summary`` is its info)."""
    if split:
        return split
    names = list(summary.get("splits") or ())
    own = getattr(reader, "split", None)
    if isinstance(own, str) and own in names:
        return own
    return names[0] if len(names) == 1 else None


def decoded_record(
    index: int, rec: Any, text_of: Callable[[np.ndarray], str], split: str | None = None
) -> dict[str, Any]:
    """One shape for record ``index`` with its token ids as text, whatever the format:
    ``{"index", "split" (where there is one), "text"}``. ``text`` is the decoded ids of a
    token sequence, or of a record's one token-array field (MDS and Atlas outputs of tokenize
    hold ``{"tokens": ids}``); a record's other fields follow (token arrays as text), or under
    ``"record"`` when one is named like ours."""
    out: dict[str, Any] = {"index": index}
    if split is not None:
        out["split"] = split
    if isinstance(rec, np.ndarray):
        out["text"] = text_of(rec)
        return out
    if not isinstance(rec, dict):
        out["text" if isinstance(rec, str) else "record"] = rec
        return out
    arrays = [k for k, v in rec.items() if is_token_array(v)]
    fields = {k: text_of(v) if k in arrays else v for k, v in rec.items()}
    if len(arrays) == 1 and "text" not in rec:
        out["text"] = fields.pop(arrays[0])
    if any(k in out for k in fields):
        out["record"] = fields
    else:
        out.update(fields)
    return out


def _vocab_size(tok: Any) -> int | None:
    for attr in ("vocab_size", "n_vocab"):
        v = getattr(tok, attr, None)
        if isinstance(v, int):
            return v
    get = getattr(tok, "get_vocab_size", None)
    if callable(get):
        try:
            return int(get(with_added_tokens=True))
        except TypeError:
            return int(get())
    return None


def decode_raw(tok: Any, ids: list[int], skip_special_tokens: bool) -> str:
    """``tok.decode(ids)`` without range checks, for decoders with or without the keyword."""
    try:
        return tok.decode(ids, skip_special_tokens=skip_special_tokens)
    except TypeError:  # tiktoken's Encoding and other decoders without the keyword
        return tok.decode(ids)


def _check_range(a: np.ndarray, tok: Any) -> None:
    if a.size == 0:
        return
    if a.dtype.kind not in "iu":
        raise InvalidInputError(f"token ids must be integers, not {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    n = _vocab_size(tok)
    if lo < 0 or (n is not None and hi >= n):
        bad = lo if lo < 0 else hi
        raise InvalidInputError(
            f"token id {bad} is outside the tokenizer's vocabulary (0..{(n or 0) - 1}); "
            "is this the tokenizer that made the dataset? pass the right one with --tokenizer"
        )


@checked("lmdata.decode")
def decode(
    ids: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
    tokenizer: Any = "bytes",
    *,
    skip_special_tokens: bool = False,
) -> str | list[str]:
    """The text of ``ids``: a string for one sequence, a list of strings for a 2-D batch (for
    example a Loader batch's ``targets``).

    Special tokens (an EOD such as ``<|endoftext|>``) are shown unless ``skip_special_tokens``.
    An id outside the tokenizer's vocabulary is an InvalidInputError.
    """
    tok = resolve_tokenizer(tokenizer)
    if isinstance(ids, np.ndarray):
        rows = ids
    elif len(ids) and isinstance(ids[0], (Sequence, np.ndarray)):
        rows = [np.asarray(r) for r in ids]
        return [_decode_checked(tok, r, skip_special_tokens) for r in rows]
    else:
        rows = np.asarray(ids, dtype=np.int64)
    if rows.ndim == 2:
        return [_decode_checked(tok, r, skip_special_tokens) for r in rows]
    if rows.ndim > 2:
        raise InvalidInputError(f"decode takes 1-D or 2-D ids, got {rows.ndim} dimensions")
    return _decode_checked(tok, rows.reshape(-1), skip_special_tokens)


def _decode_checked(tok: Any, a: np.ndarray, skip_special_tokens: bool) -> str:
    a = np.asarray(a)
    if a.size == 0:
        return ""
    _check_range(a, tok)
    return decode_raw(tok, a.astype(np.int64).tolist(), skip_special_tokens)


def pieces(
    ids: Sequence[int] | np.ndarray, tokenizer: Any = "bytes"
) -> list[tuple[list[int], str]]:
    """The text each token adds, as ``(ids, text)`` pairs whose texts concatenate to the
    decoded sequence (for tokenizers whose decoding is local, which real ones are).

    A token ending inside a UTF-8 character is grouped with the next ones until the character
    is complete, so a pair can hold several ids. Used to show token boundaries.
    """
    tok = resolve_tokenizer(tokenizer)
    a = np.asarray(ids).reshape(-1)
    _check_range(a, tok)
    seq = a.astype(np.int64).tolist()
    out: list[tuple[list[int], str]] = []
    read = 0  # tokens before `read` are emitted
    prefix = 0  # decoding context starts here
    prev = ""
    for k in range(len(seq)):
        cur = decode_raw(tok, seq[prefix : k + 1], False)
        if cur.endswith("\ufffd") and k + 1 - read < _MAX_MERGE and k + 1 < len(seq):
            continue
        piece = cur[len(prev) :] if cur.startswith(prev) else cur
        out.append((seq[read : k + 1], piece))
        read = k + 1
        prefix = max(prefix, read - _CONTEXT)
        prev = decode_raw(tok, seq[prefix:read], False) if prefix < read else ""
    return out
