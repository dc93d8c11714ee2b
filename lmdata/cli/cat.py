"""``lmdata cat PATH``: records as JSON lines."""

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
@unsafe_pickle_option
def command(
    path: str,
    fmt: str | None,
    storage_options: dict[str, Any] | None,
    split: str | None,
    limit: int | None,
    offset: int,
    allow_unsafe_pickle: bool,
) -> None:
    """Print records as one JSON object per line.

    Token datasets print {"index": i, "tokens": [...]}; record datasets print each record
    (numpy arrays as lists, bytes as {"$base64": ...}).
    """
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
                if isinstance(rec, np.ndarray):
                    rec = {"index": i, "tokens": rec}
                out.write(to_json_line(rec))
        out.flush()
    except BrokenPipeError:  # `lmdata cat ... | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
