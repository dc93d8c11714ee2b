"""Options and output helpers shared by the CLI verbs."""

from __future__ import annotations

import base64
from typing import Any

import click
import numpy as np
import orjson

format_option = click.option(
    "--format",
    "-f",
    "fmt",
    default=None,
    metavar="NAME",
    help="The dataset's format; detected from the path when omitted.",
)
split_option = click.option(
    "--split",
    default=None,
    metavar="NAME",
    help="Split to read where the format has splits (flat-tokens: train, validation).",
)
unsafe_pickle_option = click.option(
    "--allow-unsafe-pickle",
    is_flag=True,
    default=False,
    help="Trust pickles in the dataset (runs code they name). Off by default.",
)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"$base64": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, complex):
        return [obj.real, obj.imag]
    return str(obj)


_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def to_json_line(obj: Any) -> bytes:
    """One JSON line for any record lmdata reads (numpy as lists, bytes as base64)."""
    try:
        return orjson.dumps(obj, default=_default, option=_OPTS) + b"\n"
    except TypeError:  # integers beyond 64 bits: the standard library handles any size
        import json

        return json.dumps(obj, default=_default, ensure_ascii=False).encode() + b"\n"


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
