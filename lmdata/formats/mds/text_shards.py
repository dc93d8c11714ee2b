"""CSV/TSV/XSV and JSONL shards: a text data file plus a ``.meta`` file of offsets into it.

Meta file: ``[u32 n][u32 offsets × (n+1)][config JSON]``. XSV data starts with a header line
of the sorted column names; values are ``str(x)`` joined by the separator with no quoting, so
a value holding the separator or the newline cannot be stored (an error here, a corrupt file
in streaming when run with ``python -O``). JSONL lines are ``json.dumps(sample, sort_keys=True)``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from lmdata import _json
from lmdata.errors import InvalidInputError

XSV_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}


def _check_type(name: str, enc: str, value: Any) -> None:
    kind = XSV_TYPES.get(enc)
    if kind is None:
        raise InvalidInputError(f"column {name!r}: encoding {enc!r} is not str, int or float")
    if not isinstance(value, kind):
        raise InvalidInputError(
            f"column {name!r} is {enc}, got {type(value).__name__} {value!r:.40}"
        )


class XSVEncoder:
    """Encodes samples as delimiter-separated lines (streaming's XSV/CSV/TSV writers)."""

    extra_bytes_per_shard = 0
    extra_bytes_per_sample = 0

    def __init__(
        self,
        fmt: str,
        columns: Mapping[str, str],
        separator: str,
        newline: str,
        compression: str | None,
        hashes: list[str],
        size_limit: int | None,
    ) -> None:
        if not separator or not newline:
            raise InvalidInputError("separator and newline must be non-empty strings")
        self.names = sorted(columns)
        self.encodings = [columns[n] for n in self.names]
        for n, e in zip(self.names, self.encodings, strict=False):
            if e not in XSV_TYPES:
                raise InvalidInputError(
                    f"column {n!r}: {fmt} columns are str, int or float, not {e!r}"
                )
            if separator in n or newline in n:
                raise InvalidInputError(f"column name {n!r} holds the separator or newline")
        self.separator, self.newline = separator, newline
        cfg: dict[str, Any] = {
            "column_encodings": self.encodings,
            "column_names": self.names,
            "compression": compression,
            "format": fmt,
            "hashes": hashes,
            "newline": newline,
            "size_limit": size_limit,
            "version": 2,
        }
        if fmt == "xsv":  # csv and tsv entries leave the separator out
            cfg["separator"] = separator
        self.config = cfg

    def encode(self, sample: Mapping[str, Any]) -> bytes:
        values = []
        for name, enc in zip(self.names, self.encodings, strict=False):
            try:
                v = sample[name]
            except KeyError:
                raise InvalidInputError(f"sample has no column {name!r}") from None
            _check_type(name, enc, v)
            text = v if enc == "str" else str(v)
            if self.separator in text or self.newline in text:
                raise InvalidInputError(
                    f"column {name!r}: value {text!r:.60} holds the separator "
                    f"{self.separator!r} or the newline, which this format cannot store "
                    "(it has no quoting); use mds-jsonl or mds instead"
                )
            values.append(text)
        return (self.separator.join(values) + self.newline).encode("utf-8")

    def shard(self, samples: list[bytes]) -> tuple[bytes, bytes]:
        header = (self.separator.join(self.names) + self.newline).encode("utf-8")
        return header + b"".join(samples), meta_file(samples, len(header), self.config)


class JSONEncoder:
    """Encodes samples as JSON lines (streaming's JSONWriter)."""

    extra_bytes_per_shard = 0
    extra_bytes_per_sample = 0

    def __init__(
        self,
        columns: Mapping[str, str],
        newline: str,
        compression: str | None,
        hashes: list[str],
        size_limit: int | None,
    ) -> None:
        for n, e in columns.items():
            if e not in XSV_TYPES:
                raise InvalidInputError(
                    f"column {n!r}: mds-jsonl columns are str, int or float, not {e!r}"
                )
        if not newline:
            raise InvalidInputError("newline must be a non-empty string")
        self.columns = dict(columns)
        self.newline = newline
        self.config = {
            "columns": self.columns,
            "compression": compression,
            "format": "json",
            "hashes": hashes,
            "newline": newline,
            "size_limit": size_limit,
            "version": 2,
        }

    def encode(self, sample: Mapping[str, Any]) -> bytes:
        obj = {}
        for name, enc in self.columns.items():
            try:
                v = sample[name]
            except KeyError:
                raise InvalidInputError(f"sample has no column {name!r}") from None
            _check_type(name, enc, v)
            obj[name] = v
        return (json.dumps(obj, sort_keys=True) + self.newline).encode("utf-8")

    def shard(self, samples: list[bytes]) -> tuple[bytes, bytes]:
        return b"".join(samples), meta_file(samples, 0, self.config)


def meta_file(samples: list[bytes], start: int, config: Mapping[str, Any]) -> bytes:
    n = len(samples)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, samples), dtype=np.int64, count=n), out=offsets[1:])
    offsets += start
    if int(offsets[-1]) > 0xFFFFFFFF:
        raise InvalidInputError(
            "this shard would exceed 4 GiB, past what uint32 offsets "
            "address; set a size_limit (for example '1gb')"
        )
    text = json.dumps(config, sort_keys=True).encode("utf-8")
    return struct.pack("<I", n) + offsets.astype("<u4").tobytes() + text


class XSVDecoder:
    """Decodes one XSV line (with its newline) into a dict, as streaming's XSVReader."""

    def __init__(
        self, names: tuple[str, ...], encodings: tuple[str, ...], separator: str, newline: str
    ) -> None:
        for n, e in zip(names, encodings, strict=False):
            if not isinstance(e, str) or e not in XSV_TYPES:
                raise ValueError(f"column {n!r} has encoding {e!r}; XSV has str, int, float")
        self.cols = list(zip(names, [XSV_TYPES[e] for e in encodings], strict=False))
        self.separator, self.newline = separator, newline

    def __call__(self, data: bytes) -> dict[str, Any]:
        text = data.decode("utf-8")
        if not text.endswith(self.newline):
            raise ValueError("line does not end with the shard's newline")
        parts = text[: -len(self.newline)].split(self.separator)
        if len(parts) != len(self.cols):
            raise ValueError(
                f"line has {len(parts)} fields, the shard has {len(self.cols)} columns"
            )
        cols = zip(self.cols, parts, strict=True)
        return {n: (p if t is str else t(p)) for (n, t), p in cols}


def decode_json_line(data: bytes) -> dict[str, Any]:
    obj = _json.parse(data)
    if not isinstance(obj, dict):
        raise ValueError("line is not a JSON object")
    return obj
