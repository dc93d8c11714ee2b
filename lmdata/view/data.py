"""What the viewer serves, as JSON-able values: the dataset's summary and pages of records.

Everything here reads through ``lmdata.open`` / ``lmdata.info`` and the reader protocols;
documents are returned as data (strings, numbers), never as markup, and the page renders them
as text.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import numpy as np

from lmdata._api import info as dataset_info
from lmdata._api import open as open_dataset
from lmdata._redact import redact
from lmdata.errors import InvalidInputError
from lmdata.inspect.decode import dataset_tokenizer, is_token_array, pieces
from lmdata.inspect.stats import summarize, with_attributes
from lmdata.protocols import is_token_reader

MAX_PAGE = 100  # records per request
MAX_TOKENS = 4096  # tokens of one record shown (with boundaries)
MAX_CHARS = 200_000  # characters of one string shown
MAX_ID_SCAN = 1_000_000  # records scanned when looking for an id
STATS_SAMPLE = 2_000  # records sampled for the length histogram of a records dataset
MAX_DEPTH = 64  # levels of a record's nesting shown (JSON encoders and pages stop near 255+)


def _elided(v: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> str:
    """What stands for a value nested deeper than :data:`MAX_DEPTH`."""
    what = f"an object of {len(v):,} keys" if isinstance(v, dict) else f"a list of {len(v):,}"
    return f"... {what}, nested deeper than {MAX_DEPTH} levels (not shown)"


def _jsonable(v: Any, depth: int = 0) -> Any:
    """Any record value as JSON data: arrays as lists, bytes as base64, long strings cut, and
    objects and lists deeper than :data:`MAX_DEPTH` replaced by a note (a record nested
    hundreds deep is valid JSON; the reply and the page stay shallow)."""
    if isinstance(v, (dict, list, tuple)) and depth >= MAX_DEPTH:
        return _elided(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in v[:MAX_TOKENS]] + (
            [f"... {len(v) - MAX_TOKENS:,} more"] if len(v) > MAX_TOKENS else []
        )
    if isinstance(v, np.ndarray):
        flat = v.reshape(-1)
        out = flat[:MAX_TOKENS].tolist()
        return out + ([f"... {flat.size - MAX_TOKENS:,} more"] if flat.size > MAX_TOKENS else [])
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)[:MAX_CHARS]
        return {"$base64": base64.b64encode(b).decode(), "bytes": len(bytes(v))}
    if isinstance(v, str):
        return v if len(v) <= MAX_CHARS else v[:MAX_CHARS] + f" ... ({len(v) - MAX_CHARS:,} more)"
    if v is None or isinstance(v, (bool, int, float)):
        if isinstance(v, float) and not np.isfinite(v):
            return str(v)
        return v
    return repr(v)[:MAX_CHARS]


class ViewData:
    """One opened dataset and its (optional) tokenizer, answering the viewer's questions.

    ``tokenizer`` (a spec or an object) shows token ids as text; by default the one the
    dataset records, when its file is found. Opening reads the dataset's info once and a
    sample for the length histogram."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        format: str | None = None,
        split: str | None = None,
        tokenizer: Any = None,
        text_key: str = "text",
        storage_options: dict[str, Any] | None = None,
        reader_options: dict[str, Any] | None = None,
    ) -> None:
        self.path = str(path)
        self.split = split
        self.text_key = text_key
        self.summary = dataset_info(path, format=format, storage_options=storage_options)
        tok = dataset_tokenizer(self.summary, tokenizer)  # a bad tokenizer fails before reading
        self.tokenizer, self.tokenizer_name, self.tokenizer_note = tok
        opts = with_attributes(self.summary, reader_options)
        self.reader = open_dataset(
            path, format=format, split=split, storage_options=storage_options, **opts
        )
        self.kind = "tokens" if is_token_reader(self.reader) else "records"
        self.stats = summarize(
            self.reader,
            self.summary,
            path=path,
            split=split,
            text_key=text_key,
            sample_records=STATS_SAMPLE,
            sample_tokens=1 << 20,
            top=0,
        )

    def info(self) -> dict[str, Any]:
        return {
            "path": redact(self.path),  # shown on the page: no credentials of a URL
            "format": self.summary.get("format"),
            "kind": self.kind,
            "split": self.split,
            "records": len(self.reader),
            "tokenizer": self.tokenizer_name,
            "tokenizer_note": self.tokenizer_note,
            "text_key": self.text_key,
            "info": _jsonable(self.summary),
            "lengths": self.stats.get("lengths"),
            "sample": self.stats.get("sample"),
        }

    def _tokens(self, ids: np.ndarray) -> dict[str, Any]:
        shown = np.asarray(ids).reshape(-1)[:MAX_TOKENS]
        out: dict[str, Any] = {"length": int(np.asarray(ids).size), "shown": int(shown.size)}
        if self.tokenizer is None:
            out["ids"] = shown.tolist()
            return out
        try:
            out["pieces"] = [[list(i), t] for i, t in pieces(shown, self.tokenizer)]
        except InvalidInputError as e:
            out["ids"] = shown.tolist()
            out["error"] = str(e)
        return out

    def record(self, index: int, rec: Any) -> dict[str, Any]:
        if isinstance(rec, np.ndarray):
            return {"index": index, "kind": "tokens", "tokens": self._tokens(rec)}
        out: dict[str, Any] = {"index": index, "kind": "record"}
        if isinstance(rec, dict):
            text = rec.get(self.text_key)
            if isinstance(text, str):
                out["text"] = _jsonable(text)
                out["chars"] = len(text)
            arrays = {str(k): v for k, v in rec.items() if is_token_array(v)}
            if arrays:
                out["token_fields"] = {k: self._tokens(v) for k, v in arrays.items()}
            out["fields"] = {
                str(k): _jsonable(v)
                for k, v in rec.items()
                if not (k == self.text_key and "text" in out) and str(k) not in arrays
            }
        else:
            out["fields"] = {"value": _jsonable(rec)}
        return out

    def page(self, start: int, count: int) -> dict[str, Any]:
        n = len(self.reader)
        start = max(0, min(start, max(n - 1, 0)))
        count = max(1, min(count, MAX_PAGE))
        idx = np.arange(start, min(start + count, n))
        recs = self.reader.take(idx) if idx.size else []
        return {
            "start": start,
            "records": n,
            "items": [self.record(i, r) for i, r in zip(idx.tolist(), recs, strict=True)],
        }

    def find_id(self, wanted: str) -> dict[str, Any]:
        """The index of the first record whose ``id`` field equals ``wanted`` (as text)."""
        if self.kind == "tokens":
            return {"found": False, "message": "token sequences have no ids; jump to an index"}
        for i, rec in enumerate(self.reader):
            if i >= MAX_ID_SCAN:
                return {"found": False, "message": f"not in the first {MAX_ID_SCAN:,} records"}
            if isinstance(rec, dict) and str(rec.get("id")) == wanted:
                return {"found": True, "index": i}
        return {"found": False, "message": "no record has this id"}
