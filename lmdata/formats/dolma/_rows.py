"""One document or attribute row of a Dolma file: parsing a line and merging attributes.

Kept apart from the reader so that tag and mix workers load neither numpy nor the reader.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from lmdata.errors import CorruptDataError


def parse_line(raw: bytes, path: str | os.PathLike[str], lineno: int) -> dict[str, Any]:
    """One JSONL line as a dict; anything else is a CorruptDataError with file and line."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        hint = "an empty line" if not raw.strip() else f"invalid JSON ({e})"
        raise CorruptDataError(
            f"{hint}; every line must be one JSON object", path=path, position=f"line {lineno}"
        ) from None
    if not isinstance(obj, dict):
        raise CorruptDataError(
            f"a JSON {type(obj).__name__} where an object was expected",
            path=path,
            position=f"line {lineno}",
        )
    return obj


def merge_attribute_row(
    doc: dict[str, Any],
    row: dict[str, Any],
    doc_path: str | os.PathLike[str],
    attr_path: str | os.PathLike[str],
    lineno: int,
) -> None:
    """Merge one attribute row into ``doc`` after checking that it belongs to it (same id,
    of the same JSON type: 1 and "1" are different documents)."""
    if row.get("id") != doc.get("id") or type(row.get("id")) is not type(doc.get("id")):
        raise CorruptDataError(
            f"attribute row has id {row.get('id')!r} but line {lineno} of {doc_path} has id "
            f"{doc.get('id')!r}; attribute files must list the same documents in the same "
            "order: re-run the tagger on this file",
            path=attr_path,
            position=f"line {lineno}",
        )
    attrs = row.get("attributes")
    if not isinstance(attrs, dict):
        raise CorruptDataError(
            "attribute row has no 'attributes' object", path=attr_path, position=f"line {lineno}"
        )
    target = doc.get("attributes")
    if not isinstance(target, dict):
        target = doc["attributes"] = {}
    target.update(attrs)
