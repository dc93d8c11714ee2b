"""``lmdata cat PATH``: records as JSON lines (or as text with ``--decode``)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import numpy as np

from lmdata._api import open as open_dataset
from lmdata.cli._common import (
    DatasetPath,
    format_option,
    split_option,
    storage_option,
    to_json_line,
    unsafe_pickle_option,
)


@click.command("cat")
@click.argument("path", type=DatasetPath())
@format_option
@storage_option
@split_option
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=0),
    default=None,
    help="Print at most this many records.",
)
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Skip this many first.")
@click.option(
    "--decode",
    is_flag=True,
    help='Token ids as text: token datasets print {"index": i, "text": ...}; in records, '
    "every integer array field becomes its text. Needs --tokenizer.",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Tokenizer for --decode: 'bytes' or a local file (tokenizer.json, *.tiktoken, *.model).",
)
@click.option(
    "--raw",
    is_flag=True,
    help="With --decode: print each document's text followed by a newline instead of JSON "
    "(documents that contain newlines run together).",
)
@unsafe_pickle_option
def command(
    path: str,
    fmt: str | None,
    storage_options: dict[str, Any] | None,
    split: str | None,
    limit: int | None,
    offset: int,
    decode: bool,
    tokenizer: str | None,
    raw: bool,
    allow_unsafe_pickle: bool,
) -> None:
    """Print records as one JSON object per line.

    Token datasets print {"index": i, "tokens": [...]}; record datasets print each record
    (numpy arrays as lists, bytes as {"$base64": ...}).
    """
    if (tokenizer or raw) and not decode:
        raise click.UsageError("--tokenizer and --raw go with --decode")
    text_of = None
    if decode:
        if tokenizer is None:
            raise click.UsageError(
                "--decode needs --tokenizer: 'bytes' or the tokenizer file that made the dataset"
            )
        from lmdata.inspect.decode import decode as decode_ids
        from lmdata.inspect.decode import resolve_tokenizer

        tok = resolve_tokenizer(tokenizer)

        def text_of(ids: np.ndarray) -> str:
            return decode_ids(ids, tok)

    opts = {"allow_unsafe_pickle": True} if allow_unsafe_pickle else {}
    reader = open_dataset(path, format=fmt, split=split, storage_options=storage_options, **opts)
    n = len(reader)
    stop = n if limit is None else min(n, offset + limit)
    out = sys.stdout.buffer
    block = 1024
    try:
        for lo in range(offset, stop, block):
            idx = np.arange(lo, min(lo + block, stop))
            for i, rec in zip(idx.tolist(), reader.take(idx), strict=True):
                out.write(_line(i, rec, text_of, raw))
        out.flush()
    except BrokenPipeError:  # `lmdata cat ... | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit


def _line(i: int, rec: Any, text_of: Any, raw: bool) -> bytes:
    if text_of is None:
        return to_json_line({"index": i, "tokens": rec} if isinstance(rec, np.ndarray) else rec)
    if isinstance(rec, np.ndarray):
        text = text_of(rec)
        rec = {"index": i, "text": text}
    else:
        if isinstance(rec, dict):
            rec = {k: _decoded(v, text_of) for k, v in rec.items()}
        text = next((v for v in rec.values() if isinstance(v, str)), "") if raw else ""
    if raw:
        return text.encode("utf-8", "surrogatepass") + b"\n"
    return to_json_line(rec)


def _decoded(v: Any, text_of: Any) -> Any:
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu":
        return text_of(v)
    return v
