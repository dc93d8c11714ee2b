"""``lmdata cat PATH``: records as JSON lines (or as text with ``--decode``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click
import numpy as np

from lmdata import _json
from lmdata._api import info as dataset_info
from lmdata._api import open as open_dataset
from lmdata.cli._common import (
    DatasetPath,
    format_option,
    split_option,
    storage_option,
    tokenizer_option,
    unsafe_pickle_option,
)
from lmdata.inspect.decode import decoded_record, is_token_array, split_read

TextOf = Callable[[np.ndarray], str]


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
    help='Token ids as text, one shape for every format: {"index": i, "split": ... (where '
    'the dataset has splits), "text": ...}, "text" being the token sequence (or a record\'s '
    "one token-array field) decoded, followed by a record's other fields. Uses the tokenizer "
    "the dataset records (lmdata tokenize stores it), or --tokenizer.",
)
@tokenizer_option(
    "Tokenizer for --decode: 'bytes' or a local file (tokenizer.json, *.tiktoken, *.model); "
    "default: the one that made the dataset, when it records one and the file is found."
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
    reader_options: dict[str, Any],
) -> None:
    """Print records as one JSON object per line.

    Token datasets print {"index": i, "tokens": [...]}; record datasets print each record
    (numpy arrays as lists, bytes as {"$base64": ...}). With --decode every format prints
    {"index": i, "split": ..., "text": ...} (split where the dataset has splits).
    """
    if (tokenizer or raw) and not decode:
        raise click.UsageError("--tokenizer and --raw go with --decode")
    text_of, summary = None, {}
    if decode:
        summary = dataset_info(path, format=fmt, storage_options=storage_options, scan=False)
        # a split that is a dataset of its own (MDS sub-directories) records its own tokenizer
        own = (summary.get("splits") or {}).get(split) if split else None
        text_of = _decoder(
            own if isinstance(own, dict) and "provenance" in own else summary, tokenizer
        )
    reader = open_dataset(
        path, format=fmt, split=split, storage_options=storage_options, **reader_options
    )
    split_name = split_read(summary, reader, split) if decode else None
    n = len(reader)
    stop = n if limit is None else min(n, offset + limit)
    out = sys.stdout.buffer
    block = 1024
    try:
        for lo in range(offset, stop, block):
            idx = np.arange(lo, min(lo + block, stop))
            for i, rec in zip(idx.tolist(), reader.take(idx), strict=True):
                out.write(_line(i, rec, text_of, raw, split_name))
        out.flush()
    except BrokenPipeError:  # `lmdata cat ... | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit


def _decoder(summary: dict[str, Any], tokenizer: str | None) -> TextOf:
    """Token ids -> text with the given tokenizer, or the one the dataset records."""
    from lmdata.inspect.decode import dataset_tokenizer, decode

    tok, _, warning = dataset_tokenizer(summary, tokenizer, required=True)
    if warning:
        click.echo(warning, err=True)
    return lambda ids: decode(ids, tok)  # type: ignore[return-value]


def _line(i: int, rec: Any, text_of: TextOf | None, raw: bool, split: str | None) -> bytes:
    if text_of is None:
        if isinstance(rec, np.ndarray):
            return _json.dumps({"index": i, "tokens": rec}) + b"\n"
        return _json.dumps(rec) + b"\n"
    if not raw:
        return _json.dumps(decoded_record(i, rec, text_of, split)) + b"\n"
    if isinstance(rec, np.ndarray):
        return text_of(rec).encode("utf-8", "surrogatepass") + b"\n"
    if not isinstance(rec, dict):
        return _json.dumps(rec) + b"\n"
    decoded = [text_of(v) for v in rec.values() if is_token_array(v)]
    # the decoded fields' texts; a record without token arrays: its text field
    texts = decoded or [v for k, v in rec.items() if k == "text"]
    if not texts:  # nothing to print raw: the record as JSON, never a silently dropped line
        return _json.dumps(rec) + b"\n"
    return b"".join(str(t).encode("utf-8", "surrogatepass") + b"\n" for t in texts)
